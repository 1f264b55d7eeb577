"""The stored fleet step (the `fleet_state` row) as GET /fleet and the `fleet` field of
GET /deployments show it. Any process answers the same: the row is in the database."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from app.api.schemas import FleetBudgetOut, FleetCutOut, FleetMemberOut, FleetMoveOut, FleetOut, FleetRoleOut
from app.config import DeploymentsFile
from app.store import decisions as decision_store
from app.store import fleet as fleet_store


def _used_gpus(session: Session, name: str, gpus_per_engine: dict[str, int]) -> int | None:
    latest = decision_store.latest_decision(session, name)
    if latest is None:
        return None
    replicas = decision_store.replicas_of(latest)
    return sum(n * gpus_per_engine.get(role, 1) for role, n in replicas.items())


def member_out(session: Session, name: str, record: dict[str, Any] | None) -> FleetMemberOut | None:
    grants = ((record or {}).get("decision") or {}).get("grants") or {}
    g = grants.get(name)
    if g is None:
        return None
    roles = {
        role: FleetRoleOut(
            wish=r["wish"],
            granted=r["engines"],
            cut=r["engines"] < r["wish"],
            reason=r["reason"],
            detail=r["detail"],
        )
        for role, r in g["roles"].items()
    }
    return FleetMemberOut(
        deployment=name,
        gpu_type=g["gpu_type"],
        priority=g["priority"],
        guaranteed_gpus=g.get("configured_guaranteed_gpus", g["guaranteed_gpus"]),
        max_gpus=g.get("max_gpus"),
        wish_gpus=g["wish_gpus"],
        granted_gpus=g["gpus"],
        used_gpus=_used_gpus(session, name, g.get("gpus_per_engine") or {}),
        cut=any(r.cut for r in roles.values()),
        roles=roles,
        cut_by=[FleetCutOut(**c) for c in g.get("cut_by") or []],
        grant_changes=int((record or {}).get("grant_changes", {}).get(name, 0)),
        granted_at=datetime.fromisoformat(record["at"]) if record and record.get("at") else None,
    )


def deployment_fleet(session: Session, deployments: DeploymentsFile, name: str) -> FleetMemberOut | None:
    if deployments.fleet is None:
        return None
    row = fleet_store.load_fleet(session)
    return member_out(session, name, row.record if row else None)


def fleet_out(session: Session, deployments: DeploymentsFile, worker: Any) -> FleetOut:
    fleet = deployments.fleet
    assert fleet is not None
    row = fleet_store.load_fleet(session)
    record = row.record if row is not None else None
    members = [m for d in deployments.deployments if (m := member_out(session, d.name, record)) is not None]
    budgets = []
    for gpu_type, budget in fleet.budget_gpus.items():
        group = [m for m in members if m.gpu_type == gpu_type]
        granted = sum(m.granted_gpus for m in group)
        budgets.append(
            FleetBudgetOut(
                gpu_type=gpu_type,
                budget_gpus=budget,
                granted_gpus=granted,
                used_gpus=sum(m.used_gpus or 0 for m in group),
                free_gpus=budget - granted,
            )
        )
    return FleetOut(
        stepped_at=row.stepped_at if row is not None else None,
        interval_s=fleet.interval_s,
        margin=fleet.margin,
        hold_s=fleet.hold_s,
        leader=bool(worker is not None and worker.is_leader),
        last_error=worker.last_error if worker is not None else None,
        budgets=budgets,
        members=members,
        moves=[FleetMoveOut(**m) for m in (record or {}).get("moves") or []],
    )
