"""`planner openapi`: write or check the committed OpenAPI document."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.cli.common import fail
from app.config import REPO_ROOT, Settings

OPENAPI_PATH = REPO_ROOT / "openapi" / "openapi.json"


def openapi_document(settings: Settings) -> str:
    from app.config import DeploymentsFile
    from app.main import create_app

    # The schema does not depend on which deployments are configured.
    placeholder = DeploymentsFile.model_validate(
        {"deployments": [{"name": "x", "connector": {"type": "none"}, "sla": {"ttft_ms": 1, "itl_ms": 1}}]}
    )
    app = create_app(settings, deployments=placeholder, run_workers=False)
    return json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"


def cmd_openapi(settings: Settings, args: argparse.Namespace) -> int:
    path = Path(args.output)
    document = openapi_document(settings)
    if args.check:
        current = path.read_text() if path.exists() else ""
        if current != document:
            return fail(f"{path} is out of date with the app; run `planner openapi` and commit it", 1)
        print(f"{path} matches the app")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document)
    print(f"wrote {path}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    openapi = sub.add_parser("openapi", help="write or check the committed openapi/openapi.json")
    openapi.add_argument("--check", action="store_true", help="fail if the committed file differs")
    openapi.add_argument("--output", default=str(OPENAPI_PATH))
    openapi.set_defaults(func=cmd_openapi)
