"""The HTTP API under stress and at its edges, over real HTTP against `planner serve` processes:
a graceful stop with held long-polls, clients that hang up, oversized bodies, the bounds on held
long-polls, and the smaller contract fixes (newest diagnostics, finite numbers, a sanitized
/readyz, conflicting acknowledgements).
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.store import ticks as tick_store
from app.store.db import make_engine, make_session_factory
from tests.support import (
    OPER,
    ORCH,
    VIEWER,
    PlannerProcess,
    acknowledge,
    expect,
    log_tail,
    metric,
    pin,
    planner_starter,
    poll,
)

PROBLEM_JSON = "application/problem+json"
PAUSE = b'{"deployment": "demo", "action": "pause", "reason": "r", "expires_in_s": %s}'


@pytest.fixture
def start_planner(db_url: str, tmp_path: Path) -> Iterator[Callable[..., PlannerProcess]]:
    with planner_starter(db_url, tmp_path) as start:
        yield start


@pytest.fixture(scope="module")
def shared_planner(sqlite_dbs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlannerProcess]:
    """One server on SQLite for the checks that touch no store (body limits, query validation),
    which change nothing on it."""
    url = sqlite_dbs.fresh()
    with planner_starter(url, tmp_path_factory.mktemp("shared")) as start:
        yield start()
    sqlite_dbs.drop(url)


@pytest.fixture
def start_sqlite_planner(sqlite_dbs, tmp_path: Path) -> Iterator[Callable[..., PlannerProcess]]:
    url = sqlite_dbs.fresh()
    with planner_starter(url, tmp_path) as start:
        yield start
    sqlite_dbs.drop(url)


def held(client: httpx.Client) -> float:
    value = metric(client, "dynamo_planner_decision_waiters")
    assert value is not None, client.get("/metrics").text
    return value


def wait_until_held(client: httpx.Client, count: int, proc: PlannerProcess) -> None:
    poll(lambda: held(client) == count, f"{count} held long-poll(s) on /metrics", proc)


def long_poll(
    pool: ThreadPoolExecutor, proc: PlannerProcess, headers: dict[str, str], after: int, timeout_s: float = 60
) -> Future[httpx.Response]:
    return pool.submit(
        httpx.get,
        f"{proc.base_url}/decisions/wait",
        headers=headers,
        params={"deployment": "demo", "after": after, "timeout_s": timeout_s},
        timeout=120,
    )


def assert_problem(r: httpx.Response, status: int, field: str | None = None) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM_JSON), r.headers
    body = r.json()
    assert body["status"] == status and body["title"] and body["type"] and body["detail"], body
    if field is not None:
        fields = [e["field"] for e in body.get("errors") or []]
        assert field in body["detail"] or any(field in f for f in fields), body
    return body


def raw_request(port: int, head: str, body: bytes = b"") -> socket.socket:
    """Send a request (head, then as much of the body as given) on a fresh connection."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=15)
    sock.sendall(head.encode() + body)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one response whose body has a Content-Length (what this server sends); fails on the
    socket timeout if the server never answers."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    while len(rest) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the middle of the body"
        rest += chunk
    return int(lines[0].split()[1]), headers, rest


# --- 1. a graceful stop answers held long-polls at once ----------------------------------------------


def test_sigterm_ends_held_long_polls_with_503_at_once(start_planner: Callable[..., PlannerProcess]) -> None:
    proc = start_planner()
    with httpx.Client(base_url=proc.base_url, timeout=30) as client, ThreadPoolExecutor(8) as pool:
        pin(client, 2, 3, "before the stop", proc)
        waits = [long_poll(pool, proc, ORCH, after=1) for _ in range(6)]
        wait_until_held(client, 6, proc)

        t0 = time.monotonic()
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGTERM)
        answers = [w.result(timeout=60) for w in waits]
        answered_s = time.monotonic() - t0
        exit_status = proc.proc.wait(timeout=30)

    for r in answers:
        body = assert_problem(r, 503)
        assert "stopping" in body["detail"], body
        assert int(r.headers["retry-after"]) >= 1, r.headers
    # Loose on purpose (the bound is 1 s; the machine is shared): before this fix the answers were
    # a 500 after uvicorn's 5 s graceful-shutdown timeout.
    assert answered_s < 5, f"held long-polls answered {answered_s:.2f} s after SIGTERM"
    assert exit_status in (0, -signal.SIGTERM), log_tail(proc)
    log = Path(proc.log_path or "").read_text()
    for sign in ("Traceback", "Exception in ASGI application", "timeout graceful shutdown exceeded"):
        assert sign not in log, log_tail(proc)


