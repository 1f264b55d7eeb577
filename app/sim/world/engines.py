"""Simulated engines: a prefill engine (FIFO queue, chunked prefill) and a decode engine
(continuous batching under a KV capacity).

Engines know nothing about the event queue: the cluster asks them when their current step ends
and tells them when it has. Times are simulated seconds.

Decode is simulated in *segments*, not token by token: between two changes of the batch (a
request finishing or joining) every iteration has the same requests, so the engine jumps to the
next change in one step, with the iteration time taken at the segment's midpoint context. A
request joining mid-segment joins at the next iteration boundary, as in continuous batching.
Contexts are tracked through an iteration counter `S`: a request admitted at counter `S0` with
prompt `isl` holds `isl + 1 + (S - S0)` tokens, so the batch's Σ context is `A + n·S` with
`A = Σ (isl + 1 - S0)`, kept in O(1) per admission.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from app.core.perf.fpm import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics
from app.sim.world.truth import TruthModel

FpmCallback = Callable[[ForwardPassMetrics], None]


class SimRequest:
    """One request's life in the simulated cluster (times in simulated seconds, None = not yet)."""

    __slots__ = (
        "id",
        "arrival_s",
        "isl",
        "osl",
        "prefill_engine",
        "decode_engine",
        "first_token_s",
        "decode_start_s",
        "finish_s",
        "finish_counter",
    )

    def __init__(self, id: int, arrival_s: float, isl: int, osl: int) -> None:
        self.id = id
        self.arrival_s = arrival_s
        self.isl = isl
        self.osl = osl
        self.prefill_engine: str | None = None
        self.decode_engine: str | None = None
        self.first_token_s: float | None = None
        self.decode_start_s: float | None = None
        self.finish_s: float | None = None
        self.finish_counter = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def itl_s(self) -> float | None:
        """Mean inter-token latency as the frontend sees it: from the first token to the last,
        over the tokens after the first (so decode queueing counts). None for one-token outputs."""
        if self.finish_s is None or self.first_token_s is None or self.osl <= 1:
            return None
        return (self.finish_s - self.first_token_s) / (self.osl - 1)

    @property
    def kv_need(self) -> int:
        return self.isl + self.osl


@dataclass
class Iteration:
    """What one engine iteration did, for FPM records."""

    wall_time_s: float
    prefill_requests: int = 0
    prefill_tokens: int = 0
    var_prefill_length: float = 0.0
    prefill_kv_tokens: int = 0
    decode_requests: int = 0
    decode_kv_tokens: int = 0
    var_decode_kv_tokens: float = 0.0


def _variance(values: list[int]) -> float:
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


