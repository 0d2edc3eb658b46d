"""One engine instance, iteration by iteration, as a real serving engine schedules it.

The stepper replays requests (arrival in s, prompt and output lengths in tokens) through one instance
whose iteration times come from an :class:`~fluidopt.calibration.timemodels.IterationLaw`, and records
per request the time of the first token, of the last token and how often it was preempted. Two
iteration shapes cover the three engines (:mod:`fluidopt.engines` holds their settings):

* **prefill-first** (vLLM before chunked prefill): when the head of the FCFS waiting queue fits, an
  iteration prefills whole waiting prompts (up to ``max_num_batched_tokens`` tokens and
  ``max_num_seqs`` running requests, KV blocks for each, with vLLM's 1% watermark) and emits each one's
  next token; otherwise it decodes every running request;
* **mixed** (chunked prefill, and the paper's one prefill plus decodes): every iteration decodes every
  running request and spends a token budget on prompt chunks, partial prompts first.

KV memory is counted in blocks of ``block_size`` tokens: a request holding ``L`` tokens whose newest
token's KV is not yet written holds ``ceil((L - 1) / block_size)`` blocks and needs one more when a
decode step starts with ``L = 1 (mod block_size)``. When a decode finds no free block, the running
request that arrived last is preempted by recompute (its blocks freed, put back at the head of the
queue; its prompt and the tokens it generated are prefilled again), as vLLM does.

Speed: a decode step is O(1): the running requests are grouped by ``(L - step) mod block_size`` so the
blocks a step needs are one lookup, and completions come off a heap. Only a step short of blocks walks
the running list.
"""

from __future__ import annotations

import heapq
import math
from bisect import insort
from dataclasses import dataclass

import numpy as np