# --- 2. a client that hangs up is let go -------------------------------------------------------------


def test_long_polls_of_clients_that_hung_up_are_released(
    start_planner: Callable[..., PlannerProcess],
) -> None:
    proc = start_planner()
    head = (
        "GET /decisions/wait?deployment=demo&after=0&timeout_s=120 HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{proc.port}\r\nAuthorization: {ORCH['Authorization']}\r\n\r\n"
    )
    with httpx.Client(base_url=proc.base_url, timeout=30) as client:
        socks = [raw_request(proc.port, head) for _ in range(40)]
        wait_until_held(client, 40, proc)
        for sock in socks[:30]:
            sock.close()
        # Released at once, not at their 120 s timeout.
        wait_until_held(client, 10, proc)
        # The ten still connected are still held, and still get the decision.
        pin(client, 2, 3, "after the hang-ups", proc)
        for sock in socks[30:]:
            status, _, body = read_response(sock)
            assert status == 200, body
            sock.close()
        wait_until_held(client, 0, proc)


# --- 3. a bound on request bodies ----------------------------------------------------------------------


def test_a_body_over_the_limit_is_refused_before_it_is_read(shared_planner: PlannerProcess) -> None:
    proc = shared_planner
    # 50 MB announced, not one byte of it sent: the answer must come without reading the body.
    sock = raw_request(
        proc.port,
        f"POST /plan HTTP/1.1\r\nHost: 127.0.0.1:{proc.port}\r\nAuthorization: {VIEWER['Authorization']}\r\n"
        "Content-Type: application/json\r\nContent-Length: 52428800\r\n\r\n",
    )
    status, headers, body = read_response(sock)
    assert status == 413, body
    assert headers["content-type"].startswith(PROBLEM_JSON)
    assert headers.get("connection") == "close"
    problem = httpx.Response(413, headers=headers, content=body).json()
    assert problem["status"] == 413
    assert problem["errors"][0]["field"] == "body"
    assert "52428800" in problem["detail"] and "1048576" in problem["detail"], problem
    assert sock.recv(1) == b""  # the server closed the connection; the body is never read
    sock.close()

    with httpx.Client(base_url=proc.base_url, timeout=30) as client:
        assert client.get("/healthz").status_code == 200  # the loop was never blocked


