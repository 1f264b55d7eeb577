import pytest

pytestmark = pytest.mark.anyio


async def test_listener_gauge_exists_only_where_a_listener_runs(make_api, backend):
    """On SQLite there is no LISTEN connection; a constant 0 would read as an outage."""
    api = await make_api()
    text = (await api.client.get("/metrics")).text
    assert ("dynamo_planner_notify_listener_up" in text) == (backend == "postgresql")
