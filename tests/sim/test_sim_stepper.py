"""Tokens-mode timing against an independent iteration-by-iteration reference stepper.

The event-driven engine never steps iteration by iteration: it keeps an anchor per GPU and computes
boundary times in closed form. ``_Stepper`` below is a second implementation of the same physics,
written only from docs/simulator.md (section 1.1, "Tokens mode, boundary by boundary", and the
instance scheduler's rules there) and from the round-robin controller it drives
(``fluidopt.control.instance``): it advances every GPU one iteration at a time and processes the
global events in time order (at one instant: arrivals in trace order, then GPU boundaries in GPU
order). It covers n GPUs with their own FCFS instance queues and round-robin routing, B slots, one
prefill at a time per GPU, chunked and whole-prompt prefills (stalled decodes), the KV cache (capacity,
watermark admission, recompute preemption of the youngest, drops) and the KV time term.

A hypothesis property test compares every request's first prefill completion (arrival + ttft),
completion time, outcome and preemption count with the engine's records, to 1e-9. Two timing
families are drawn: "exact" parameters (binary fractions of a second, so that every boundary time is
exact in floating point in both implementations, and arrivals placed exactly on boundaries of their
GPU, the first to the 40th after the previous arrival, as well as mid-iteration) and generic floats (arrivals
mid-iteration; a draw whose arrival lies within 1e-9 s of a boundary of its GPU, or on it, is
rejected, since the two implementations may round such a tie differently).
"""

from __future__ import annotations

import math
import os
import tempfile
import warnings

import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from fluidopt.control.instance import RoundRobin
from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.sim.api import simulate
from fluidopt.workloads import TraceWarning, TraceWorkload

U = 1.0 / 1024  # the time unit of the "exact" draws: every parameter is a small multiple of U / 256
HORIZON = 1.0e4
TOL = 1e-9


# ------------------------------------------------------------------------------------------------
# The reference stepper
# ------------------------------------------------------------------------------------------------


class _Req:
    __slots__ = ("rid", "arrival", "prompt", "output", "cls", "gen", "preempt", "first", "end", "outcome", "gpu")

    def __init__(self, rid, arrival, prompt, output, cls):
        self.rid = rid  # record id: arrival serial number, 1, 2, ...
        self.arrival = arrival
        self.prompt = prompt
        self.output = output
        self.cls = cls
        self.gen = 0  # output tokens generated so far (kept across preemptions)
        self.preempt = 0  # evictions (the one that drops a request included)
        self.first = math.nan  # time of the first prefill completion
        self.end = math.nan
        self.outcome = "in_system"
        self.gpu = -1


class _Gpu:
    def __init__(self, index):
        self.index = index
        self.queue: list[_Req] = []  # the instance's FCFS queue
        self.prefill: _Req | None = None  # assigned prefill (running, or waiting for the next boundary)
        self.pre_size = 0  # P' of that prefill
        self.chunks_left = 0  # iterations it still needs
        self.pre_active = False  # it takes part in the current iteration
        self.decodes: list[_Req] = []  # decodes (they only ever start at a boundary, so all run)
        self.busy = False  # iterating (idle GPUs have no boundaries)
        self.t_next = math.inf  # end of the current iteration
        self.stall = False  # the current iteration is a whole-prompt prefill: decodes stall
        self.growing = False  # between boundaries, running decodes are producing a token
        self.ends: list[float] = []  # every computed iteration end (for the tie check)


