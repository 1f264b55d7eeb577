"""The PostgreSQL pool as the API uses it: a cached `GET /decisions` page costs one round trip
to the server, and pooled connections the server has dropped (a restart, an idle timeout) are
replaced without failing the request (PostgreSQL only)."""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from app.core.types import DecisionSource
from app.store import db, decisions
from tests.api.helpers import OPER, TOKENS, VIEWER, bearer, pin
from tests.conftest import Api, ApiFactory

LISTENER_THREAD = "pg-decision-listener"  # app/connectors/virtual.py PgDecisionListener

pytestmark = pytest.mark.anyio


@pytest.fixture
def backend() -> str:
    return "postgresql"  # overrides the conftest's parametrized fixture: this module is PostgreSQL's


@contextmanager
def round_trips(engine: Engine) -> Iterator[list[str]]:
    """The requests the client sends to the server on this engine's connections while the block
    runs, one entry per round trip: a simple query ("Query") or an extended-protocol exchange
    (ended by "Sync"), read from libpq's protocol trace."""
    sent: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace"
        with open(trace, "w") as fh:
            traced = []

            def on_checkout(dbapi_conn, _record, _proxy):  # type: ignore[no-untyped-def]
                if threading.current_thread().name == LISTENER_THREAD:
                    return  # reading a notified decision for the long-polls, not serving a page
                dbapi_conn.pgconn.trace(fh.fileno())
                traced.append(dbapi_conn)

            def on_checkin(dbapi_conn, _record):  # type: ignore[no-untyped-def]
                if dbapi_conn is not None:
                    dbapi_conn.pgconn.untrace()

            # First among the checkout listeners: the idle ping (db.make_engine) is counted too.
            event.listen(engine, "checkout", on_checkout, insert=True)
            event.listen(engine, "checkin", on_checkin)
            try:
                yield sent
            finally:
                event.remove(engine, "checkout", on_checkout)
                event.remove(engine, "checkin", on_checkin)
                for dbapi_conn in traced:
                    if not dbapi_conn.closed:
                        dbapi_conn.pgconn.untrace()
        for line in trace.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) >= 4 and fields[1] == "F" and fields[3] in ("Query", "Sync"):
                sent.append(fields[4].strip() if fields[3] == "Query" else "(extended query)")