class PrefillEngine:
    """Prompts are computed first come, first served, `max_num_batched_tokens` per iteration:
    an iteration takes the head of the queue, splitting the last prompt that does not fit (in
    the one-prompt world, only the head: one prompt per iteration)."""

    role = "prefill"

    def __init__(self, engine_id: str, truth: TruthModel, on_fpm: FpmCallback | None = None) -> None:
        self.id = engine_id
        self.truth = truth
        self.on_fpm = on_fpm
        # [request, prompt tokens still to compute]
        self.queue: deque[list] = deque()
        self.pending_tokens = 0  # prompt tokens not yet computed, including the running iteration's
        self.busy_until: float | None = None
        self._batch: list[tuple[SimRequest, int, bool]] = []  # (request, tokens, last chunk)
        self.last: Iteration | None = None
        self.killed = False  # stopped with work in hand: its running iteration never ends
        # Σ and Σ² of the queued prompts' lengths, for FPM without walking a long backlog.
        self._queued_isl = 0
        self._queued_isl_sq = 0

    @property
    def load(self) -> int:
        return self.pending_tokens

    @property
    def empty(self) -> bool:
        return self.busy_until is None and not self.queue

    def enqueue(self, request: SimRequest) -> None:
        self.queue.append([request, request.isl])
        self.pending_tokens += request.isl
        self._queued_isl += request.isl
        self._queued_isl_sq += request.isl * request.isl

    def start(self, now: float) -> float | None:
        """Begin the next iteration if idle and there is work; its end time, or None."""
        if self.busy_until is not None or not self.queue:
            return None
        truth = self.truth
        budget = truth.max_num_batched_tokens
        one_prompt = truth.one_prompt
        batch: list[tuple[SimRequest, int, bool]] = []
        tokens = 0
        earlier_chunks = 0  # prompt tokens of these requests computed in earlier iterations
        prefix_tokens2 = 0.0  # Σ chunk × (prefix + chunk / 2): what the prefix-cost world charges
        while self.queue and tokens < budget:
            entry = self.queue[0]
            request, remaining = entry
            take = min(remaining, budget - tokens)
            tokens += take
            prefix = request.isl - remaining
            earlier_chunks += prefix
            prefix_tokens2 += take * (prefix + take / 2)
            last = take == remaining
            batch.append((request, take, last))
            if last:
                self.queue.popleft()
                self._queued_isl -= request.isl
                self._queued_isl_sq -= request.isl * request.isl
            else:
                entry[1] = remaining - take
            if one_prompt:
                break
        wall_s = truth.prefill_iteration_s(tokens, prefix_tokens2)
        self._batch = batch
        self.busy_until = now + wall_s
        self.last = Iteration(
            wall_time_s=wall_s,
            prefill_requests=len(batch),
            prefill_tokens=tokens,
            var_prefill_length=_variance([r.isl for r, _, _ in batch]),
            prefill_kv_tokens=earlier_chunks,
        )
        return self.busy_until

    def kill(self) -> list[SimRequest]:
        """Stop at once: the requests whose prompt was running or queued, now cut off."""
        held = {r.id: r for r, _, _ in self._batch} | {entry[0].id: entry[0] for entry in self.queue}
        self.killed = True
        self._batch, self.queue, self.busy_until = [], deque(), None
        self.pending_tokens = self._queued_isl = self._queued_isl_sq = 0
        return list(held.values())

    def finish(self, now: float) -> list[SimRequest]:
        """End the running iteration; the requests whose prompt is now complete."""
        if self.on_fpm is not None:
            self.on_fpm(self.fpm())
        done = []
        for request, take, last in self._batch:
            self.pending_tokens -= take
            if last:
                request.first_token_s = now
                done.append(request)
        self._batch = []
        self.busy_until = None
        return done

    def fpm(self) -> ForwardPassMetrics:
        last = self.last if self.busy_until is not None else None
        n = len(self.queue)
        mean = self._queued_isl / n if n else 0.0
        return ForwardPassMetrics(
            worker_id=self.id,
            dp_rank=0,
            wall_time_s=last.wall_time_s if last else 0.0,
            scheduled=ScheduledRequestMetrics(
                num_prefill_requests=last.prefill_requests,
                sum_prefill_tokens=last.prefill_tokens,
                var_prefill_length=last.var_prefill_length,
                sum_prefill_kv_tokens=last.prefill_kv_tokens,
            )
            if last
            else ScheduledRequestMetrics(),
            queued=QueuedRequestMetrics(
                num_prefill_requests=n,
                sum_prefill_tokens=self.pending_tokens - (last.prefill_tokens if last else 0),
                var_prefill_length=max(0.0, self._queued_isl_sq / n - mean * mean) if n else 0.0,
            ),
        )