from fluidopt.calibration.timemodels import IterationLaw


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one instance. ``mode``: ``prefill-first`` or ``mixed``. ``max_num_batched_tokens``:
    prompt tokens per prefill-first iteration, or the token budget of a mixed iteration.
    ``budget_counts_decodes``: a mixed iteration's decodes take one token of the budget each (Sarathi,
    vLLM v1) or none (the paper's chunk C). ``prefills_per_iteration``: prompts a mixed iteration may
    chunk (None: any). ``kv_blocks``: KV cache in blocks of ``block_size`` tokens (None: unlimited).
    ``watermark``: share of the blocks a new prompt must leave free (vLLM: 0.01). ``max_model_len``:
    longer prompts are rejected, never run (tokens). ``max_paddings``: prefill-first only; None (the
    default): a batch costs its prompts' own lengths; otherwise every prompt of a batch is padded to the
    longest, costs that length, and counts so against ``max_num_batched_tokens``, and a batch takes at
    most this many pad tokens (vLLM 0.2-0.3's rule, 256 there)."""

    mode: str
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_blocks: int | None
    block_size: int = 16
    watermark: float = 0.01
    budget_counts_decodes: bool = True
    prefills_per_iteration: int | None = None
    max_model_len: int | None = None
    max_paddings: int | None = None


@dataclass(frozen=True)
class Replay:
    """Per-request outcome, arrays in the order of the input. Times in seconds from the run's start;
    ``ttft``/``e2e`` in s; ``tpot``: (last token - first token) / (output - 1) s (0 for one token), the
    measured data's definition; NaN for a request the engine rejected (prompt longer than it takes)."""

    arrival: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    preemptions: np.ndarray
    output: np.ndarray
    iterations: int
    prefill_iterations: int

    @property
    def ttft(self) -> np.ndarray:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> np.ndarray:
        return self.finish - self.arrival

    @property
    def tpot(self) -> np.ndarray:
        d = np.maximum(self.output - 1, 1)
        return np.where(self.output > 1, (self.finish - self.first_token) / d, 0.0)

    def attainment(self, ttft_slo: float, tpot_slo: float) -> float:
        """Share of requests with TTFT < ``ttft_slo`` and TPOT < ``tpot_slo`` (s), DistServe's criterion
        (:func:`attained`)."""
        return attained(self.ttft, self.tpot, ttft_slo, tpot_slo)[0]


def attained(ttft: np.ndarray, tpot: np.ndarray, ttft_slo: float, tpot_slo: float) -> tuple[float, float, float]:
    """DistServe's SLO attainment: the shares of requests with TTFT < ``ttft_slo`` and TPOT < ``tpot_slo``,
    with TTFT alone, and with TPOT alone (s). A one-token request has TPOT 0 (DistServe's
    ``tpot = 0 if output_len == 1``; :attr:`Replay.tpot` gives 0), so it attains on TTFT alone; a request
    never served (rejected: NaN times) misses both."""
    with np.errstate(invalid="ignore"):
        ok_t = np.asarray(ttft) < ttft_slo  # NaN compares False: a rejected request misses
        ok_d = np.asarray(tpot) < tpot_slo
    if ok_t.size == 0:
        return math.nan, math.nan, math.nan
    return float(np.mean(ok_t & ok_d)), float(np.mean(ok_t)), float(np.mean(ok_d))


def checked_requests(arrival, prompt, output) -> tuple[np.ndarray, list[int], list[int]]:
    """A replay's requests as (arrival times in s, prompt tokens, output tokens); ValueError unless the
    arrivals are sorted and every length is at least one token."""
    arr = np.asarray(arrival, dtype=float)
    P = [int(x) for x in prompt]
    O = [int(x) for x in output]
    if len(arr) and np.any(np.diff(arr) < 0):
        raise ValueError("replay: arrivals must be sorted")
    if any(p < 1 for p in P) or any(o < 1 for o in O):
        raise ValueError("replay: prompt and output lengths must be >= 1 token")
    return arr, P, O


def replay(law: IterationLaw, cfg: EngineConfig, arrival, prompt, output) -> Replay:
    """Run the requests through one instance; see the module docstring for the rules."""
    arr, P, O = checked_requests(arrival, prompt, output)
    n = len(arr)
    bs = cfg.block_size
    total = cfg.kv_blocks
    free = math.inf if total is None else int(total)
    wm = 0 if total is None else int(cfg.watermark * total)
    limit = cfg.max_model_len or math.inf
    if cfg.mode == "prefill-first":
        limit = min(limit, cfg.max_num_batched_tokens)

    gen = [0] * n  # tokens generated so far
    first = np.full(n, np.nan)
    done = np.full(n, np.nan)
    pre = np.zeros(n, dtype=np.int64)
    version = [0] * n
    ljoin = [0] * n  # length L (prompt + generated) when it joined the decodes
    gjoin = [0] * n  # decode-step counter then
    done_prefill = [0] * n  # mixed mode: prompt tokens (of the current prefill) already in the cache

    waiting: list[int] = []  # FCFS; preempted requests go back to its head
    running: list[int] = []  # decoding, sorted by arrival (the victim of a preemption is the last)
    prefilling: list[int] = []  # mixed mode: admitted, prompt partly cached
    bucket = [0] * bs
    finish_heap: list[tuple[int, int, int]] = []
    T = 0  # context tokens of the running requests
    g = 0  # decode steps run
    now = 0.0
    nxt = 0
    iters = pre_iters = 0
    dec = law.decode
    pf = law.prefill
    small, large, thr = dec.small, dec.large, dec.threshold

    def blocks_held(r: int) -> int:
        L = ljoin[r] + (g - gjoin[r])
        return -(-(L - 1) // bs)

    def leave(r: int) -> None:
        nonlocal T, free
        L = ljoin[r] + (g - gjoin[r])
        T -= L
        bucket[(ljoin[r] - gjoin[r]) % bs] -= 1
        free += -(-(L - 1) // bs)
        version[r] += 1

    def join(r: int) -> None:
        nonlocal T
        L = P[r] + gen[r]
        ljoin[r], gjoin[r] = L, g
        T += L
        bucket[(L - g) % bs] += 1
        insort(running, r)
        heapq.heappush(finish_heap, (g + O[r] - gen[r], r, version[r]))

    def emitted(r: int) -> None:
        """The request got a token at ``now`` from a prefill: first token, finished, or on to decode."""
        nonlocal free
        gen[r] += 1
        if gen[r] == 1 or math.isnan(first[r]):
            first[r] = now
        if gen[r] >= O[r]:
            done[r] = now
            free += -(-(P[r] + gen[r] - 1) // bs)
        else:
            join(r)

    def preempt(r: int) -> None:
        gen[r] = ljoin[r] + (g - gjoin[r]) - P[r]
        running.remove(r)
        leave(r)
        pre[r] += 1
        waiting.insert(0, r)

    def short_of_blocks() -> None:
        """vLLM 0.2's order: each running request in turn (earliest arrival first) needs a free block
        (``can_append_slot``: one free block per sequence, whether or not it starts a new block), taken
        when it starts one; while there is none, the last-arrived running request is preempted, or this
        one when it is the last."""
        nonlocal free
        key = (1 - g) % bs
        i = 0
        while i < len(running):
            r = running[i]
            while free < 1 and running[-1] != r:
                preempt(running[-1])
            if free < 1:
                preempt(r)
                break
            if (ljoin[r] - gjoin[r]) % bs == key:
                free -= 1
            i += 1

    def decode_time(B: int) -> float:
        a, b, c = large if (large is not None and B >= thr) else small
        return a + b * T + c * B

    def finish_decodes() -> None:
        while finish_heap and finish_heap[0][0] <= g:
            _, r, v = heapq.heappop(finish_heap)
            if v != version[r]:
                continue
            gen[r] = O[r]
            done[r] = now
            running.remove(r)
            leave(r)

    def fits(r: int, seqs: int) -> bool:
        need = -(-(P[r] + gen[r]) // bs)
        return free - need >= wm and seqs < cfg.max_num_seqs

    while True:
        while nxt < n and arr[nxt] <= now:
            if P[nxt] > limit:
                nxt += 1  # rejected: never runs (vLLM logs it and drops it)
                continue
            waiting.append(nxt)
            nxt += 1
        if cfg.mode == "prefill-first":
            batch: list[int] = []
            tokens = longest = 0
            while waiting:
                r = waiting[0]
                L = P[r] + gen[r]
                if cfg.max_paddings is None:
                    if tokens + L > cfg.max_num_batched_tokens or not fits(r, len(running) + len(batch)):
                        break
                else:
                    padded = (len(batch) + 1) * max(longest, L)
                    if (padded > cfg.max_num_batched_tokens or padded - tokens - L > cfg.max_paddings
                            or not fits(r, len(running) + len(batch))):
                        break
                    longest = max(longest, L)
                waiting.pop(0)
                free -= -(-L // bs)
                batch.append(r)
                tokens += L
            if batch:
                s = s2 = 0
                for r in batch:
                    L = longest or P[r] + gen[r]
                    s += L
                    s2 += L * L
                now += pf.a + pf.b * s + pf.c * s2
                iters += 1
                pre_iters += 1
                for r in batch:
                    emitted(r)
                continue
            if running:
                if free - bucket[(1 - g) % bs] < 1:
                    short_of_blocks()
                else:
                    free -= bucket[(1 - g) % bs]
                if running:
                    now += decode_time(len(running))
                    T += len(running)
                    g += 1
                    iters += 1
                    finish_decodes()
                continue
        else:
            budget = cfg.max_num_batched_tokens - (len(running) if cfg.budget_counts_decodes else 0)
            cap = cfg.prefills_per_iteration or math.inf
            while waiting and len(prefilling) < cap and fits(waiting[0], len(running) + len(prefilling)):
                r = waiting.pop(0)
                free -= -(-(P[r] + gen[r]) // bs)
                done_prefill[r] = 0
                prefilling.append(r)
            chunks: list[tuple[int, int]] = []
            tokens = 0
            att = 0
            for r in prefilling[: cap if cap != math.inf else len(prefilling)]:
                if budget <= 0:
                    break
                o = done_prefill[r]
                m = min(P[r] + gen[r] - o, budget)
                chunks.append((r, m))
                tokens += m
                att += (o + m) * (o + m) - o * o
                budget -= m
            if running and free - bucket[(1 - g) % bs] < 1:
                short_of_blocks()
            elif running:
                free -= bucket[(1 - g) % bs]
            B = len(running)
            if tokens == 0 and B == 0:
                if nxt >= n:
                    break
                now = max(now, arr[nxt])
                continue
            if tokens > 0:
                dt = pf.a + pf.b * tokens + pf.c * att
                if B:
                    a, b, c = large if (large is not None and B >= thr) else small
                    dt += b * T + c * B
                pre_iters += 1
            else:
                dt = decode_time(B)
            now += dt
            T += B
            g += 1
            iters += 1
            finish_decodes()
            for r, m in chunks:
                done_prefill[r] += m
                if done_prefill[r] == P[r] + gen[r]:
                    prefilling.remove(r)
                    emitted(r)
            continue
        if nxt >= n:
            break
        now = max(now, arr[nxt])  # idle until the next arrival
    return Replay(arr, first, done, pre, np.asarray(O, dtype=np.int64), iters, pre_iters)