def terminate_sessions(db_url: str) -> int:
    """Close every server session on this database from the server's side, as a restart does."""
    admin = create_engine(make_url(db_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            killed = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": make_url(db_url).database},
            ).scalar_one()
    finally:
        admin.dispose()
    return int(killed)


async def page(api: Api) -> bytes:
    r = await api.client.get("/decisions", params={"deployment": "demo"}, headers=bearer(VIEWER))
    assert r.status_code == 200, r.text
    return r.content


async def test_a_cached_page_needs_no_round_trip_while_writes_are_notified(make_api: ApiFactory) -> None:
    api = await make_api(tokens=TOKENS)
    # The LISTEN thread reads the latest decisions once connected: not while this test counts.
    assert await asyncio.to_thread(api.app.state.listener.connected.wait, 10)
    assert (await pin(api, token=OPER)).status_code == 201
    first = await page(api)
    with round_trips(api.app.state.engine) as sent:
        again = await page(api)
    assert again == first
    assert sent == [], sent  # the version is known from the notifications, the body is cached

    # This process's own write is seen by its next page at once (taken on commit, not from the
    # notification, which may not have arrived yet).
    created = await pin(api, 2, 2, token=OPER)
    assert created.status_code == 201, created.text
    newest = json.loads(await page(api))["items"][-1]
    assert newest["id"] == created.json()["decision"]["id"] and newest["num_prefill"] == 2


async def test_without_the_listener_a_cached_page_is_one_round_trip(make_api: ApiFactory) -> None:
    api = await make_api(tokens=TOKENS)
    assert await asyncio.to_thread(api.app.state.listener.connected.wait, 10)
    assert (await pin(api, token=OPER)).status_code == 201
    first = await page(api)
    api.app.state.decision_versions.down()  # as when the LISTEN connection is lost
    with round_trips(api.app.state.engine) as sent:
        again = await page(api)
    assert again == first
    # The version read, nothing else: no pre-ping, no BEGIN, no ROLLBACK.
    assert sent == ["(extended query)"], sent


async def test_a_write_by_another_process_reaches_the_cached_page(make_api: ApiFactory, db_url: str) -> None:
    api = await make_api(tokens=TOKENS)
    assert await asyncio.to_thread(api.app.state.listener.connected.wait, 10)
    assert (await pin(api, token=OPER)).status_code == 201
    before = await page(api)
    assert await page(api) == before  # cached, served from the notified version

    # Another planner process's write: its own engine and sessions, so only its NOTIFY tells.
    other = create_engine(make_url(db_url))
    try:
        with Session(other) as session, session.begin():
            result = decisions.propose_decision(
                session,
                deployment="demo",
                target={"prefill": 7, "decode": 7},
                source=DecisionSource.OVERRIDE,
                reasons=["written by another process"],
                now=datetime.now(UTC),
                ack_timeout_s=60,
            )
            assert result.decision is not None
            written = result.decision.decision_id
    finally:
        other.dispose()
    deadline = time.monotonic() + 10
    while (ids := [d["id"] for d in json.loads(await page(api))["items"]])[-1] != written:
        assert time.monotonic() < deadline, f"the page never showed decision {written}: {ids}"
        await asyncio.sleep(0.01)


async def test_dead_pooled_connections_do_not_fail_the_page(make_api: ApiFactory, db_url: str) -> None:
    api = await make_api(tokens=TOKENS)
    assert (await pin(api, token=OPER)).status_code == 201
    page = await api.client.get("/decisions", params={"deployment": "demo"}, headers=bearer(VIEWER))
    assert page.status_code == 200, page.text
    assert terminate_sessions(db_url) >= 1
    # The pooled connection was used a moment ago (not pinged): its read fails, and is run again
    # on a new connection.
    again = await api.client.get("/decisions", params={"deployment": "demo"}, headers=bearer(VIEWER))
    assert again.status_code == 200, again.text
    assert again.content == page.content


async def test_an_idle_dead_connection_is_replaced_at_checkout(
    make_api: ApiFactory, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = await make_api(tokens=TOKENS)
    created = await pin(api, token=OPER)
    assert created.status_code == 201
    decision_id = created.json()["decision"]["id"]
    one = await api.client.get(f"/decisions/{decision_id}", headers=bearer(VIEWER))
    assert one.status_code == 200, one.text
    assert terminate_sessions(db_url) >= 1
    monkeypatch.setattr(db, "PG_PING_IDLE_S", 0.0)  # every pooled connection counts as idle
    # An ORM session, not run_read: nothing retries it, the ping at checkout finds the dead
    # connection and the pool opens a new one.
    again = await api.client.get(f"/decisions/{decision_id}", headers=bearer(VIEWER))
    assert again.status_code == 200, again.text
    assert again.json() == one.json()


async def test_malformed_notifications_are_skipped_and_the_listener_goes_on(
    make_api: ApiFactory, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    api = await make_api(tokens=TOKENS)
    assert await asyncio.to_thread(api.app.state.listener.connected.wait, 10)
    assert (await pin(api, token=OPER)).status_code == 201
    before = api.app.state.decision_versions.version("demo")
    other = create_engine(make_url(db_url), isolation_level="AUTOCOMMIT")
    try:
        with other.connect() as conn:
            for channel in (decisions.WRITES_CHANNEL, decisions.NOTIFY_CHANNEL):
                for payload in (
                    "not json",
                    '{"deployment": "demo"}',
                    '{"deployment": "demo", "seq": "x", "id": []}',
                ):
                    conn.execute(text("SELECT pg_notify(:c, :p)"), {"c": channel, "p": payload})
    finally:
        other.dispose()
    deadline = time.monotonic() + 10
    while sum("ignoring malformed notification" in r.getMessage() for r in caplog.records) < 6:
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        await asyncio.sleep(0.01)
    # Nothing was taken from them, and the listener is still up: the next write is seen.
    assert api.app.state.decision_versions.version("demo") == before
    assert api.app.state.listener.connected.is_set()
    created = await pin(api, 2, 2, token=OPER)
    assert json.loads(await page(api))["items"][-1]["id"] == created.json()["decision"]["id"]
