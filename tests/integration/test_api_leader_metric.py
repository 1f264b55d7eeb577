"""The worker lease on /metrics, over real HTTP against a `planner serve` process: while another
process holds the deployment's lease this one reports `dynamo_planner_leader 0`; it takes the
lease when that holder's expires (1, one acquisition), keeps it (renewals), and reports the loss
when another process takes it over (0, one loss). The other process is a lease row written by
the test, as a second planner's renewal would write it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from app.store.db import make_engine, make_session_factory
from app.store.decisions import ensure_deployments
from app.store.models import DeploymentState
from tests.support import PlannerProcess, metric, planner_starter, poll

pytestmark = pytest.mark.timeout(120)

OTHER = "other-host:4242:standby"
LEASE = {"PLANNER_LEASE_TTL_S": "2", "PLANNER_LEASE_RENEW_S": "0.2"}


def series(name: str) -> str:
    return f'{name}{{deployment="demo"}}'


@pytest.fixture
def start_planner(db_url: str, tmp_path: Path) -> Iterator[Callable[..., PlannerProcess]]:
    with planner_starter(db_url, tmp_path) as start:
        yield start


def hold_lease(db_url: str, holder: str, expires_at: datetime) -> None:
    """Write the deployment's lease row as a renewal by `holder` would."""
    engine = make_engine(db_url)
    try:
        with make_session_factory(engine)() as session, session.begin():
            ensure_deployments(session, ["demo"])
            session.execute(
                update(DeploymentState)
                .where(DeploymentState.name == "demo")
                .values(lease_holder=holder, lease_expires_at=expires_at)
            )
    finally:
        engine.dispose()


def test_leader_gauge_follows_the_lease(start_planner: Callable[..., PlannerProcess], db_url: str) -> None:
    far = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    hold_lease(db_url, OTHER, far)
    proc = start_planner(**LEASE)
    with httpx.Client(base_url=proc.base_url, timeout=10.0) as client:
        # Standing by: the series exist at 0, and show until when the other holder's lease runs.
        poll(
            lambda: (
                metric(client, series("dynamo_planner_lease_expiry_timestamp_seconds")) == far.timestamp()
            ),
            "the standby reports the other holder's lease",
            proc,
        )
        assert metric(client, series("dynamo_planner_leader")) == 0
        assert metric(client, series("dynamo_planner_lease_acquisitions_total")) == 0
        assert metric(client, series("dynamo_planner_lease_losses_total")) == 0

        # The other holder stopped renewing: its lease ran out a second ago.
        hold_lease(db_url, OTHER, datetime.now(UTC) - timedelta(seconds=1))
        poll(lambda: metric(client, series("dynamo_planner_leader")) == 1, "this process leads", proc)
        assert metric(client, series("dynamo_planner_lease_acquisitions_total")) == 1
        poll(
            lambda: (metric(client, series("dynamo_planner_lease_renewals_total")) or 0) >= 2,
            "the leader renews its lease",
            proc,
        )
        expiry = metric(client, series("dynamo_planner_lease_expiry_timestamp_seconds"))
        assert expiry is not None and expiry > datetime.now(UTC).timestamp() - 5

        # Another process takes the lease over (as if this one's renewals had come too late).
        hold_lease(db_url, OTHER, far)
        poll(lambda: metric(client, series("dynamo_planner_leader")) == 0, "this process stands by", proc)
        assert metric(client, series("dynamo_planner_lease_losses_total")) == 1
        assert metric(client, series("dynamo_planner_lease_acquisitions_total")) == 1
        assert metric(client, series("dynamo_planner_lease_expiry_timestamp_seconds")) == far.timestamp()
