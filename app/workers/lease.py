"""How a leased loop stops, for the deployment workers (loop.py) and the fleet step (fleet.py):
its task cancelled and awaited, then its lease released so that a standby takes over at once
rather than at the lease's expiry."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)


async def stop_leased(
    task: asyncio.Task[None] | None,
    sf: sessionmaker[Session],
    release: Callable[[Session], None],
    *,
    what: str,
    extra: dict[str, Any] | None = None,
) -> bool:
    """Cancel and await `task`, then `release(session)` in one transaction. False (and one warning
    naming `what`) when the release failed: the process is shutting down, and the lease expires
    on its own."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    try:
        with sf() as session, session.begin():
            release(session)
    except Exception:
        log.warning("could not release the %s", what, exc_info=True, extra=extra)
        return False
    return True
