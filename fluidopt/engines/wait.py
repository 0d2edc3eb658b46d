"""WAIT and Nested WAIT (Ao, Luo, Simchi-Levi and Wang, arXiv 2504.11320) as per-instance batch
policies, and their fluid benchmark.

The rules follow the authors' own simulator, a fork of Vidur (github.com/Luoxiaogan/vidur_or,
``vidur/scheduler/replica_scheduler/``); docs/theory.md says which file each rule comes from and where
ours differs. Both are *booking limits*: a total limit ``L`` on the requests in the batch, split over
known request types (output length ``d_i`` tokens, arrival rate ``lam_i``). A request's *stage* is the
number of iterations it has had; its prefill iteration emits its first token, so a request of ``o``
output tokens leaves after ``o`` iterations.

* **WAIT** (``booking_limit_replica_scheduler.py``; output lengths known at arrival). Type i gets
  ``L_i = L lam_i (d_i + 1) / sum_j lam_j (d_j + 1)`` and a per-stage limit
  ``n_i = max(floor(L_i / (d_i + 1)), 1)``. A batch forms only when every type has at least ``n_i``
  new arrivals waiting; it then holds the ``n_i`` oldest new prompts of each type and every ongoing
  request. Otherwise nothing runs (ongoing requests wait too) until arrivals complete the set
  (``strict=True``). The authors' WAIT runs used ``modified_booking_limit_replica_scheduler.py``
  (our default): type i admits ``min(n_i, int(L_i - ongoing_i))`` new prompts and a batch forms when
  *any* type has that many waiting.
* **Nested WAIT** (``general_nested_booking_limit_replica_scheduler.py``; output lengths unknown, their
  distribution known). The distinct type lengths ``D_1 < ... < D_K`` cut the stages into segments
  ``[D_{k-1}, D_k)`` (``D_0 = 0``) of ``c_k = D_k - D_{k-1}`` stages, weighted ``w_k = c_k *`` (the
  arrival rate of the types longer than ``D_{k-1}``). Segment k gets ``L_k = floor(L w_k / sum w)``
  requests and a per-stage limit ``n_k = ceil(L w_k / sum w / c_k)``. Each iteration walks the
  segments in order: with ``occ_k`` requests inside segment k past its first stage and
  ``need_k = min(n_k, L_k - occ_k)``, the segment runs only if at least ``need_k`` requests wait at
  its first stage (segment 1: new arrivals; segment k > 1: requests that finished segment k - 1 and
  are not done); then ``max(need_k, 0)`` of them (oldest first) join and every request inside the
  segment advances one stage. The walk stops at the first segment that cannot run.

Where ours differs (docs/theory.md says why):

* Their runs end by dropping what is left (``force_clear``) or never finish it; ours serves every
  request: once the last request has arrived, a segment or type short of its threshold runs with
  what waits.
* Their ``L_k`` rounds down to 0 for a light segment, whose requests then never advance; ours keeps
  ``L_k >= 1``.
* Their schedulers do not check the KV memory (the limit is meant to keep it small); ours raises
  :class:`ScenarioError` if the KV tokens held would exceed ``memory - buffer``, so a limit too large
  for the memory is an error, never a silent overflow.

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
    ``edges``: WAIT's type lengths ``d_i`` (a request of ``o`` output tokens belongs to the first type
    with ``d_i >= o``) or Nested WAIT's segment ends ``D_k`` (output tokens, increasing);
    ``thresholds``: the per-stage limits ``n_i`` or ``n_k`` (requests); ``limits``: the type shares
    ``L_i`` or segment limits ``L_k`` (requests); ``total_limit``: ``L``; ``memory`` and ``buffer`` in
    KV tokens; ``strict``: WAIT's batch rule (see :func:`wait_policy`)."""

    kind: str
    memory: float
    thresholds: tuple[int, ...]
    edges: tuple[int, ...]
    buffer: float = 0.0
    limits: tuple[float, ...] = ()
    total_limit: int = 0
    strict: bool = False


def _types(total_limit, outputs, rates) -> tuple[int, np.ndarray, np.ndarray]:
    """(L, distinct output lengths increasing, their summed rates), checked."""
    if isinstance(total_limit, bool) or not isinstance(total_limit, (int, np.integer)) or total_limit < 1:
        raise ScenarioError(f"total_limit = {total_limit!r}: expected an integer >= 1 (requests)")
    d = np.atleast_1d(np.asarray(outputs))
    lam = np.atleast_1d(np.asarray(rates, dtype=float))
    if d.size == 0 or d.shape != lam.shape or not np.issubdtype(d.dtype, np.integer) or d.min() < 1:
        raise ScenarioError(f"outputs = {d.tolist()!r}: expected one integer >= 1 (tokens) per rate")
    if not np.all(np.isfinite(lam)) or lam.min() < 0 or lam.sum() <= 0:
        raise ScenarioError(f"rates = {lam.tolist()!r}: expected requests/s >= 0, not all 0")
    D = np.unique(d)
    return int(total_limit), D.astype(np.int64), np.array([lam[d == x].sum() for x in D])


