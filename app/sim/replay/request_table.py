"""A replay's per-request table: the quantities every output derives from each request, as numpy
columns (`request_table`). A long trace has ~600k requests, and a Python pass per request and per
metric would dominate the write time, so they are computed once and shared by the summary and
requests.csv.gz (`app/sim/replay/outputs.py`) and the HTML report (`app/sim/replay/report.py`).

SLO rules (the same in the summary and in requests.csv.gz's `met_slo`, so its mean is
`slo_attainment`): a request meets its SLO when it finished, its TTFT is within the target and its
mean ITL is within the target; a one-token output has no ITL, so only its TTFT counts.
`ttft_attainment` counts every request whose first token came in time (even if its decode never
finished); `itl_attainment` counts finished requests whose ITL is within target (one-token outputs
included). Every attainment is a share of *all* requests: what was never served is a miss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.sim.world.engines import SimRequest


@dataclass(frozen=True)
class RequestTable:
    """Per-request columns in request order; NaN where a value is not known."""

    arrival_s: np.ndarray
    isl: np.ndarray
    osl: np.ndarray
    ttft_ms: np.ndarray  # NaN: no first token
    itl_ms: np.ndarray  # NaN: unfinished, or a one-token output
    e2e_s: np.ndarray  # NaN: unfinished
    finished: np.ndarray
    met_ttft: np.ndarray
    met_itl: np.ndarray  # True for a finished one-token output: it has no ITL to miss
    met_slo: np.ndarray

    def __len__(self) -> int:
        return int(self.arrival_s.size)


def request_table(
    requests: Sequence[SimRequest], ttft_target_ms: float, itl_target_ms: float
) -> RequestTable:
    n = len(requests)
    arrival_s = np.fromiter((r.arrival_s for r in requests), dtype=float, count=n)
    isl = np.fromiter((r.isl for r in requests), dtype=np.int64, count=n)
    osl = np.fromiter((r.osl for r in requests), dtype=np.int64, count=n)
    # dtype=float turns None (not happened) into NaN, which every comparison below treats as a miss.
    first_token_s = np.array([r.first_token_s for r in requests], dtype=float)
    finish_s = np.array([r.finish_s for r in requests], dtype=float)

    finished = ~np.isnan(finish_s)
    ttft_ms = (first_token_s - arrival_s) * 1000.0
    multi_token = osl > 1
    itl_ms = np.full(n, np.nan)
    np.divide(
        (finish_s - first_token_s) * 1000.0,
        osl - 1,
        out=itl_ms,
        where=multi_token & finished,
    )
    met_ttft = ttft_ms <= ttft_target_ms
    met_itl = finished & (~multi_token | (itl_ms <= itl_target_ms))
    return RequestTable(
        arrival_s=arrival_s,
        isl=isl,
        osl=osl,
        ttft_ms=ttft_ms,
        itl_ms=itl_ms,
        e2e_s=finish_s - arrival_s,
        finished=finished,
        met_ttft=met_ttft,
        met_itl=met_itl,
        met_slo=finished & met_ttft & met_itl,
    )