def test_a_chunked_body_stops_being_read_at_the_limit(shared_planner: PlannerProcess) -> None:
    proc = shared_planner
    sock = raw_request(
        proc.port,
        f"POST /override HTTP/1.1\r\nHost: 127.0.0.1:{proc.port}\r\n"
        f"Authorization: {OPER['Authorization']}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    chunk = b" " * 65536
    for _ in range(17):  # 1.06 MiB, just over the limit; the body never ends
        sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
    status, headers, body = read_response(sock)
    assert status == 413, body
    assert headers["content-type"].startswith(PROBLEM_JSON)
    assert "chunked" in httpx.Response(413, content=body).json()["detail"]
    sock.close()


def test_the_body_limit_is_a_setting(start_sqlite_planner: Callable[..., PlannerProcess]) -> None:
    proc = start_sqlite_planner(PLANNER_MAX_BODY_BYTES="300")
    plan = b'{"deployment": "demo", "rps": 1, "isl": 100, "osl": 10}'
    with httpx.Client(base_url=proc.base_url, timeout=30, headers=VIEWER) as client:
        headers = {"content-type": "application/json"}
        small = client.post("/plan", content=plan, headers=headers)
        assert small.status_code != 413, small.text  # 422: the demo deployment has no profile
        padded = plan[:-1] + b" " * 300 + b"}"  # the same JSON, 300 bytes of spaces longer
        assert_problem(client.post("/plan", content=padded, headers=headers), 413, "body")


# --- 4. bounded held long-polls --------------------------------------------------------------------------


def test_held_long_polls_are_bounded_per_caller_and_in_total(
    start_planner: Callable[..., PlannerProcess],
) -> None:
    proc = start_planner(PLANNER_MAX_HELD_LONGPOLLS="3", PLANNER_MAX_HELD_LONGPOLLS_PER_CALLER="2")
    with httpx.Client(base_url=proc.base_url, timeout=30) as client, ThreadPoolExecutor(4) as pool:
        pin(client, 2, 3, "first", proc)
        mine = [long_poll(pool, proc, ORCH, after=1) for _ in range(2)]
        wait_until_held(client, 2, proc)

        params = {"deployment": "demo", "after": 1, "timeout_s": 60}
        third = client.get("/decisions/wait", headers=ORCH, params=params)
        body = assert_problem(third, 429)
        assert "this caller" in body["detail"], body
        assert int(third.headers["retry-after"]) >= 1
        # One that is answered at once is never refused.
        assert (
            expect(client.get("/decisions/wait", headers=ORCH, params={**params, "after": 0}), 200)["id"] == 1
        )

        other = long_poll(pool, proc, OPER, after=1)  # another token: its own share
        wait_until_held(client, 3, proc)
        body = assert_problem(client.get("/decisions/wait", headers=OPER, params=params), 429)
        assert "this process" in body["detail"], body
        assert held(client) == 3

        pin(client, 4, 5, "second", proc)
        assert [expect(w.result(timeout=60), 200, proc)["id"] for w in [*mine, other]] == [2, 2, 2]
        wait_until_held(client, 0, proc)
        # Places are given back: the caller may hold long-polls again.
        r = client.get("/decisions/wait", headers=ORCH, params={**params, "after": 2, "timeout_s": 0.2})
        expect(r, 204, proc)


# --- 7. smaller contract fixes --------------------------------------------------------------------------


def test_diagnostics_limit_gives_the_newest_ticks_in_order(
    start_planner: Callable[..., PlannerProcess], db_url: str
) -> None:
    proc = start_planner()
    engine = make_engine(db_url)
    t0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    with make_session_factory(engine)() as session, session.begin():
        ids = [
            tick_store.add_tick(
                session, deployment="demo", at=t0 + timedelta(seconds=10 * n), record={"n": n}
            ).id
            for n in range(12)
        ]
    engine.dispose()
    with httpx.Client(base_url=proc.base_url, timeout=30, headers=VIEWER) as client:
        params = {"deployment": "demo", "until": "2026-11-29T12:10:00Z"}  # leaves the server's own ticks out
        page = expect(client.get("/diagnostics", params={**params, "limit": 5}), 200, proc)
        assert [t["record"]["n"] for t in page["items"]] == [7, 8, 9, 10, 11]
        assert page["next_cursor"] == ids[7]
        older = expect(
            client.get("/diagnostics", params={**params, "limit": 5, "cursor": page["next_cursor"]}),
            200,
            proc,
        )
        assert [t["record"]["n"] for t in older["items"]] == [2, 3, 4, 5, 6]
        oldest = expect(
            client.get("/diagnostics", params={**params, "limit": 5, "cursor": older["next_cursor"]}),
            200,
            proc,
        )
        assert ([t["record"]["n"] for t in oldest["items"]], oldest["next_cursor"]) == ([0, 1], None)
        # Unix time is accepted for since, as documented.
        unix = expect(client.get("/diagnostics", params={**params, "since": t0.timestamp() + 95}), 200, proc)
        assert [t["record"]["n"] for t in unix["items"]] == [10, 11]


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "field"),
    [
        pytest.param(
            "POST",
            "/override",
            {
                "content": PAUSE % b"NaN",
                "headers": {"content-type": "application/json", **OPER},
            },
            "expires_in_s",
            id="expires_in_s-nan",
        ),
        pytest.param(
            "POST",
            "/override",
            {
                "content": PAUSE % b"Infinity",
                "headers": {"content-type": "application/json", **OPER},
            },
            "expires_in_s",
            id="expires_in_s-infinity",
        ),
        pytest.param(
            "GET",
            "/decisions/wait",
            {"params": {"deployment": "demo", "timeout_s": "nan"}, "headers": ORCH},
            "timeout_s",
            id="timeout_s-nan",
        ),
    ],
)
def test_non_finite_numbers_are_reported_as_such(
    shared_planner: PlannerProcess, method: str, path: str, kwargs: dict, field: str
) -> None:
    proc = shared_planner
    with httpx.Client(base_url=proc.base_url, timeout=30) as client:
        body = assert_problem(client.request(method, path, **kwargs), 422, field)
    assert body["errors"][0]["field"].endswith(field), body
    assert "must be finite" in body["errors"][0]["message"], body
    assert "less than" not in body["detail"] and "greater than" not in body["detail"], body


