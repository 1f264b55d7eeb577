import pytest

pytestmark = pytest.mark.anyio


async def test_pin_then_wait_returns_it(make_api):
    api = await make_api()
    r = await api.client.post(
        "/override",
        json={"deployment": "demo", "action": "pin", "num_prefill": 3, "num_decode": 5, "reason": "smoke"},
    )
    assert r.status_code == 201, r.text
    assert r.json()["decision"]["id"] == 1
    r = await api.client.get("/decisions/wait", params={"deployment": "demo", "after": 0, "timeout_s": 1})
    assert r.status_code == 200
    assert (r.json()["num_prefill"], r.json()["num_decode"]) == (3, 5)
