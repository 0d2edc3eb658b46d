"""One engine instance driven iteration by iteration while requests keep arriving: the incremental form
of :func:`fluidopt.engines.stepper.replay`, for a server that emulates the instance in real time.

The rules are the stepper's, line for line (prefill-first or mixed iterations, FCFS, KV blocks with the
watermark, preemption by recompute of the last-arrived running request); only the driving differs. The
stepper knows every arrival in advance; here the caller adds a request when it arrives
(:meth:`LiveEngine.add`) and asks for the next iteration (:meth:`LiveEngine.step`), which returns its
duration in model seconds and the requests whose token count changed. A server sleeps that duration
(divided by its speed-up), then streams the new tokens; requests that arrived meanwhile are added before
the next step, as the stepper admits every arrival at or before the start of an iteration. Fed the same
arrivals, the two give the same iteration times (tests/engines/test_live.py).

A prefix cache is optional and lives above this layer: ``LiveEngine(law, cfg, cache=...)`` takes any
object with the six calls of :class:`PrefixCacheHooks` (the server passes
:class:`fluidopt.serving.prefix.LivePrefixCache`, the simulator's own cache rules). With one, a prefill
computes only the uncached tokens (its time is the law's for them; its KV reservation, its admission and
its share of a prefill-first iteration's token budget stay the whole prompt, as the simulator reserves
the whole prompt); the blocks become reusable when the prefill completes, are held while the request
runs, and give way to the running requests' KV. Without one every number is as before.
"""

from __future__ import annotations

import heapq
import math
from bisect import insort
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fluidopt.calibration.timemodels import IterationLaw
from fluidopt.engines.stepper import EngineConfig


@dataclass
class Step:
    """One iteration: ``duration`` in model seconds; ``tokens``: request id -> tokens generated so far
    (only requests whose count changed); ``finished``: ids done at the end of the iteration; ``prefill``:
    whether it ran prompt tokens."""

    duration: float
    tokens: dict[int, int] = field(default_factory=dict)
    finished: list[int] = field(default_factory=list)
    prefill: bool = False


class PrefixCacheHooks(Protocol):
    """What the engine asks of a prefix cache (one instance's; KV amounts in tokens, requests by serial
    ``s`` = engine id + 1, registered in the engine's order)."""

    def add(self, blocks: Sequence[int]) -> int:
        """Register a new request's chained block ids; its serial."""

    def lookup(self, s: int, ptok: int, prompt: int, kv: int) -> tuple[int, int]:
        """s's prefill of ``ptok`` tokens starts while the running requests hold ``kv``: hold its cached run;
        (tokens to compute, cached prompt tokens)."""

    def done(self, s: int) -> None:
        """s's prefill completed: its blocks are cached from now on; it holds none."""

    def hold(self, s: int, kv: int, tokens: int) -> None:
        """s decodes, ``tokens`` of KV, beside ``kv`` of the others: it holds its cached run."""

    def release(self, s: int) -> None:
        """s's decode left (done or preempted)."""

    def trim(self, kv: int) -> None:
        """The running requests hold ``kv`` tokens now: unheld blocks give way."""


