"""The OpenAPI document: what the server sends, error documents included.

Routes declare their error statuses with `problem_responses` (app/api/errors.py), which refer to
the Problem schema under `application/problem+json`. FastAPI only lists schemas that some route
names as a `model`, so the Problem schema (and the schemas it uses) is added here.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from app.api.schemas import Problem

_REF = "#/components/schemas/{model}"


def add_problem_schema(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()
            schema = Problem.model_json_schema(ref_template=_REF, mode="serialization")
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(schema.pop("$defs", {}))
            schemas["Problem"] = schema
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
