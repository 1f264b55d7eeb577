"""Every error leaves as an RFC 9457 problem document; bad input is a 4xx naming the field."""

from __future__ import annotations

import functools
import logging
import re
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.core.errors import (
    ConflictError,
    ConflictingFieldError,
    InvalidInputError,
    NotFoundError,
    PreconditionFailedError,
    PreconditionRequiredError,
    RetryLaterError,
    ShuttingDownError,
)

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"


def problem_document(
    status: int, detail: str, *, instance: str, errors: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    title = HTTPStatus(status).phrase
    body: dict[str, Any] = {
        "type": f"urn:planner:problem:{title.lower().replace(' ', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        "instance": instance,
    }
    if errors:
        body["errors"] = errors
    return body


def problem(
    status: int,
    detail: str,
    *,
    request: Request,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = problem_document(status, detail, instance=request.url.path, errors=errors)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


_PROBLEM_CONTENT = {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
_DESCRIPTIONS = {
    400: "The body is not text (not UTF-8); invalid JSON is a 422",
    401: "Missing or unknown bearer token",
    403: "The token's role is too low, or no tokens are configured and the caller is not local",
    404: "An unknown deployment, decision or override",
    409: "The request contradicts the current state",
    412: "If-Match names a revision that is no longer the current one; read again and retry",
    413: "The body is larger than PLANNER_MAX_BODY_BYTES",
    422: "Bad input; `errors[].field` names the field",
    428: "The request must name the revision it changes (If-Match)",
    429: "Too many held long-polls, for this caller or in total; retry after Retry-After seconds",
    503: "The database is unavailable; retry after Retry-After seconds",
}
_RETRY_AFTER = {
    "Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "integer"}}
}


def problem_responses(*statuses: int, **descriptions: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for error statuses, each an `application/problem+json` Problem (what
    the handlers below send; FastAPI's `model=` would file them under application/json).
    `descriptions` override the default wording per status: `_409="..."`."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        response: dict[str, Any] = {
            "description": descriptions.get(f"_{status}", _DESCRIPTIONS[status]),
            "content": _PROBLEM_CONTENT,
        }
        if status in (429, 503):
            response["headers"] = _RETRY_AFTER
        out[status] = response
    return out


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        msg = err.get("msg", "invalid")
        if err.get("type") == "finite_number":
            # pydantic says "Input should be a finite number"; NaN and infinity are refused as such,
            # not as out of range.
            msg = "must be finite (NaN and infinity are not numbers here)"
        if err.get("type") == "json_invalid":
            msg = f"body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')})"
            loc = ("body",)
        else:
            loc = tuple(err.get("loc", ()))
        out.append({"field": _field(loc), "message": msg})
    return out


@functools.lru_cache(maxsize=256)
def _path_pattern(template: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)))


def _allowed_methods(request: Request) -> list[str] | None:
    """The methods the OpenAPI document lists for the request's path (None if it lists none)."""
    paths: dict[str, dict[str, Any]] = request.app.openapi().get("paths", {})
    path = request.url.path
    if path in paths:  # /decisions/wait before /decisions/{id}, as the router matches them
        return sorted(method.upper() for method in paths[path])
    for template, operations in paths.items():
        if _path_pattern(template).fullmatch(path):
            return sorted(method.upper() for method in operations)
    return None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _validation_errors(exc)
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return problem(422, detail, request=request, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        errors = None
        if exc.status_code == 400 and exc.__cause__ is not None:
            # FastAPI's "There was an error parsing the body" (e.g. bytes that are not UTF-8):
            # name the field and the reason, as every other bad input does.
            cause = exc.__cause__
            detail = f"body: cannot be parsed ({type(cause).__name__}: {str(cause)[:200]})"
            errors = [{"field": "body", "message": detail.removeprefix("body: ")}]
        headers = getattr(exc, "headers", None)
        allowed = _allowed_methods(request) if exc.status_code == 405 else None
        if allowed:
            # Starlette names only the methods of the first route of the path (POST /override),
            # not all of them (GET and POST).
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}
        return problem(exc.status_code, detail, request=request, errors=errors, headers=headers)

    @app.exception_handler(NotFoundError)
    async def _not_found(request: Request, exc: NotFoundError) -> JSONResponse:
        errors = [{"field": exc.field, "message": exc.detail}] if exc.field else None
        return problem(404, exc.detail, request=request, errors=errors)

    @app.exception_handler(ConflictError)
    async def _conflict(request: Request, exc: ConflictError) -> JSONResponse:
        errors = None
        if isinstance(exc, ConflictingFieldError):
            errors = [{"field": exc.field, "message": exc.detail.removeprefix(f"{exc.field}: ")}]
        return problem(409, exc.detail, request=request, errors=errors)

    @app.exception_handler(PreconditionFailedError)
    async def _stale(request: Request, exc: PreconditionFailedError) -> JSONResponse:
        status = 428 if isinstance(exc, PreconditionRequiredError) else 412
        return problem(status, exc.detail, request=request)

    @app.exception_handler(RetryLaterError)
    async def _retry_later(request: Request, exc: RetryLaterError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after_s)}
        if isinstance(exc, ShuttingDownError):
            headers["Connection"] = "close"  # the next poll must reach a process that is not stopping
            return problem(503, exc.detail, request=request, headers=headers)
        return problem(429, exc.detail, request=request, headers=headers)

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
