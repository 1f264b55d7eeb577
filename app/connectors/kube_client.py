"""What the Kubernetes connector adds to the official client's configuration: a bearer token read
from a file that rotates, and retries that stop at a timeout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as k8s_client


class NoRetryAfterTimeout(urllib3.Retry):
    """The client's retries (a refused or reset connection is tried again), except after a
    timeout: urllib3 would retry a read that timed out, so a call could take several
    `request_timeout_s`; the timeout bounds the whole call instead, and the next tick asks again."""

    def increment(  # type: ignore[override]
        self,
        method: str | None = None,
        url: str | None = None,
        response: Any = None,
        error: Exception | None = None,
        _pool: Any = None,
        _stacktrace: Any = None,
    ) -> urllib3.Retry:
        if _is_timeout(error):
            raise urllib3.exceptions.MaxRetryError(_pool, url, error) from error
        return super().increment(method, url, response, error, _pool, _stacktrace)


def use_token_file(conf: k8s_client.Configuration, path: Path) -> None:
    """Send `Authorization: Bearer <token>` read from `path`, again whenever the file changes
    (projected service-account tokens rotate). The hook runs inside the API call's thread."""
    state: dict[str, Any] = {"mtime": None}

    def refresh(c: k8s_client.Configuration) -> None:
        mtime = path.stat().st_mtime_ns
        if mtime != state["mtime"]:
            c.api_key["BearerToken"] = "Bearer " + path.read_text().strip()
            state["mtime"] = mtime

    refresh(conf)
    conf.refresh_api_key_hook = refresh


def timed_out(exc: urllib3.exceptions.HTTPError) -> bool:
    """The call gave up waiting (rather than finding nobody at the address)."""
    cause = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
    return _is_timeout(cause)


def _is_timeout(error: Exception | None) -> bool:
    # urllib3 makes a refused connection (NewConnectionError) a kind of connect timeout; it is not
    # one: nothing was waited for.
    return isinstance(error, urllib3.exceptions.TimeoutError) and not isinstance(
        error, urllib3.exceptions.NewConnectionError
    )