class _Stepper:
    """Iteration-by-iteration simulation of round robin over instance-local continuous batching."""

    def __init__(self, *, n, batch, alpha, beta, tau_solo, chunk, kv_capacity, kap, chunked, watermark, law=None):
        self.n = n
        self.B = batch
        self.alpha = alpha
        self.beta = beta
        self.tau_solo = tau_solo
        self.C = chunk
        self.K = kv_capacity
        self.kap = kap
        self.chunked = chunked
        self.w = watermark
        self.law = law  # an IterationLaw (docs/simulator.md section 1.3) in place of the straight line
        self.gpus = [_Gpu(g) for g in range(n)]
        self.rr = 0
        self.now = 0.0
        self.seen: set[str] = set()  # what happened (for the property test's statistics)

    # -- KV and admission (the instance scheduler's rules) ---------------------------------------
    def kv_used(self, g: _Gpu) -> int:
        """The cache as the engine knows it now: decodes' context (plus the token each running
        decode is producing, between boundaries) and the assigned prefill's reservation."""
        kv = sum(r.prompt + r.gen for r in g.decodes)
        if g.growing:
            kv += len(g.decodes)
        if g.prefill is not None:
            kv += g.pre_size
        return kv

    def admit(self, g: _Gpu, t: float) -> None:
        if g.prefill is not None:
            return
        if self.B - len(g.decodes) <= 0:
            return
        if not g.queue:
            return
        r = g.queue[0]
        need = r.prompt + r.gen
        if self.K is not None:
            free = self.K - self.kv_used(g)
            holds = bool(g.decodes)
            if free - self.w * self.K < need and holds:
                return
            if free < need:
                return
        g.queue.pop(0)
        g.prefill = r
        g.pre_size = need
        g.chunks_left = -(-need // self.C) if self.chunked else 1
        g.pre_active = False
        r.gpu = g.index
        if g.decodes:
            self.seen.add("prefill admitted beside decodes" + (" (they stall)" if not self.chunked else ""))
        if not g.busy:  # an idle GPU starts at once: t is a boundary
            self.start_iteration(g, t)
        # else it joins at the next boundary (or at this one, when called during a boundary)

    # -- iterations ------------------------------------------------------------------------------
    def start_iteration(self, g: _Gpu, t: float) -> None:
        if g.prefill is None and not g.decodes:
            g.busy = False
            g.t_next = math.inf
            g.stall = g.growing = g.pre_active = False
            return
        g.busy = True
        g.growing = False
        kv = self.kv_used(g)  # resident at the start, before the iteration's own growth
        if self.law is not None:
            g.pre_active = g.prefill is not None
            g.stall = g.pre_active and not self.chunked
            g.t_next = t + self.law_iteration(g)
            g.ends.append(g.t_next)
            g.growing = bool(g.decodes) and not g.stall
            return
        if g.prefill is not None:
            g.pre_active = True
            base = self.alpha + self.beta * self.C if self.chunked else self.alpha + self.beta * g.pre_size
            g.stall = not self.chunked
        else:
            base = self.tau_solo
            g.stall = False
        g.t_next = t + (base + self.kap * kv)
        g.ends.append(g.t_next)
        g.growing = bool(g.decodes) and not g.stall

    def law_iteration(self, g: _Gpu) -> float:
        """Section 1.3: a chunk of l tokens over s already prefilled, beside B decodes holding T tokens, takes
        the law's mixed time; a whole prompt its prefill time (the decodes stall); decodes alone the decode law."""
        T = sum(r.prompt + r.gen for r in g.decodes)
        if g.prefill is None:
            return self.law.decode_time(T, len(g.decodes))
        if not self.chunked:
            return self.law.prefill_time([g.pre_size])
        n = -(-g.pre_size // self.C)
        s = (n - g.chunks_left) * self.C
        ln = min(self.C, g.pre_size - s)
        return self.law.mixed(ln, (s + ln) ** 2 - s ** 2, T, len(g.decodes))

    def boundary(self, g: _Gpu, t: float) -> None:
        # the iteration's own work
        g.growing = False
        if not g.stall:
            for r in g.decodes:
                r.gen += 1
        if g.pre_active:
            g.chunks_left -= 1
        # 1. finished decodes leave one by one (then on_slot_freed -> admit)
        done = [r for r in g.decodes if r.gen == r.output]
        if done and g.prefill is not None and not g.pre_active and not self.chunked:
            self.seen.add("decode ends where a whole-prompt prefill joins")
        for r in done:
            g.decodes.remove(r)
            r.end = t
            r.outcome = "completed"
            self.admit(g, t)
        # 2. the prefill whose last chunk ends here completes; it decodes on its own GPU at once
        if g.pre_active and g.chunks_left == 0:
            r = g.prefill
            g.prefill = None
            g.pre_active = False
            if math.isnan(r.first):
                r.first = t
            g.decodes.append(r)
            self.admit(g, t)
        # 3. KV overflow (unless a whole-prompt prefill stalls the next iteration)
        evicted = False
        if self.K is not None and not (g.prefill is not None and not self.chunked):
            while self.kv_used(g) + len(g.decodes) > self.K:
                evicted = True
                running = g.decodes + ([g.prefill] if g.prefill is not None else [])
                v = max(running, key=lambda r: (r.arrival, r.rid))
                if v is g.prefill:
                    g.prefill = None
                    g.pre_active = False
                    self.seen.add("eviction of a prefill")
                else:
                    g.decodes.remove(v)
                    self.seen.add("eviction of a decode")
                v.preempt += 1
                if v.prompt + v.gen + 1 > self.K:
                    v.outcome = "dropped"
                    v.end = t
                    self.seen.add("drop by eviction")
                else:
                    g.queue.insert(0, v)  # front of its instance queue; no admission now ...
            if evicted and g.prefill is None and not g.decodes:
                self.admit(g, t)  # ... unless the evictions emptied the GPU
        # 4. the next iteration
        self.start_iteration(g, t)

    # -- arrivals and the event loop -------------------------------------------------------------
    def arrive(self, r: _Req, t: float) -> None:
        if self.K is not None and r.prompt + 1 > self.K:
            r.outcome = "dropped"
            r.end = t
            self.seen.add("drop on arrival")
            return
        g = self.gpus[self.rr]
        self.rr = self.rr + 1 if self.rr + 1 < self.n else 0
        g.queue.append(r)
        self.admit(g, t)

    def run(self, specs):
        """``specs``: one (timing, prompt, output, cls) per request, in trace order. ``timing`` is
        ("gap", s): s seconds after the previous arrival (after 0 for the first), or
        ("bnd", m, s): exactly at the m-th boundary (m >= 1) of the GPU it will be routed to, counted
        from the previous arrival (s > 0 seconds after the then current time if that GPU goes idle
        first: the boundary that idled it has been processed, and an arrival at its instant would have
        come before it).
        Returns (requests, arrival times, the smallest distance between an arrival and an
        iteration end of its GPU)."""
        reqs: list[_Req] = []
        times: list[float] = []
        targets: list[int] = []
        prev = 0.0
        last_b = -math.inf  # time of the last boundary processed
        i = 0
        pending = None  # the next arrival: [time or None, gpu, boundaries to let pass, fallback gap]
        while True:
            if pending is None and i < len(specs):
                timing = specs[i][0]
                if timing[0] == "gap":
                    pending = [prev + timing[1], -1, 0, 0.0]
                else:
                    pending = [None, self.rr, timing[1] - 1, timing[2]]
            if pending is not None and pending[0] is None:
                g = self.gpus[pending[1]]
                if not g.busy:
                    pending[0] = self.now + pending[3]  # fallback > 0: after any boundary at now
                elif pending[2] == 0:
                    pending[0] = g.t_next
            ta = math.inf if pending is None or pending[0] is None else pending[0]
            tb = min(g.t_next for g in self.gpus)
            if pending is None and tb == math.inf:
                break
            if ta <= tb:
                t = ta
                # same instant: arrivals before boundaries, so none may come after a boundary at t
                assert t > last_b, f"arrival {i + 1} at {t!r} after a boundary at {last_b!r}"
                self.now = t
                p, o, c = specs[i][1:]
                r = _Req(i + 1, t, p, o, c)
                reqs.append(r)
                times.append(t)
                targets.append(-1 if self.K is not None and p + 1 > self.K else self.rr)
                if targets[-1] >= 0 and t == self.gpus[targets[-1]].t_next:
                    self.seen.add("arrival exactly on a boundary of its GPU")
                self.arrive(r, t)
                prev = t
                pending = None
                i += 1
            else:
                g = next(g for g in self.gpus if g.t_next == tb)
                self.now = last_b = tb
                self.boundary(g, tb)
                if pending is not None and pending[0] is None and g.index == pending[1] and pending[2] > 0:
                    pending[2] -= 1
        gap = math.inf
        for t, h in zip(times, targets):
            if h >= 0:
                for e in self.gpus[h].ends:
                    gap = min(gap, abs(e - t))
        if any(r.outcome == "in_system" for r in reqs):
            self.seen.add("requests left waiting at the end")
        return reqs, times, gap


# ------------------------------------------------------------------------------------------------
# Running both
# ------------------------------------------------------------------------------------------------


def _scenario(p) -> Scenario:
    gpu = GPUProfile(alpha=p["alpha"], beta=p["beta"], tau_solo=p["tau_solo"], chunk=p["chunk"], batch=p["batch"],
                     kv_capacity=p["kv"], kv_time_per_token=p["kap"], timemodel=p.get("law"))
    classes = tuple(RequestClass(f"c{j}", prompt=20, decode=5, rate=1.0, patience=0.0) for j in range(p["classes"]))
    return Scenario(gpu=gpu, gpus=p["n"], classes=classes, prefill_price=1.0, decode_price=1.0)


def _stepper(p, specs):
    s = _Stepper(n=p["n"], batch=p["batch"], alpha=p["alpha"], beta=p["beta"], tau_solo=p["tau_solo"],
                 chunk=p["chunk"], kv_capacity=p["kv"], kap=p["kap"], chunked=p["chunked"], watermark=p["w"],
                 law=p.get("law"))
    reqs, times, gap = s.run(specs)
    return reqs, times, gap, s.seen


def _engine_records(p, rows) -> pd.DataFrame:
    sc = _scenario(p)
    names = sc.class_names
    wl = TraceWorkload(pd.DataFrame(rows, columns=["time", "prompt", "output", "cls"]), names)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rec.csv")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            warnings.simplefilter("ignore", RuntimeWarning)  # "auto" falls back to Python on an edited engine
            simulate(sc, RoundRobin(chunked=p["chunked"], kv_watermark=p["w"]), horizon=HORIZON, service="tokens",
                     workload=wl, records=path, batches=2, check=True)
        return pd.read_csv(path).sort_values("id").reset_index(drop=True)


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= TOL * max(1.0, abs(a), abs(b))


def _compare(p, specs, *, exact=True, stats=False):
    """Run the stepper and the engine on the same trace; return the stepper's requests."""
    reqs, times, gap, seen = _stepper(p, specs)
    if not exact:
        # generic floats: an arrival within 1e-9 s of a boundary of its GPU (or on it, which is exact here
        # but may be an ulp off in the engine's closed-form times) is a tie that rounding decides
        assume(gap > 1e-9)
    if stats:
        for what in sorted(seen):
            event(what)
    rows = [(t, s[1], s[2], s[3]) for t, s in zip(times, specs)]
    rec = _engine_records(p, rows)
    assert rec.id.tolist() == list(range(1, len(reqs) + 1))
    assert rec["class"].tolist() == [f"c{r.cls}" for r in reqs]
    assert all(_close(a, t) for a, t in zip(rec.arrival.tolist(), times))  # the CSV keeps ~15 digits
    bad = []
    for r, e in zip(reqs, rec.itertuples(index=False)):
        first = e.arrival + e.ttft
        if not (e.outcome == r.outcome and int(e.preemptions) == r.preempt and _close(first, r.first)
                and _close(float(e.end), r.end)):
            bad.append(f"id {r.rid} (arrival {r.arrival!r}, P={r.prompt}, D={r.output}): stepper first={r.first!r} "
                       f"end={r.end!r} {r.outcome} preempt={r.preempt}; engine first={first!r} end={e.end!r} "
                       f"{e.outcome} preempt={e.preemptions}")
    assert not bad, f"params {p}\ntrace {rows}\n" + "\n".join(bad)
    return reqs


def _params(**kw):
    p = dict(n=1, classes=1, batch=8, chunk=256, alpha=0.017, beta=3.2e-4, tau_solo=0.02, kv=None, kap=0.0,
             chunked=False, w=0.01)
    p.update(kw)
    return p


def _gaps(rows):
    """(time, prompt, output, cls) rows -> gap specs."""
    out, prev = [], 0.0
    for t, pr, o, c in rows:
        out.append((("gap", t - prev), pr, o, c))
        prev = t
    return out


# ------------------------------------------------------------------------------------------------
# Hand-checked cases
# ------------------------------------------------------------------------------------------------


def test_regression_decode_ending_where_whole_prompt_prefill_joins():
    """The engine's regression case: A (P=100, D=2) at 0, B (P=1000, D=1) at 0.075 join at 0.089, where
    A's last decode ends: A completes at 0.089 (not after B's prefill), B's prefill ends 0.426, B 0.446."""
    p = _params()
    specs = _gaps([(0.0, 100, 2, 0), (0.075, 1000, 1, 0)])
    reqs = _compare(p, specs)
    assert [r.first for r in reqs] == pytest.approx([0.049, 0.426], abs=1e-12)
    assert [r.end for r in reqs] == pytest.approx([0.089, 0.446], abs=1e-12)


def test_regression_with_kv_time_term():
    # the same with 1e-4 s per resident token; B joins where A's last decode ends, timed without A's cache
    p = _params(kap=1e-4)
    reqs = _compare(p, _gaps([(0.0, 100, 2, 0), (0.095, 1000, 1, 0)]))
    a2 = 0.059 + 0.02 + 0.0100 + 0.02 + 0.0101
    assert reqs[0].end == pytest.approx(a2, abs=1e-12)
    assert reqs[1].first == pytest.approx(a2 + 0.017 + 0.32 + 0.1, abs=1e-12)


def test_hand_timeline_arrival_on_boundaries():
    """Exact binary fractions: tau_mix = 2U + 4 * U/2 = 4U, tau_solo = 2U; one GPU, chunked, C = 4, B = 2.

    A (P=8, D=2) at 0: chunks end 4U and 8U (first 8U). B (P=4, D=1) arrives exactly at 8U, where A's
    prefill ends: the GPU still looks busy (arrivals come before the boundary), B queues and is
    admitted in that boundary's on_slot_freed, joining at 8U: B's chunk 8U -> 12U is also A's first
    decode iteration. Solo 12U -> 14U: A's second token and B's only one: both end at 14U. C (P=1, D=1)
    arrives exactly at 14U: both slots are still held, it queues, and is admitted after A leaves
    (step 1): its chunk 14U -> 18U, its decode to 20U."""
    p = _params(alpha=2 * U, beta=U / 2, chunk=4, tau_solo=2 * U, batch=2, chunked=True, w=0.0)
    reqs = _compare(p, _gaps([(0.0, 8, 2, 0), (8 * U, 4, 1, 0), (14 * U, 1, 1, 0)]))
    assert [r.first for r in reqs] == [8 * U, 12 * U, 18 * U]
    assert [r.end for r in reqs] == [14 * U, 14 * U, 20 * U]


def test_hand_timeline_kv_preemption_and_drop():
    """K = 12, watermark 0, one GPU, chunked, C = 8, tau_mix = tau_solo = U, B = 4.

    A (P=4, D=6) at 0: prefill 0 -> U. B (P=4, D=2) arrives at 0.5U and queues (A's prefill runs); A's
    prefill completes at U and B is admitted there (KV 4 + 4). At 2U B is prefilled: KV 5 + 4 = 9, two
    decodes grow to 11. At 3U: KV 6 + 5 = 11, + 2 > 12: B (the youngest, 1 token) is evicted to the
    front of the queue; nothing is admitted. A's tokens 3..6 at 4U..7U: A ends 7U and B is re-prefilled
    (P' = 5) 7U -> 8U and decodes its last token to 9U. C (P=12) at 100U: 12 + 1 > 12, dropped on
    arrival. D (P=10, D=5) at 101U: two chunks to 103U; tokens at 104U (context 11), 105U (12); then
    12 + 1 > 12: evicted and dropped at 105U."""
    p = _params(alpha=U / 2, beta=U / 16, chunk=8, tau_solo=U, batch=4, chunked=True, w=0.0, kv=12)
    reqs = _compare(p, _gaps([(0.0, 4, 6, 0), (0.5 * U, 4, 2, 0), (100 * U, 12, 1, 0), (101 * U, 10, 5, 0)]))
    assert [r.outcome for r in reqs] == ["completed", "completed", "dropped", "dropped"]
    assert [r.first for r in reqs[:2]] == [U, 2 * U] and [r.end for r in reqs[:2]] == [7 * U, 9 * U]
    assert [r.preempt for r in reqs] == [0, 1, 0, 1]
    assert reqs[2].end == 100 * U and math.isnan(reqs[2].first)
    assert reqs[3].first == 103 * U and reqs[3].end == 105 * U


def test_round_robin_skips_drops_and_spreads_over_gpus():
    p = _params(n=3, classes=3, alpha=U, beta=U / 64, chunk=16, tau_solo=U / 2, batch=1, kv=40, w=0.01)
    rows = [(0.0, 30, 3, 0), (0.0, 50, 3, 1), (0.0, 10, 3, 2), (0.0, 5, 2, 0), (U, 7, 4, 1), (U, 39, 1, 2)]
    reqs = _compare(p, _gaps(rows))
    assert reqs[1].outcome == "dropped"
    assert [r.gpu for r in reqs] == [0, -1, 1, 2, 0, 1]


def test_join_deep_into_a_long_decode_run_with_kv_time():
    """Closed-form boundary times far from the GPU's anchor (a quadratic with the KV term): B lands exactly
    on A's 150th decode boundary, C in the middle of a later iteration, D exactly on the boundary where
    A's last decode ends."""
    p = _params(alpha=U, beta=U / 64, chunk=16, tau_solo=U / 2, batch=4, kap=U / 256, chunked=False, w=0.0)
    specs = [(("gap", 0.0), 20, 300, 0), (("bnd", 151, U), 40, 5, 0), (("gap", 37 * U / 64), 3, 2, 0),
             (("bnd", 152, U), 8, 1, 0)]
    reqs, times, _, seen = _stepper(p, specs)
    assert "decode ends where a whole-prompt prefill joins" in seen
    _compare(p, specs)
    specs[2] = (("gap", 37 * U / 64 + 1e-7), 3, 2, 0)  # generic float arrival mid-iteration
    _compare(p, specs)


def test_an_instance_emptied_by_a_drop_admits_its_queue_at_once():
    """Documented rule (1.1, step 3): no on_slot_freed follows an eviction, except when the evictions
    empty the GPU (else its queue would wait for ever: no completion would come). K = 12, watermark
    0.01, one GPU, every iteration U. A (P=10, D=5) prefills 0 -> U; B (P=2, D=1) arrives at 0.5U and
    queues; at U, 12 - 10 - 0.12 < 2 with A on the GPU: B waits. A's context reaches 12 at 3U and A is
    dropped; the GPU is empty, so B is admitted at 3U: prefill to 4U, its token at 5U. C (50U) runs
    50U -> 51U -> 52U."""
    p = _params(alpha=U / 2, beta=U / 32, chunk=16, tau_solo=U, batch=4, chunked=True, w=0.01, kv=12)
    rows = [(0.0, 10, 5, 0), (0.5 * U, 2, 1, 0), (50 * U, 1, 1, 0)]
    reqs = _compare(p, _gaps(rows))
    assert [r.outcome for r in reqs] == ["dropped", "completed", "completed"]
    assert reqs[0].end == 3 * U and reqs[0].preempt == 1  # the eviction that drops counts
    assert [r.first for r in reqs[1:]] == [4 * U, 51 * U] and [r.end for r in reqs[1:]] == [5 * U, 52 * U]
    reqs = _compare(p, _gaps(rows[:2]))  # without C too: nothing is left waiting
    assert reqs[1].outcome == "completed"


def test_arrival_at_the_instant_a_drop_empties_the_gpu_comes_first():
    """Found by the property test (a stepper ordering slip, since fixed): B = 1, K = 2, whole-prompt
    prefills of U, decode iterations of U/4. r1 (P=1, D=1), r2 (P=1, D=2), r3 at 0: r1 runs 0 -> 1.25U,
    r2's prefill 1.25U -> 2.25U, its first token at 2.5U fills the cache (context 2): r2 is dropped at
    2.5U and the GPU empties. r4 arriving exactly at 2.5U is handled before that boundary (the slot is
    still held): it queues behind r3; the emptied GPU then admits r3 at 2.5U (prefill to 3.5U, end
    3.75U) and r4 after it (4.75U, 5U)."""
    p = _params(alpha=U, beta=0.0, chunk=1, tau_solo=U / 4, batch=1, kv=2, chunked=False, w=0.0)
    rows = [(0.0, 1, 1, 0), (0.0, 1, 2, 0), (0.0, 1, 1, 0), (2.5 * U, 1, 1, 0)]
    reqs = _compare(p, _gaps(rows))
    assert [r.outcome for r in reqs] == ["completed", "dropped", "completed", "completed"]
    assert reqs[1].end == 2.5 * U
    assert [r.first for r in reqs[2:]] == [3.5 * U, 4.75 * U] and [r.end for r in reqs[2:]] == [3.75 * U, 5 * U]
    rows[3] = (2.5 * U + U / 4, 1, 1, 0)  # just after: the same, r4 queued behind r3
    reqs = _compare(p, _gaps(rows))
    assert [r.outcome for r in reqs] == ["completed", "dropped", "completed", "completed"]
    assert [r.first for r in reqs[2:]] == [3.5 * U, 4.75 * U]


# ------------------------------------------------------------------------------------------------
# The property test
# ------------------------------------------------------------------------------------------------


@st.composite
def _cases(draw):
    exact = draw(st.booleans())
    n = draw(st.integers(1, 4))
    ncls = draw(st.integers(1, 3))
    chunk = draw(st.sampled_from([1, 2, 3, 4, 5, 8, 16, 32]))
    if exact:
        alpha = draw(st.integers(0, 24)) * U / 4
        beta = draw(st.integers(0, 16)) * U / 64
        if alpha + beta == 0:
            alpha = U
        tau_solo = draw(st.integers(1, 24)) * U / 4
        kap = draw(st.sampled_from([0, 0, 1, 2, 5])) * U / 256
    else:
        alpha = draw(st.floats(1e-3, 0.05))
        beta = draw(st.floats(0.0, 2e-3))
        tau_solo = draw(st.floats(1e-3, 0.05))
        kap = draw(st.sampled_from([0.0, 0.0]) | st.floats(1e-6, 2e-4))
    pmax = draw(st.integers(1, 48))
    kv = draw(st.none() | st.integers(2, 2 * pmax + 40))
    p = dict(n=n, classes=ncls, batch=draw(st.integers(1, 8)), chunk=chunk, alpha=alpha, beta=beta,
             tau_solo=tau_solo, kv=kv, kap=kap, chunked=draw(st.booleans()), w=draw(st.sampled_from([0.0, 0.01])))
    specs = draw(_traces(exact, 8 * max(alpha + beta * chunk, tau_solo), pmax, chunk, ncls, 24))
    return exact, p, specs


def _traces(exact: bool, scale: float, pmax: int, chunk: int, ncls: int, size: int):
    """Request specs (timing, prompt, output, class): "exact" arrivals on multiples of U/4 or on boundaries of
    their GPU, else generic gaps up to ``scale`` seconds; prompts up to ``pmax`` tokens, whole chunks among them."""
    prompt = st.integers(1, pmax) | st.integers(1, max(1, pmax // chunk)).map(lambda k: k * chunk)
    if exact:
        timing = (st.tuples(st.just("gap"), st.integers(0, 64).map(lambda k: k * U / 4))
                  | st.tuples(st.just("bnd"), st.integers(1, 4) | st.integers(5, 40),
                              st.integers(1, 16).map(lambda k: k * U / 4)))
    else:
        timing = st.tuples(st.just("gap"), st.just(0.0) | st.floats(0.0, scale))
    output = st.integers(1, 3) | st.integers(1, 20) | st.integers(21, 120)
    return st.lists(st.tuples(timing, prompt, output, st.integers(0, ncls - 1)), min_size=1, max_size=size)


# 100 drawn cases (200 until issue 47's sixth cut): each event below was drawn in at least 15% of 221 cases
# (hypothesis' statistics), except "drop on arrival" (4.5%), "eviction of a prefill" (2.3%) and "decode
# ends where a whole-prompt prefill joins" (1.4%), which the explicit cases below reach every run
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_cases())
@example((True, _params(), _gaps([(0.0, 100, 2, 0), (0.075, 1000, 1, 0)])))
@example((True, _params(alpha=U, beta=U / 64, chunk=16, tau_solo=U, batch=2, chunked=False, w=0.0),
          [(("gap", 0.0), 64, 1, 0), (("bnd", 2, U), 32, 1, 0), (("bnd", 1, U), 8, 3, 0)]))
@example((True, _params(n=2, classes=2, alpha=U / 2, beta=U / 32, chunk=4, tau_solo=U / 4, batch=3, kv=16,
                        kap=U / 256, chunked=True, w=0.01),
          [(("gap", 0.0), 7, 9, 0), (("gap", 0.0), 8, 2, 1), (("bnd", 1, U), 5, 6, 1), (("bnd", 1, U), 4, 6, 0),
           (("bnd", 2, U), 16, 1, 0), (("bnd", 3, U), 6, 4, 1), (("gap", U / 4), 3, 3, 0)]))
@example((True, _params(alpha=U, beta=0.0, chunk=1, tau_solo=U / 4, batch=2, kv=2, chunked=True, w=0.0),
          [(("gap", 0.0), 1, 1, 0), (("gap", 0.0), 1, 1, 0)]))  # an eviction of a prefill (hypothesis' shrunk case)
@pytest.mark.integration
def test_engine_matches_stepper(case):
    exact, p, specs = case
    event("exact binary timing" if exact else "generic floats")
    _compare(p, specs, exact=exact, stats=True)


# ------------------------------------------------------------------------------------------------
# The generalised law (docs/simulator.md section 1.3)
# ------------------------------------------------------------------------------------------------


def _law(pre, small, large=None, threshold=0):
    from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw

    return IterationLaw(PrefillLaw(*pre), DecodeLaw(small, large, threshold))


def test_hand_timeline_with_a_law_chunked():
    """Prefill 2U + U/2 per token + U/8 per token^2, decode 2U + U/4 per context token + U per request; one
    GPU, chunked, C = 4. A (P=6, D=2) at 0: chunk 1 (4 tokens) 2U + 2U + 16U/8 = 6U; chunk 2 (2 tokens over
    4) 2U + U + (36 - 16)U/8 = 5.5U, first 11.5U (the partial chunk pays for its 2 tokens); A's first decode
    (context 6) 2U + 1.5U + U = 4.5U to 16U. B (P=4, D=1) arrives at 12U and joins at 16U: its chunk beside
    A's decode (context 7) pays the prefill intercept once, 6U + 1.75U + U = 8.75U: A ends and B is prefilled
    at 24.75U; B alone (context 4) 2U + U + U = 4U: ends 28.75U."""
    p = _params(chunk=4, batch=4, chunked=True, w=0.0,
                law=_law((2 * U, U / 2, U / 8), (2 * U, U / 4, U)))
    reqs = _compare(p, _gaps([(0.0, 6, 2, 0), (12 * U, 4, 1, 0)]))
    assert [r.first for r in reqs] == [11.5 * U, 24.75 * U]
    assert [r.end for r in reqs] == [24.75 * U, 28.75 * U]


def test_hand_timeline_with_a_law_whole_prompts_and_a_batch_switch():
    """Prefill 2U + U/2 per token + U/8 per token^2; decode U/1024... per context token nothing, 2U + U per
    request below 2 requests, U + 2U per request from 2 on; whole prompts. A (P=8, D=3): prefill 2U + 4U + 8U
    = 14U; its first decode alone 3U to 17U. B (P=4, D=1) at 15U joins at 17U: 2U + 2U + 2U = 6U while A
    stalls (no decode terms), to 23U; both decode (the large triple) U + 4U = 5U to 28U: B ends; A alone 3U
    to 31U."""
    p = _params(chunk=4, batch=4, chunked=False, w=0.0,
                law=_law((2 * U, U / 2, U / 8), (2 * U, 0.0, U), (U, 0.0, 2 * U), 2))
    reqs = _compare(p, _gaps([(0.0, 8, 3, 0), (15 * U, 4, 1, 0)]))
    assert [r.first for r in reqs] == [14 * U, 23 * U]
    assert [r.end for r in reqs] == [31 * U, 28 * U]


def test_the_straight_line_as_a_law_is_the_straight_line():
    """IterationLaw.straight_line in place of the GPU's own line: the same times wherever the kernel's
    convention (a partial last chunk costs a whole tau_mix) and the law's (it costs its tokens) agree: whole
    prompts, and chunked prompts that are whole chunks."""
    from fluidopt.calibration.timemodels import IterationLaw

    for chunked, prompts in ((False, (5, 17, 40, 3, 9)), (True, (8, 16, 40, 24, 8))):
        base = _params(n=2, alpha=0.0173, beta=1.9e-4, tau_solo=0.0212, chunk=8, batch=3, chunked=chunked, w=0.0)
        rows = [(0.004 * k + 0.0001 * (k % 3), prompts[k % 5], 1 + (7 * k) % 13, 0) for k in range(30)]
        plain = _engine_records(base, rows)
        law = _engine_records(dict(base, law=IterationLaw.straight_line(0.0173, 1.9e-4, 0.0212)), rows)
        for a, b in zip(plain.itertuples(index=False), law.itertuples(index=False)):
            assert _close(a.end, b.end) and _close(a.ttft, b.ttft), (chunked, a, b)


@st.composite
def _law_cases(draw):
    exact = draw(st.booleans())
    if exact:  # binary fractions: every boundary time is exact in both implementations
        pre = (draw(st.integers(1, 16)) * U / 4, draw(st.integers(0, 16)) * U / 64, draw(st.integers(0, 4)) * U / 4096)
        small = (draw(st.integers(1, 16)) * U / 4, draw(st.integers(0, 4)) * U / 256, draw(st.integers(0, 8)) * U / 16)
        large = (draw(st.integers(1, 16)) * U / 4, draw(st.integers(0, 4)) * U / 256, draw(st.integers(0, 8)) * U / 16)
    else:
        pre = (draw(st.floats(1e-3, 0.05)), draw(st.floats(0.0, 2e-3)), draw(st.floats(0.0, 2e-6)))
        small = (draw(st.floats(1e-3, 0.05)), draw(st.floats(0.0, 2e-5)), draw(st.floats(0.0, 1e-3)))
        large = (draw(st.floats(1e-3, 0.05)), draw(st.floats(0.0, 2e-5)), draw(st.floats(0.0, 1e-3)))
    switch = draw(st.booleans())
    law = _law(pre, small, large if switch else None, draw(st.integers(1, 6)) if switch else 0)
    pmax = draw(st.integers(1, 48))
    chunk = draw(st.sampled_from([1, 2, 3, 4, 5, 8, 16, 32]))
    p = _params(n=draw(st.integers(1, 3)), classes=draw(st.integers(1, 2)), batch=draw(st.integers(1, 8)),
                chunk=chunk, kv=draw(st.none() | st.integers(2, 2 * pmax + 40)), chunked=draw(st.booleans()),
                w=draw(st.sampled_from([0.0, 0.01])), law=law)
    specs = draw(_traces(exact, 8 * (pre[0] + pre[1] * chunk + small[0]), pmax, chunk, p["classes"], 20))
    return exact, p, specs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_law_cases())
@pytest.mark.integration
def test_engine_matches_stepper_with_a_law(case):
    """The kernel's closed-form clock under a law (timelaw.refresh, the quadratic in the boundary index and
    the partial last chunk) against the stepper's iteration-by-iteration times."""
    exact, p, specs = case
    event("exact binary timing" if exact else "generic floats")
    _compare(p, specs, exact=exact, stats=True)
