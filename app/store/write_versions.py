"""Each deployment's decisions version (`deployment_state.write_seq`) as this process knows it
without asking the database: from its own commits, and on PostgreSQL from the NOTIFY that every
planner process sends with each write (`store.decisions.lock_deployment`).

The polled decision page keys its cached body on this version; while the mirror is live, a
cached page is served without a database round trip (bench/api.py). It is live only while the
LISTEN connection is up and was seeded from the table after LISTEN began, so no write can fall
between the seed and the notifications; otherwise `version` answers None and the page reads the
version from the database as before.

A page served by another process may trail a write by the notification's delivery; the writing
process itself sees its write at once, because the seq is taken on commit (`after_commit`),
before the writer's response is sent."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

_PENDING = "planner_write_seqs"  # Session.info key: seqs written in the open transaction


class WriteVersions:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seqs: dict[str, int] = {}
        self._live = False

    def seed(self, rows: Iterable[tuple[str, int]]) -> None:
        """The table's seqs, read after LISTEN began: from now on notifications keep it current."""
        with self._lock:
            # The table's word replaces what was known (a restored database may count lower);
            # notifications still queued from before the read carry no higher seq, and `saw`
            # keeps the highest.
            self._seqs = dict(rows)
            self._live = True

    def down(self) -> None:
        """The LISTEN connection is lost: writes may go unseen until it is back and seeded."""
        with self._lock:
            self._live = False

    def saw(self, deployment: str, seq: int) -> None:
        with self._lock:
            if seq > self._seqs.get(deployment, -1):
                self._seqs[deployment] = seq

    def version(self, deployment: str | None) -> tuple[tuple[str, int], ...] | None:
        """As `store.decisions.decisions_version` would read it, or None when not live. A
        deployment not seen yet (no state row when seeded) is not live either."""
        with self._lock:
            if not self._live:
                return None
            if deployment is None:
                return tuple(sorted(self._seqs.items()))
            seq = self._seqs.get(deployment)
            return None if seq is None else ((deployment, seq),)

    def follow_commits(self, factory: sessionmaker[Session]) -> None:
        """Take the seqs written by this process's sessions when they commit."""
        event.listen(factory, "after_commit", self._committed)
        event.listen(factory, "after_rollback", _forget)

    def _committed(self, session: Session) -> None:
        for deployment, seq in session.info.pop(_PENDING, {}).items():
            self.saw(deployment, seq)


def note_write(session: Session, deployment: str, seq: int) -> None:
    """Called by the write that bumped `seq` (inside its transaction)."""
    session.info.setdefault(_PENDING, {})[deployment] = seq


def _forget(session: Session) -> None:
    session.info.pop(_PENDING, None)