def _break_the_database(db_url: str) -> None:
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        # SQLite's `SELECT 1` never fails on a pooled connection; a schema that lost a table
        # fails the worker's next write (its lease), with the statement in the error.
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE deployment_state"))
        engine.dispose()
        return
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE "{url.database}" WITH (FORCE)'))
    admin.dispose()


def test_readyz_gives_a_short_reason_without_sql_when_the_database_fails(
    start_planner: Callable[..., PlannerProcess], db_url: str
) -> None:
    # Scaled time: the worker renews its lease (a write) every 0.5 s instead of every 10 s.
    proc = start_planner(PLANNER_TIME_SCALE="20")
    postgres = make_url(db_url).get_backend_name() == "postgresql"
    with httpx.Client(base_url=proc.base_url, timeout=30) as client:
        expect(client.get("/readyz"), 200, proc)
        _break_the_database(db_url)

        responses: list[httpx.Response] = []

        def failing() -> bool:
            responses.append(client.get("/readyz"))
            body = responses[-1].json()
            if postgres:
                return body["database"] != "ok" and any(body["deployments"].values())
            return any("last tick failed" in reason for reason in body["deployments"]["demo"])

        poll(failing, "/readyz reporting the broken database", proc)
        r = responses[-1]
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["ready"] is False
    if postgres:
        assert body["database"].startswith("unreachable: "), body
    reasons = [body["database"], *(reason for rs in body["deployments"].values() for reason in rs)]
    for reason in reasons:
        assert "\n" not in reason and len(reason) <= 220, reason
        for leak in ("[SQL", "SELECT", "[parameters", "Background on this error"):
            assert leak not in reason, reason


def test_a_repeated_acknowledgement_must_report_the_same_replicas(
    start_planner: Callable[..., PlannerProcess],
) -> None:
    proc = start_planner()
    with httpx.Client(base_url=proc.base_url, timeout=30) as client:
        pin(client, 3, 5, "ack twice", proc)
        first = acknowledge(client, 1, 3, 5, proc)
        assert acknowledge(client, 1, 3, 5, proc) == first  # identical: idempotent
        other = client.post(
            "/decisions/1/complete",
            headers=ORCH,
            json={"status": "succeeded", "observed": {"prefill": 4, "decode": 5}},
        )
        body = assert_problem(other, 409, "body.observed")
        assert "prefill=3" in body["detail"] and "prefill=4" in body["detail"], body
        read = expect(client.get("/decisions/1", headers=VIEWER), 200, proc)
        assert read["observed"] == {"prefill": 3, "decode": 5}


# --- 8. the decisions page, served again while the decisions stay the same -------------------------


def test_a_decisions_page_follows_what_another_process_writes(pg_dbs, tmp_path: Path) -> None:
    """Two planner processes on one PostgreSQL database: a page one of them has served must not
    hide an acknowledgement or a decision the other stored."""
    url = pg_dbs.fresh()
    with planner_starter(url, tmp_path) as start:
        a, b = start(), start()
        with (
            httpx.Client(base_url=a.base_url, timeout=30) as ca,
            httpx.Client(base_url=b.base_url, timeout=30) as cb,
        ):

            def listed() -> list[tuple[int, str]]:
                body = expect(ca.get("/decisions", headers=VIEWER, params={"deployment": "demo"}), 200, a, b)
                return [(d["id"], d["status"]) for d in body["items"]]

            pin(ca, 2, 3, "through a", a)
            assert listed() == [(1, "pending")]
            assert listed() == [(1, "pending")]
            acknowledge(cb, 1, 2, 3, b)
            assert listed() == [(1, "succeeded")]
            pin(cb, 4, 5, "through b", b)
            assert listed() == [(1, "succeeded"), (2, "pending")]
    pg_dbs.drop(url)
