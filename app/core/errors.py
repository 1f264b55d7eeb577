"""Domain errors. Adapters translate infrastructure failures into these; the API maps them to
problem documents (404, 409, 422)."""

from __future__ import annotations


class PlannerError(Exception):
    """Base of every error the planner raises on purpose."""


class NotFoundError(PlannerError):
    """A deployment, decision or override that does not exist (HTTP 404)."""

    def __init__(self, detail: str, *, field: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field


class ConflictError(PlannerError):
    """The request is well formed but contradicts the current state (HTTP 409)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class InvalidInputError(PlannerError):
    """Input that parses but makes no sense for this deployment (HTTP 422), naming the field."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail
