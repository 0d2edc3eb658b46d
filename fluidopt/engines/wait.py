"""WAIT and Nested WAIT (Ao, Luo, Simchi-Levi and Wang, arXiv 2504.11320) as per-instance batch
policies, and their fluid benchmark.

What we could read of the paper is its abstract (the full text was not reachable from this
workspace); the rules below are our reading of it, stated so that they can be checked:

* **WAIT** (output lengths known at arrival). Requests fall into classes by their known output length
  (``class_edges``: class j holds outputs in (edge_{j-1}, edge_j]). Class j waits until ``thresholds[j]``
  of its requests are queued; then that many (oldest first) are admitted together, each *reserving* its
  final KV memory ``prompt + output`` tokens, if the reservations of all admitted requests stay within
  ``memory - buffer``. Admitted prompts are prefilled whole in the next iteration, beside the decodes of
  every running request. Reserving the final footprint is what rules out eviction: memory never
  overflows, so nothing is recomputed.
* **Nested WAIT** (output lengths unknown). The decode is cut into segments at output-token counts
  ``boundaries`` g_1 < g_2 < ... A request reserves memory only to the end of its current segment
  (``prompt + g_k``). New requests wait at boundary 0 until ``thresholds[0]`` are queued; a request that
  has generated g_k tokens and is not done stops at boundary k (holding its memory, not decoding) until
  ``thresholds[k]`` requests wait there, and the group then advances together, reserving
  ``g_{k+1} - g_k`` more each. Short requests finish inside early segments and free their memory; only
  the long ones are carried on. Deeper boundaries are served first (they free memory soonest).
  ``buffer`` (tokens) is held back from every reservation: the paper's safety buffer. Because we
  reserve to the segment's end, our variant cannot overflow even with ``buffer = 0``.
* Both never idle while work waits: when no request is running and no group reaches its threshold,
  the longest-waiting group (Nested WAIT: at the deepest boundary) is admitted below threshold, as much
  as memory allows. Without this rule a threshold above the number of requests still to come would
  stall the run forever.

Iteration times come from an :class:`~fluidopt.calibration.timemodels.IterationLaw` composed as the
engine stepper composes them (:mod:`fluidopt.engines.stepper`): a decode-only iteration takes
``decode.a + decode.b * T + decode.c * B``; one with prompts ``prefill.a + prefill.b * sum(l) +
prefill.c * sum(l^2) + decode.b * T + decode.c * B`` (T: context tokens of the B decodes).

:func:`fluid_benchmark` is the fluid equilibrium of the paper's kind of model, in which an iteration
takes ``d0 + d1 * (KV tokens the batch touches)``; see its docstring.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from fluidopt.calibration.timemodels import IterationLaw
from fluidopt.core.errors import ScenarioError
from fluidopt.engines.stepper import Replay

__all__ = ["FluidEquilibrium", "WaitPolicy", "fluid_benchmark", "nested_wait_policy", "replay_wait", "stage_memory",
           "wait_policy"]


@dataclass(frozen=True)
class WaitPolicy:
    """Settings of WAIT (``kind="wait"``) or Nested WAIT (``kind="nested"``); see the module docstring.
    ``memory`` and ``buffer`` in KV tokens; ``edges`` are WAIT's class edges or Nested WAIT's segment
    boundaries (output tokens); ``thresholds``: one per class (WAIT), or one per boundary with
    boundary 0 (the arrivals) first, ``len(edges) + 1`` in all (Nested WAIT)."""

    kind: str
    memory: float
    thresholds: tuple[int, ...]
    edges: tuple[int, ...]
    buffer: float = 0.0


def _ints(name: str, xs, lo: int) -> tuple[int, ...]:
    out = tuple(xs)
    if not out or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < lo for x in out):
        raise ScenarioError(f"{name} = {list(out)!r}: expected integers >= {lo}")
    return tuple(int(x) for x in out)


def _memory(memory, buffer) -> tuple[float, float]:
    m = float(memory)
    if not m > 0:
        raise ScenarioError(f"memory = {memory!r}: expected KV tokens > 0")
    if not 0 <= float(buffer) < m:
        raise ScenarioError(f"buffer = {buffer!r}: expected KV tokens in [0, memory)")
    return m, float(buffer)


def wait_policy(memory: float, thresholds, class_edges, *, buffer: float = 0.0) -> WaitPolicy:
    """WAIT with class j = outputs in (edge_{j-1}, edge_j] tokens (edge_0 = 0; the last edge must cover
    the longest output) and ``thresholds[j]`` requests per admitted group."""
    th = _ints("thresholds", thresholds, 1)
    ed = _ints("class_edges", class_edges, 1)
    if len(th) != len(ed) or any(b <= a for a, b in zip(ed, ed[1:])):
        raise ScenarioError(f"class_edges = {list(ed)!r}: expected increasing edges, one per threshold ({len(th)})")
    m, b = _memory(memory, buffer)
    return WaitPolicy("wait", m, th, ed, b)


def nested_wait_policy(memory: float, thresholds, boundaries, *, buffer: float = 0.0) -> WaitPolicy:
    """Nested WAIT with segment boundaries g_1 < g_2 < ... (output tokens generated) and one threshold
    per boundary including boundary 0, the arrivals: ``len(thresholds) == len(boundaries) + 1``."""
    th = _ints("thresholds", thresholds, 1)
    bd = _ints("boundaries", boundaries, 1)
    if len(th) != len(bd) + 1 or any(b <= a for a, b in zip(bd, bd[1:])):
        raise ScenarioError(f"boundaries = {list(bd)!r}: expected increasing output-token counts and "
                            f"len(thresholds) = len(boundaries) + 1 (got {len(th)})")
    m, b = _memory(memory, buffer)
    return WaitPolicy("nested", m, th, bd, b)


@dataclass(frozen=True)
class WaitRun:
    """:func:`replay_wait`'s result: the per-request :class:`Replay`, the decisions (when ``trace``:
    per iteration ``(start s, admitted ids, advanced ids, decodes)``) and the time-average KV memory
    held (tokens) and its peak, over the run."""

    replay: Replay
    decisions: tuple
    mean_memory: float
    peak_reserved: float


def replay_wait(law: IterationLaw, policy: WaitPolicy, arrival, prompt, output, *, trace: bool = False) -> WaitRun:
    """Run the requests (arrival s, sorted; prompt and output tokens) through one instance under
    ``policy``. A request whose final footprint ``prompt + output`` exceeds ``memory - buffer`` could
    never run: :class:`ScenarioError`."""
    arr = np.asarray(arrival, dtype=float)
    P = np.asarray(prompt, dtype=np.int64)
    O = np.asarray(output, dtype=np.int64)
    n = len(arr)
    if n and np.any(np.diff(arr) < 0):
        raise ScenarioError("replay_wait: arrivals must be sorted")
    if n and (P.min() < 1 or O.min() < 1):
        raise ScenarioError("replay_wait: prompt and output lengths must be >= 1 token")
    cap = policy.memory - policy.buffer
    if n and float((P + O).max()) > cap:
        i = int(np.argmax(P + O))
        raise ScenarioError(f"request {i}: prompt + output = {int(P[i] + O[i])} tokens > memory - buffer = {cap:g}")
    nested = policy.kind == "nested"
    edges = policy.edges
    th = policy.thresholds
    if not nested and n and O.max() > edges[-1]:
        raise ScenarioError(f"class_edges: the last edge {edges[-1]} is below the longest output {int(O.max())}")
    nq = len(th)
    queues: list[deque] = [deque() for _ in range(nq)]
    gen = np.zeros(n, dtype=np.int64)
    resv = np.zeros(n)  # memory reserved (tokens)
    stop = np.zeros(n, dtype=np.int64)  # output tokens at which the request next stops (done or a boundary)
    seg = np.zeros(n, dtype=np.int64)  # Nested WAIT: boundaries passed
    first = np.full(n, np.nan)
    done = np.full(n, np.nan)
    run_ids = np.zeros(0, dtype=np.int64)
    reserved = 0.0
    peak = 0.0
    held_area = 0.0
    now = 0.0
    nxt = 0
    decisions = []
    pf, dl = law.prefill, law.decode

    def klass(r: int) -> int:
        if nested:
            return 0
        return int(np.searchsorted(edges, O[r], side="left"))

    def target(r: int, k: int) -> int:
        """Output tokens at the end of segment k (Nested WAIT) or the whole output (WAIT)."""
        if not nested or k >= len(edges):
            return int(O[r])
        return int(min(O[r], edges[k]))

    def take(q: int, limit: int) -> list[int]:
        """Up to ``limit`` requests from queue q, oldest first, while their reservations fit."""
        nonlocal reserved
        got = []
        while queues[q] and len(got) < limit:
            r = queues[q][0]
            need = P[r] + target(r, q) - resv[r]
            if reserved + need > cap + 1e-9:
                break
            queues[q].popleft()
            reserved += need
            resv[r] += need
            stop[r] = target(r, q)
            seg[r] = q
            got.append(r)
        return got

    def group(q: int) -> list[int]:
        """A whole group of ``th[q]`` from queue q if it is there and fits, else nothing."""
        nonlocal reserved
        if len(queues[q]) < th[q]:
            return []
        ids = [queues[q][i] for i in range(th[q])]
        need = float(sum(P[r] + target(r, q) - resv[r] for r in ids))
        if reserved + need > cap + 1e-9:
            return []
        return take(q, th[q])

    def stopped(r: int) -> None:
        """Request r reached its stop: done (its reservation freed) or at the next boundary."""
        nonlocal reserved
        if gen[r] >= O[r]:
            done[r] = now
            reserved -= resv[r]
            resv[r] = 0.0
        else:
            queues[seg[r] + 1].append(r)

    iters = prefills = 0
    while True:
        while nxt < n and arr[nxt] <= now:
            queues[klass(nxt)].append(nxt)
            nxt += 1
        admitted: list[int] = []
        advanced: list[int] = []
        if nested:
            for q in range(nq - 1, -1, -1):
                while True:
                    g = group(q)
                    if not g:
                        break
                    (advanced if q > 0 else admitted).extend(g)
        else:
            # classes with a whole group, the one whose oldest request came first served first (FCFS
            # across classes: a fixed class order would favour one class in overload)
            while True:
                full = [q for q in range(nq) if len(queues[q]) >= th[q]]
                g = []
                for q in sorted(full, key=lambda j: queues[j][0]):
                    g = group(q)
                    if g:
                        break
                if not g:
                    break
                admitted.extend(g)
        if not admitted and not advanced and run_ids.size == 0:
            # never idle while work waits: the longest-waiting group, below threshold
            cand = [q for q in range(nq) if queues[q]]
            if cand:
                q = max(cand) if nested else min(cand, key=lambda j: queues[j][0])
                g = take(q, th[q])
                (advanced if nested and q > 0 else admitted).extend(g)
        if not admitted and not advanced and run_ids.size == 0:
            if nxt >= n:
                break
            now = max(now, arr[nxt])
            continue
        if advanced:
            run_ids = np.concatenate((run_ids, np.asarray(advanced, dtype=np.int64)))
        B = int(run_ids.size)
        T = float((P[run_ids] + gen[run_ids]).sum()) if B else 0.0
        if trace:
            decisions.append((now, tuple(int(r) for r in admitted), tuple(int(r) for r in advanced), B))
        a, b, c = dl.coefficients(B)
        if admitted:
            pl = P[admitted].astype(float)
            dt = pf.a + pf.b * pl.sum() + pf.c * float((pl * pl).sum()) + (b * T + c * B if B else 0.0)
        else:
            dt = a + b * T + c * B
        held = float((P[run_ids] + gen[run_ids]).sum()) + (float(P[admitted].sum()) if admitted else 0.0)
        held_area += held * dt
        iters += 1
        prefills += bool(admitted)
        peak = max(peak, reserved)
        now += dt
        # decodes: one token each; requests reaching their stop finish or wait at the next boundary
        if B:
            gen[run_ids] += 1
            hit = gen[run_ids] >= stop[run_ids]
            if hit.any():
                for r in run_ids[hit]:
                    stopped(int(r))
                run_ids = run_ids[~hit]
        for r in admitted:
            gen[r] = 1
            first[r] = now
            if gen[r] >= stop[r]:
                stopped(r)
            else:
                run_ids = np.append(run_ids, r)

    rep = Replay(arr, first, done, np.zeros(n, dtype=np.int64), O.copy(), iters, prefills)
    return WaitRun(rep, tuple(decisions), held_area / now if now > 0 else 0.0, peak)


def stage_memory(prompt: float, output: float) -> float:
    """KV tokens one request touches over its iterations, summed (tokens): its prefill touches the
    ``prompt`` tokens, its decode producing token k + 1 touches ``prompt + k`` (k = 1 .. output - 1):
    ``output * prompt + output * (output - 1) / 2``."""
    return output * prompt + output * (output - 1) / 2


@dataclass(frozen=True)
class FluidEquilibrium:
    """:func:`fluid_benchmark`'s answer. Rates in requests/s (``token_throughput``: output tokens/s),
    ``memory``: M*(lam), KV tokens held; ``iteration_time``: tau*, s; ``per_stage``: requests of each
    class in each of its stages of one iteration (x_j tau*); ``memory_bound``: the memory cap binds
    and only ``throughput`` of ``arrival_rate`` is served."""

    arrival_rate: float
    throughput: float
    token_throughput: float
    memory: float
    iteration_time: float
    per_stage: tuple[float, ...]
    memory_bound: bool


def fluid_benchmark(rates, prompts, outputs, d0: float, d1: float, memory: float = math.inf) -> FluidEquilibrium:
    """Fluid equilibrium of one instance whose iteration takes ``d0 + d1 * m`` seconds, ``m`` the KV
    tokens the batch touches, serving classes j of ``rates[j]`` requests/s with ``prompts[j]`` and
    ``outputs[j]`` tokens under a KV memory of ``memory`` tokens.

    In equilibrium every iteration of length tau advances each running request one stage, and class j,
    served at x_j requests/s, has x_j tau requests in each of its ``outputs[j]`` stages. The batch then
    touches (and holds) m = tau * rho KV tokens, rho = sum_j x_j S_j with S_j from :func:`stage_memory`,
    and tau = d0 + d1 m gives tau* = d0 / (1 - d1 rho) and M*(lam) = d0 rho / (1 - d1 rho). All arrivals
    are served while M* <= memory, i.e. rho <= R = memory / (d0 + d1 memory); beyond, memory binds
    (M* = memory, tau* = d0 + d1 memory) and, as a first-come-first-served scheduler would, every class
    is served in the same proportion R / rho(lam). With ``memory`` infinite the bound is rho < 1 / d1."""
    lam = np.atleast_1d(np.asarray(rates, dtype=float))
    lp = np.atleast_1d(np.asarray(prompts, dtype=float))
    lo = np.atleast_1d(np.asarray(outputs, dtype=float))
    if not (lam.shape == lp.shape == lo.shape) or lam.size == 0:
        raise ScenarioError("fluid_benchmark: rates, prompts and outputs must have one entry per class")
    if np.any(lam < 0) or not np.all(np.isfinite(lam)):
        raise ScenarioError(f"fluid_benchmark: rates = {lam.tolist()!r}: expected requests/s >= 0")
    if np.any(lp < 1) or np.any(lo < 1):
        raise ScenarioError("fluid_benchmark: prompts and outputs must be >= 1 token")
    if not (d0 > 0 and d1 >= 0):
        raise ScenarioError(f"fluid_benchmark: d0 = {d0!r} s, d1 = {d1!r} s/token: expected d0 > 0, d1 >= 0")
    if not memory > 0:
        raise ScenarioError(f"fluid_benchmark: memory = {memory!r}: expected KV tokens > 0")
    S = stage_memory(lp, lo)
    rho = float(lam @ S)
    R = 1.0 / d1 if math.isinf(memory) else memory / (d0 + d1 * memory)
    if math.isinf(memory) and d1 == 0:
        R = math.inf
    if rho < R or (rho == R and not math.isinf(memory)):
        theta, bound = 1.0, False
    else:
        theta, bound = R / rho, True
    x = theta * lam
    r = theta * rho
    if bound and not math.isinf(memory):
        tau, m = d0 + d1 * memory, float(memory)
    elif bound:
        tau, m = math.inf, math.inf
    else:
        tau = d0 / (1 - d1 * r)
        m = tau * r
    per_stage = tuple(float(v) for v in x * tau) if math.isfinite(tau) else tuple(math.inf for _ in x)
    return FluidEquilibrium(float(lam.sum()), float(x.sum()), float(x @ lo), m, tau, per_stage, bound)
