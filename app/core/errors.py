"""Domain errors. Adapters translate infrastructure failures into these; the API maps them to
problem documents (404, 409, 422; 429 and 503 with a Retry-After)."""

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


class PreconditionFailedError(PlannerError):
    """The request names a revision (`If-Match`) that is no longer the current one (HTTP 412)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class PreconditionRequiredError(PreconditionFailedError):
    """A change that must name the revision it is based on did not (HTTP 428)."""


class ConflictingFieldError(ConflictError):
    """A conflict caused by one field of the request (HTTP 409 naming it)."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field


class RetryLaterError(PlannerError):
    """The request is fine but cannot be served now; the caller should retry after `retry_after_s`."""

    def __init__(self, detail: str, *, retry_after_s: int) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after_s = retry_after_s


class TooBusyError(RetryLaterError):
    """A bound on concurrent work of one kind is reached, for this caller or in total (HTTP 429)."""


class ShuttingDownError(RetryLaterError):
    """This process is stopping; another planner process, or this one restarted, answers (HTTP 503)."""


class InvalidInputError(PlannerError):
    """Input that parses but makes no sense for this deployment (HTTP 422), naming the field."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


class SourceUnavailableError(PlannerError):
    """A metric source did not answer, or answered something unusable; `reason` says which."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason


class WindowTooShortError(SourceUnavailableError):
    """The source answered, but over too short a window to read a rate from (the first tick right
    after the start-up check): the traffic is not known yet, and the source is not failing."""


class ConnectorError(PlannerError):
    """The cluster could not be read or changed (deployment missing, no permission, conflict)."""


class ConnectorNotReadyError(ConnectorError):
    """The cluster cannot take a change right now (e.g. the DGD is not Ready); try again later."""


class ProfileError(PlannerError):
    """A profiling data file is missing, malformed or out of range; names the file and key."""

    def __init__(self, path: str, key: str | None, reason: str) -> None:
        where = f"{path}: {key}" if key else path
        super().__init__(f"{where}: {reason}")
        self.path = path
        self.key = key
        self.reason = reason
