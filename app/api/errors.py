"""Every error leaves as an RFC 9457 problem document; bad input is a 4xx naming the field."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.core.errors import ConflictError, InvalidInputError, NotFoundError

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"


def problem(
    status: int,
    detail: str,
    *,
    request: Request,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    title = HTTPStatus(status).phrase
    body: dict[str, Any] = {
        "type": f"urn:planner:problem:{title.lower().replace(' ', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        "instance": request.url.path,
    }
    if errors:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        msg = err.get("msg", "invalid")
        if err.get("type") == "json_invalid":
            msg = f"body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')})"
            loc = ("body",)
        else:
            loc = tuple(err.get("loc", ()))
        out.append({"field": _field(loc), "message": msg})
    return out


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _validation_errors(exc)
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return problem(422, detail, request=request, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        return problem(exc.status_code, detail, request=request, headers=getattr(exc, "headers", None))

    @app.exception_handler(NotFoundError)
    async def _not_found(request: Request, exc: NotFoundError) -> JSONResponse:
        errors = [{"field": exc.field, "message": exc.detail}] if exc.field else None
        return problem(404, exc.detail, request=request, errors=errors)

    @app.exception_handler(ConflictError)
    async def _conflict(request: Request, exc: ConflictError) -> JSONResponse:
        return problem(409, exc.detail, request=request)

    @app.exception_handler(InvalidInputError)
    async def _invalid(request: Request, exc: InvalidInputError) -> JSONResponse:
        return problem(
            422,
            f"{exc.field}: {exc.detail}",
            request=request,
            errors=[{"field": exc.field, "message": exc.detail}],
        )

    @app.exception_handler(OperationalError)
    async def _database_down(request: Request, exc: OperationalError) -> JSONResponse:
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path, exc.orig)
        return problem(
            503, "the database is unavailable; retry later", request=request, headers={"Retry-After": "5"}
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(500, "internal error; the planner's log has the details", request=request)