def _memory(memory, buffer) -> tuple[float, float]:
    m = float(memory)
    if not m > 0:
        raise ScenarioError(f"memory = {memory!r}: expected KV tokens > 0")
    if not 0 <= float(buffer) < m:
        raise ScenarioError(f"buffer = {buffer!r}: expected KV tokens in [0, memory)")
    return m, float(buffer)


def wait_policy(total_limit: int, outputs, rates, *, memory: float = math.inf, buffer: float = 0.0,
                strict: bool = False) -> WaitPolicy:
    """WAIT for request types of ``outputs[i]`` output tokens arriving at ``rates[i]`` requests/s
    (types of equal length are merged), with a total booking limit of ``total_limit`` requests:
    ``L_i = L lam_i (d_i + 1) / sum_j lam_j (d_j + 1)``, ``n_i = max(floor(L_i / (d_i + 1)), 1)``.

    ``strict=True``: the rule of ``booking_limit_replica_scheduler.py`` in the module docstring (a batch
    only when *every* type has ``n_i`` new arrivals). ``strict=False`` (default): the rule of
    ``modified_booking_limit_replica_scheduler.py``, which the authors' WAIT runs used: type i admits
    ``need_i = min(n_i, int(L_i - ongoing_i))`` new prompts, and a batch forms when *any* type has
    ``need_i`` waiting (a type at its limit counts as ready). The strict rule runs at most one batch
    per arrival of the rarest type, so with many types of floored ``n_i = 1`` it nearly stops."""
    L, D, lam = _types(total_limit, outputs, rates)
    w = lam * (D + 1)
    share = L * w / w.sum()
    n = np.maximum(np.floor(share / (D + 1)), 1).astype(int)
    m, b = _memory(memory, buffer)
    return WaitPolicy("wait", m, tuple(int(x) for x in n), tuple(int(x) for x in D), b,
                      tuple(float(x) for x in share), L, bool(strict))


def nested_wait_policy(total_limit: int, outputs, rates, *, memory: float = math.inf,
                       buffer: float = 0.0) -> WaitPolicy:
    """Nested WAIT whose segments end at the distinct ``outputs`` (tokens), weighted by the ``rates``
    (requests/s) of the types still decoding in each: ``L_k = max(floor(s_k), 1)`` and
    ``n_k = ceil(s_k / c_k)`` with ``s_k = L w_k / sum w``."""
    L, D, lam = _types(total_limit, outputs, rates)
    c = np.diff(np.concatenate(([0], D)))
    alive = np.array([lam[D > lo].sum() for lo in np.concatenate(([0], D[:-1]))])
    share = L * c * alive / float((c * alive).sum())
    n = np.maximum(np.ceil(share / c), 1).astype(int)
    Lk = np.maximum(np.floor(share), 1)
    m, b = _memory(memory, buffer)
    return WaitPolicy("nested", m, tuple(int(x) for x in n), tuple(int(x) for x in D), b,
                      tuple(float(x) for x in Lk), L)


@dataclass(frozen=True)
class WaitRun:
    """:func:`replay_wait`'s result: the per-request :class:`Replay`, the decisions (when ``trace``:
    per iteration ``(start s, new prompts admitted, requests joining a later segment, decodes)``), the
    time-average KV tokens held over the run and their peak (tokens)."""

    replay: Replay
    decisions: tuple
    mean_memory: float
    peak_memory: float


def replay_wait(law: IterationLaw, policy: WaitPolicy, arrival, prompt, output, *, trace: bool = False) -> WaitRun:
    """Run the requests (arrival s, sorted; prompt and output tokens) through one instance under
    ``policy``. A request longer than the longest type (``policy.edges[-1]``) has no stage to run in,
    and KV tokens held beyond ``memory - buffer`` mean the limit is too large for the memory: both
    raise :class:`ScenarioError`."""
    arr = np.asarray(arrival, dtype=float)
    P = np.asarray(prompt, dtype=np.int64)
    O = np.asarray(output, dtype=np.int64)
    n = len(arr)
    if n and np.any(np.diff(arr) < 0):
        raise ScenarioError("replay_wait: arrivals must be sorted")
    if n and (P.min() < 1 or O.min() < 1):
        raise ScenarioError("replay_wait: prompt and output lengths must be >= 1 token")
    edges = policy.edges
    if n and O.max() > edges[-1]:
        raise ScenarioError(f"replay_wait: output {int(O.max())} tokens exceeds the longest type, {edges[-1]} tokens")
    cap = policy.memory - policy.buffer
    nested = policy.kind == "nested"
    th = policy.thresholds
    K = len(edges)
    kls = np.searchsorted(edges, O, side="left")  # WAIT: the type; Nested WAIT: unused
    # WAIT: one queue of new arrivals per type. Nested WAIT: per segment, the requests waiting at its
    # first stage (segment 0: new arrivals) and those inside it.
    waiting: list[deque] = [deque() for _ in range(K)]
    inside: list[list[int]] = [[] for _ in range(K)]
    gen = np.zeros(n, dtype=np.int64)
    first = np.full(n, np.nan)
    done = np.full(n, np.nan)
    held = 0.0  # KV tokens of admitted, unfinished requests
    peak = held_area = now = 0.0
    nxt = 0
    decisions = []
    pf, dl = law.prefill, law.decode

    def walk(drain: bool) -> tuple[list[int], list[int], list[int]]:
        """(new prompts, requests joining a later segment, requests decoding) of the next batch."""
        new: list[int] = []
        join: list[int] = []
        run: list[int] = []
        if not nested:
            if policy.strict:
                need = list(th)
                ready = all(len(waiting[j]) >= need[j] for j in range(K))
            else:
                need = [min(th[j], int(policy.limits[j] - len(inside[j]))) for j in range(K)]
                ready = any(len(waiting[j]) >= need[j] for j in range(K))
            if not (ready or drain):
                return new, join, run
            for j in range(K):
                new.extend(waiting[j].popleft() for _ in range(min(max(need[j], 0), len(waiting[j]))))
                run.extend(inside[j])
                inside[j] = []
            return new, join, run
        for k in range(K):
            need = min(th[k], int(policy.limits[k]) - len(inside[k]))
            if len(waiting[k]) < need and not drain:
                break
            got = [waiting[k].popleft() for _ in range(min(max(need, 0), len(waiting[k])))]
            (new if k == 0 else join).extend(got)
            run.extend(inside[k])
            inside[k] = []
        return new, join, run

    iters = prefills = 0
    while True:
        while nxt < n and arr[nxt] <= now:
            waiting[0 if nested else int(kls[nxt])].append(nxt)
            nxt += 1
        new, join, run = walk(nxt >= n)
        if not (new or join or run):
            if nxt >= n:
                break
            now = max(now, arr[nxt])  # nothing may run: wait for the next arrival
            continue
        dec = join + run  # every request past its prefill decodes one token
        B = len(dec)
        T = float((P[dec] + gen[dec]).sum()) if B else 0.0
        a, b, c = dl.coefficients(B)
        if new:
            pl = P[new].astype(float)
            dt = pf.a + pf.b * pl.sum() + pf.c * float((pl * pl).sum()) + (b * T + c * B if B else 0.0)
        else:
            dt = a + b * T + c * B
        # KV tokens after this iteration: the new prompts and one more token for every request in it
        after = held + float(P[new].sum()) + len(new) + B
        if after > cap + 1e-9:
            raise ScenarioError(f"replay_wait: {after:.0f} KV tokens held at t = {now:.3f} s exceed memory - buffer "
                                f"= {cap:g}; lower total_limit")
        if trace:
            decisions.append((now, tuple(int(r) for r in new), tuple(int(r) for r in join), B))
        held_area += after * dt
        held = after
        peak = max(peak, held)
        iters += 1
        prefills += bool(new)
        now += dt
        for r in new:
            first[r] = now
        moved = new + dec
        gen[moved] += 1
        if nested:
            for r in moved:
                if gen[r] >= O[r]:
                    continue
                k = int(np.searchsorted(edges, gen[r], side="right"))  # the segment its next stage is in
                if gen[r] == (edges[k - 1] if k else 0):
                    waiting[k].append(r)  # at the first stage of segment k: waits for its group
                else:
                    inside[k].append(r)
        else:
            for r in moved:
                if gen[r] < O[r]:
                    inside[int(kls[r])].append(r)
        for r in moved:
            if gen[r] >= O[r]:
                done[r] = now
                held -= float(P[r] + O[r])

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