class LiveEngine:
    """One instance; requests get ids 0, 1, ... in the order they are added (that order is arrival order,
    which the preemption rule uses). ``cache``: an optional prefix cache (module docstring)."""

    def __init__(self, law: IterationLaw, cfg: EngineConfig, cache: PrefixCacheHooks | None = None) -> None:
        self.law, self.cfg = law, cfg
        self.cache = cache
        # vLLM's prefix-cache counters, in tokens: every lookup (a re-prefill after a preemption too)
        self.prefix_queries = self.prefix_hits = 0
        # cached prompt tokens of each request's first prefill (-1 before it starts): the simulator's count
        self.cached: list[int] = []
        self.bs = cfg.block_size
        total = cfg.kv_blocks
        self.total_blocks = total
        self.free = math.inf if total is None else int(total)
        self.wm = 0 if total is None else int(cfg.watermark * total)
        limit = cfg.max_model_len or math.inf
        if cfg.mode == "prefill-first":
            limit = min(limit, cfg.max_num_batched_tokens)
        self.limit = limit
        self.P: list[int] = []
        self.O: list[int] = []
        self.gen: list[int] = []
        self.version: list[int] = []
        self.ljoin: list[int] = []
        self.gjoin: list[int] = []
        self.done_prefill: list[int] = []
        self.preemptions: list[int] = []
        self.waiting: list[int] = []
        self.running: list[int] = []
        self.prefilling: list[int] = []
        self.bucket = [0] * self.bs
        self.finish_heap: list[tuple[int, int, int]] = []
        self.T = 0
        self.g = 0
        self.iterations = 0
        self.prefill_iterations = 0
        self.n_preemptions = 0

    # -- requests ---------------------------------------------------------------------------------
    def add(self, prompt: int, output: int, blocks: Sequence[int] = ()) -> int:
        """Queue a request (lengths in tokens, both >= 1); its id. ``blocks``: its prompt's chained block
        ids, for the prefix cache. A prompt longer than the instance takes raises ValueError (the stepper
        drops it; a server answers 400)."""
        if prompt < 1 or output < 1:
            raise ValueError("prompt and output lengths must be >= 1 token")
        if prompt > self.limit:
            raise ValueError(f"prompt of {prompt} tokens is longer than this engine takes ({self.limit})")
        r = len(self.P)
        if self.cache is not None and self.cache.add(blocks) != r + 1:
            raise RuntimeError("the prefix cache's serials are out of step with the engine's ids")
        self.cached.append(-1)
        self.P.append(int(prompt))
        self.O.append(int(output))
        for lst, v in ((self.gen, 0), (self.version, 0), (self.ljoin, 0), (self.gjoin, 0),
                       (self.done_prefill, 0), (self.preemptions, 0)):
            lst.append(v)
        self.waiting.append(r)
        return r

    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.prefilling)

    def generated(self, r: int) -> int:
        """Tokens request ``r`` has generated so far."""
        if r in self._running_set():
            return self.ljoin[r] + (self.g - self.gjoin[r]) - self.P[r]
        return self.gen[r]

    def _running_set(self) -> set[int]:
        return set(self.running)

    def kv_usage(self) -> float:
        """Share of the KV blocks in use (0 with an unlimited cache)."""
        if self.total_blocks in (None, 0):
            return 0.0
        return 1.0 - self.free / self.total_blocks

    def kv_tokens_used(self) -> int:
        """KV tokens the running and prefilling requests hold (0 with an unlimited cache)."""
        return 0 if self.total_blocks is None else (self.total_blocks - int(self.free)) * self.bs

    # -- the prefix cache ---------------------------------------------------------------------------
    def _lookup(self, r: int, L: int) -> int:
        """r's prefill of L tokens starts (before its KV is reserved): the tokens it computes."""
        if self.cache is None:
            return L
        work, hit = self.cache.lookup(r + 1, L, self.P[r], self.kv_tokens_used())
        self.prefix_queries += L
        self.prefix_hits += hit
        if self.cached[r] < 0:
            self.cached[r] = hit
        return work

    def _prefilled(self, r: int, step: Step) -> None:
        """r's prefill completed at the end of this iteration."""
        if self.cache is not None:
            self.cache.done(r + 1)
        self._emitted(r, step)

    # -- the stepper's rules ----------------------------------------------------------------------
    def _leave(self, r: int) -> None:
        if self.cache is not None:
            self.cache.release(r + 1)
        L = self.ljoin[r] + (self.g - self.gjoin[r])
        self.T -= L
        self.bucket[(self.ljoin[r] - self.gjoin[r]) % self.bs] -= 1
        self.free += -(-(L - 1) // self.bs)
        self.version[r] += 1

    def _join(self, r: int) -> None:
        L = self.P[r] + self.gen[r]
        self.ljoin[r], self.gjoin[r] = L, self.g
        self.T += L
        self.bucket[(L - self.g) % self.bs] += 1
        insort(self.running, r)
        heapq.heappush(self.finish_heap, (self.g + self.O[r] - self.gen[r], r, self.version[r]))
        if self.cache is not None:
            self.cache.hold(r + 1, self.kv_tokens_used() - L, L)

    def _emitted(self, r: int, step: Step) -> None:
        self.gen[r] += 1
        step.tokens[r] = self.gen[r]
        if self.gen[r] >= self.O[r]:
            step.finished.append(r)
            self.free += -(-(self.P[r] + self.gen[r] - 1) // self.bs)
        else:
            self._join(r)

    def _preempt(self, r: int) -> None:
        self.gen[r] = self.ljoin[r] + (self.g - self.gjoin[r]) - self.P[r]
        self.running.remove(r)
        self._leave(r)
        self.preemptions[r] += 1
        self.n_preemptions += 1
        self.waiting.insert(0, r)

    def _short_of_blocks(self) -> None:
        key = (1 - self.g) % self.bs
        running = self.running
        i = 0
        while i < len(running):
            r = running[i]
            while self.free < 1 and running[-1] != r:
                self._preempt(running[-1])
            if self.free < 1:
                self._preempt(r)
                break
            if (self.ljoin[r] - self.gjoin[r]) % self.bs == key:
                self.free -= 1
            i += 1

    def _decode_time(self, B: int) -> float:
        dec = self.law.decode
        a, b, c = dec.large if (dec.large is not None and B >= dec.threshold) else dec.small
        return a + b * self.T + c * B

    def _finish_decodes(self, step: Step) -> None:
        while self.finish_heap and self.finish_heap[0][0] <= self.g:
            _, r, v = heapq.heappop(self.finish_heap)
            if v != self.version[r]:
                continue
            self.gen[r] = self.O[r]
            step.tokens[r] = self.O[r]
            step.finished.append(r)
            self.running.remove(r)
            self._leave(r)

    def _fits(self, r: int, seqs: int) -> bool:
        need = -(-(self.P[r] + self.gen[r]) // self.bs)
        return self.free - need >= self.wm and seqs < self.cfg.max_num_seqs

    def _decoded(self, step: Step, decoders: list[int]) -> None:
        """Every request that decoded this iteration has one more token."""
        running = self._running_set()
        for r in decoders:
            if r in running:
                step.tokens[r] = self.ljoin[r] + (self.g - self.gjoin[r]) - self.P[r]

    def step(self) -> Step | None:
        """Run the next iteration (None when there is nothing to run)."""
        cfg, bs, pf = self.cfg, self.bs, self.law.prefill
        if cfg.mode == "prefill-first":
            batch: list[tuple[int, int]] = []
            tokens = 0
            while self.waiting:
                r = self.waiting[0]
                L = self.P[r] + self.gen[r]
                if tokens + L > cfg.max_num_batched_tokens or not self._fits(r, len(self.running) + len(batch)):
                    break
                self.waiting.pop(0)
                work = self._lookup(r, L)
                self.free -= -(-L // bs)
                batch.append((r, work))
                tokens += L
            if batch:
                s = s2 = 0
                for r, work in batch:
                    L = self.P[r] + self.gen[r]
                    s += work
                    s2 += L * L - (L - work) * (L - work)  # the new tokens attend to the cached ones too
                step = Step(pf.a + pf.b * s + pf.c * s2, prefill=True)
                self.iterations += 1
                self.prefill_iterations += 1
                for r, _ in batch:
                    self._prefilled(r, step)
                self._trim()
                return step
            if not self.running:
                return None
            if self.free - self.bucket[(1 - self.g) % bs] < 1:
                self._short_of_blocks()
            else:
                self.free -= self.bucket[(1 - self.g) % bs]
            if not self.running:
                return Step(0.0)  # everything was preempted: prefill again next
            decoders = list(self.running)
            step = Step(self._decode_time(len(self.running)))
            self.T += len(self.running)
            self.g += 1
            self.iterations += 1
            self._decoded(step, decoders)
            self._finish_decodes(step)
            self._trim()
            return step
        budget = cfg.max_num_batched_tokens - (len(self.running) if cfg.budget_counts_decodes else 0)
        cap = cfg.prefills_per_iteration or math.inf
        while self.waiting and len(self.prefilling) < cap and self._fits(self.waiting[0], len(self.running) + len(self.prefilling)):
            r = self.waiting.pop(0)
            L = self.P[r] + self.gen[r]
            self.done_prefill[r] = L - self._lookup(r, L)  # the cached tokens are in the KV already
            self.free -= -(-L // bs)
            self.prefilling.append(r)
        chunks: list[tuple[int, int]] = []
        tokens = 0
        att = 0
        for r in self.prefilling[: cap if cap != math.inf else len(self.prefilling)]:
            if budget <= 0:
                break
            o = self.done_prefill[r]
            m = min(self.P[r] + self.gen[r] - o, budget)
            chunks.append((r, m))
            tokens += m
            att += (o + m) * (o + m) - o * o
            budget -= m
        if self.running and self.free - self.bucket[(1 - self.g) % bs] < 1:
            self._short_of_blocks()
        elif self.running:
            self.free -= self.bucket[(1 - self.g) % bs]
        B = len(self.running)
        if tokens == 0 and B == 0:
            return None
        if tokens > 0:
            dt = pf.a + pf.b * tokens + pf.c * att
            if B:
                dec = self.law.decode
                a, b, c = dec.large if (dec.large is not None and B >= dec.threshold) else dec.small
                dt += b * self.T + c * B
            self.prefill_iterations += 1
        else:
            dt = self._decode_time(B)
        step = Step(dt, prefill=tokens > 0)
        decoders = list(self.running)
        self.T += B
        self.g += 1
        self.iterations += 1
        self._decoded(step, decoders)
        self._finish_decodes(step)
        for r, m in chunks:
            self.done_prefill[r] += m
            if self.done_prefill[r] == self.P[r] + self.gen[r]:
                self.prefilling.remove(r)
                self._prefilled(r, step)
        self._trim()
        return step

    def _trim(self) -> None:
        """The end of an iteration, where KV peaks: cached blocks give way (the simulator trims at each
        boundary)."""
        if self.cache is not None:
            self.cache.trim(self.kv_tokens_used())
