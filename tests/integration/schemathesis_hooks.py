"""Schemathesis hooks for tests/integration/test_api_schemathesis.py (loaded through
SCHEMATHESIS_HOOKS by the `schemathesis run` it starts)."""

from __future__ import annotations

import math
from typing import Any

import schemathesis

# A held long-poll waits up to its timeout_s (300 s at most); a generated one waits a moment.
MAX_WAIT_S = 0.2


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if case.operation.path != "/decisions/wait" or not isinstance(case.query, dict):
        return
    if "timeout_s" not in case.query:
        case.query["timeout_s"] = MAX_WAIT_S  # instead of the default 30 s
        return
    timeout_s = _number(case.query["timeout_s"])
    if timeout_s is not None and timeout_s > MAX_WAIT_S:
        case.query["timeout_s"] = MAX_WAIT_S
