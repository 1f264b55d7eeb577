"""The stand-in frontend `make serve` starts: a trace played on the clock it is given, counted as
a Dynamo frontend counts (started at arrival, lengths at completion), looping at the trace's end."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.core.traces import TraceRequest
from app.sim.demo.standin import TracePlayback, main, nominal_duration_s

TRACE = [TraceRequest(0.0, 100, 10), TraceRequest(2.0, 300, 50), TraceRequest(9.0, 1000, 5)]


@dataclass(frozen=True)
class PlaybackCase:
    name: str
    why: str
    elapsed_s: float
    started: int
    completed: int


CASES = [
    PlaybackCase("before_anything", "nothing has arrived at time 0 but the first request", 0.0, 1, 0),
    PlaybackCase(
        "first_done",
        "the first request is in flight for its nominal duration, then completes",
        nominal_duration_s(10),
        1,
        1,
    ),
    PlaybackCase("second_in_flight", "the second has arrived but not completed", 2.5, 2, 1),
    PlaybackCase("all_done", "every request completed long after the last arrival", 9.9, 3, 3),
    PlaybackCase(
        "loops",
        "the trace starts over a second after its last arrival: its first request again",
        10.0,
        4,
        3,
    ),
    PlaybackCase("second_loop", "the second loop counts the same requests again", 19.5, 6, 6),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_playback_counts_what_has_arrived_and_completed(case: PlaybackCase) -> None:
    playback = TracePlayback(TRACE)
    playback.advance(case.elapsed_s)
    assert (playback.counters.started, playback.counters.completed) == (case.started, case.completed), (
        case.why
    )


def test_lengths_reach_the_metrics_at_completion_and_no_latency_is_reported() -> None:
    playback = TracePlayback(TRACE)
    text = playback.metrics(2.5)
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert float(lines['dynamo_frontend_input_sequence_tokens_sum{model="model"}']) == 100
    assert float(lines['dynamo_frontend_inflight_requests{model="model"}']) == 1
    # No engine answered: no TTFT or ITL sample, so the planner reads them as unknown, not as 0.
    assert float(lines['dynamo_frontend_time_to_first_token_seconds_count{model="model"}']) == 0
    assert float(lines['dynamo_frontend_inter_token_latency_seconds_count{model="model"}']) == 0


def test_time_never_goes_back() -> None:
    playback = TracePlayback(TRACE)
    playback.advance(9.9)
    playback.advance(1.0)
    assert playback.counters.started == 3


def test_a_bad_trace_is_one_line_and_a_non_zero_exit(tmp_path, capsys) -> None:
    bad = tmp_path / "trace.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": "x", "output_length": 1}\n')
    assert main(["--trace", str(bad), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("standin: ") and "input_length" in err and "\n" not in err