class DecodeEngine:
    """Continuous batching. A request is admitted when its whole KV need (prompt + output) fits
    in `max_kv_tokens` next to the admitted requests (no preemption) and the batch holds fewer
    than the truth's `max_num_seqs` (when set); until then it waits in the engine's queue, and
    that wait counts in its inter-token latency."""

    role = "decode"

    def __init__(self, engine_id: str, truth: TruthModel, on_fpm: FpmCallback | None = None) -> None:
        self.id = engine_id
        self.truth = truth
        self.on_fpm = on_fpm
        self.max_kv_tokens = truth.max_kv_tokens
        self.max_num_seqs = truth.max_num_seqs  # None: only the KV capacity limits the batch
        self.waiting: deque[SimRequest] = deque()
        self.waiting_kv = 0
        self.reserved_kv = 0
        self._active: list[tuple[int, int, SimRequest]] = []  # heap of (finish counter, id, request)
        self.counter = 0  # iterations done (S)
        self._ctx_base = 0  # A = Σ (isl + 1 - S0)
        self._ctx_sq_base = 0  # Σ (isl + 1 - S0)²
        self.segment_start_s = 0.0
        self.segment_iters = 0
        self.iteration_s = 0.0
        self.version = 0  # bumps whenever the scheduled end of the segment changes

    @property
    def batch_size(self) -> int:
        return len(self._active)

    @property
    def load(self) -> int:
        return self.reserved_kv + self.waiting_kv

    @property
    def empty(self) -> bool:
        return not self._active and not self.waiting

    @property
    def busy(self) -> bool:
        return self.segment_iters > 0

    def sum_context_tokens(self, counter: float | None = None) -> float:
        s = self.counter if counter is None else counter
        return self._ctx_base + len(self._active) * s

    def kv_usage(self) -> float:
        return self.sum_context_tokens() / self.max_kv_tokens

    def add(self, request: SimRequest) -> None:
        self.waiting.append(request)
        self.waiting_kv += request.kv_need

    def _admit(self, now: float) -> None:
        max_seqs = self.max_num_seqs
        while self.waiting:
            if max_seqs is not None and len(self._active) >= max_seqs:
                break
            request = self.waiting[0]
            need = request.kv_need
            if self.reserved_kv + need > self.max_kv_tokens and self._active:
                break
            self.waiting.popleft()
            self.waiting_kv -= need
            self.reserved_kv += need
            request.decode_start_s = now
            request.finish_counter = self.counter + request.osl - 1
            base = request.isl + 1 - self.counter
            self._ctx_base += base
            self._ctx_sq_base += base * base
            heapq.heappush(self._active, (request.finish_counter, request.id, request))

    def _plan(self, now: float) -> float | None:
        self.version += 1
        self.segment_start_s = now
        if not self._active:
            self.segment_iters = 0
            return None
        k = self._active[0][0] - self.counter
        mid = self.counter + k / 2
        self.segment_iters = k
        self.iteration_s = self.truth.decode_iteration_s(self.sum_context_tokens(mid), len(self._active))
        return now + k * self.iteration_s

    def start(self, now: float) -> float | None:
        """Admit what fits and plan the next segment if idle; its end time, or None."""
        if self.busy:
            return None
        self._admit(now)
        return self._plan(now)

    def join(self, now: float) -> float | None:
        """A request was added while busy: stop the segment at the next iteration boundary at or
        after `now`, admit, and plan again. The new end time, or None if the segment ends at
        `now` anyway (its end event will admit) or the batch is at `max_num_seqs` (the request
        waits for one to finish; the segment goes on unchanged)."""
        if not self.busy:
            return self.start(now)
        if self.max_num_seqs is not None and len(self._active) >= self.max_num_seqs:
            return None
        elapsed = now - self.segment_start_s
        done = int(elapsed / self.iteration_s)
        if done * self.iteration_s < elapsed - 1e-12:
            done += 1
        if done >= self.segment_iters:
            return None
        self._report(done)
        self.counter += done
        boundary = self.segment_start_s + done * self.iteration_s
        self.segment_iters = 0
        self._admit(boundary)
        return self._plan(boundary)

    def kill(self) -> list[SimRequest]:
        """Stop at once: the requests decoding or waiting, now cut off (a newer version makes
        the running segment's end event stale)."""
        held = [r for _, _, r in self._active] + list(self.waiting)
        self._active, self.waiting = [], deque()
        self.reserved_kv = self.waiting_kv = self._ctx_base = self._ctx_sq_base = 0
        self.segment_iters = 0
        self.version += 1
        return held

    def finish(self, now: float) -> tuple[list[SimRequest], float | None]:
        """The segment ended at `now`: the finished requests and the next segment's end."""
        self._report(self.segment_iters)
        self.counter += self.segment_iters
        self.segment_iters = 0
        done = []
        while self._active and self._active[0][0] <= self.counter:
            _, _, request = heapq.heappop(self._active)
            request.finish_s = now
            self.reserved_kv -= request.kv_need
            base = request.isl + 1 - (request.finish_counter - request.osl + 1)
            self._ctx_base -= base
            self._ctx_sq_base -= base * base
            done.append(request)
        self._admit(now)
        return done, self._plan(now)

    def _report(self, iterations: int) -> None:
        """One FPM record per iteration completed in this segment, as an engine reports each
        iteration once it has run."""
        if self.on_fpm is not None:
            for i in range(iterations):
                self.on_fpm(self.fpm(counter=self.counter + i))

    def iterations_between(self, start_s: float, end_s: float) -> int:
        if not self.busy or self.iteration_s <= 0:
            return 0
        return max(0, min(self.segment_iters, int((end_s - start_s) / self.iteration_s)))

    def fpm(self, counter: float | None = None) -> ForwardPassMetrics:
        n = len(self._active)
        s = self.counter if counter is None else counter
        total = self._ctx_base + n * s
        variance = 0.0
        if n:
            mean = total / n
            sq = self._ctx_sq_base + 2 * s * self._ctx_base + n * s * s
            variance = max(0.0, sq / n - mean * mean)
        waiting = [r.isl for r in self.waiting]
        return ForwardPassMetrics(
            worker_id=self.id,
            dp_rank=0,
            wall_time_s=self.iteration_s if self.busy else 0.0,
            scheduled=ScheduledRequestMetrics(
                num_decode_requests=n, sum_decode_kv_tokens=int(total), var_decode_kv_tokens=variance
            ),
            queued=QueuedRequestMetrics(
                num_decode_requests=len(waiting),
                sum_decode_kv_tokens=sum(waiting),
                var_decode_kv_tokens=_variance(waiting),
            ),
        )
