"""A prefix-cache model outside the simulator's engine: per-instance KV block caches, the routing rules
people run in front of them, and the token hit ratio they reach on a trace with block hashes.

The cache (docs/prefix-cache.md):

* each instance keeps blocks of ``block_size`` tokens, keyed by the trace's chained block ids (equal ids
  mean an equal prefix up to that block, as in the Mooncake release);
* a request's cached prefix is the longest run of its leading blocks present *and ready* on its
  instance, ``min(k * block_size, prompt)`` tokens for k blocks; a block is ready once the prefill that
  computes it has completed, so two requests of one burst do not hit each other;
* a running request holds (pins) all its blocks; capacity counts every block present; when a new block
  needs room the least recently used block no running request holds is evicted, and a request's own
  blocks age deepest first (its first block is the most recent), so a prefix is evicted from its tail;
  a request whose new blocks do not all fit keeps the leading ones that do.

Time is a simple law, not the engine: request i arrives at its trace time, its prefill ends
``uncached * prefill_time_per_token`` seconds later, and it runs ``output * decode_time_per_token``
seconds more (no queueing). An instance's load is its number of running requests. Both times default
to 0: every prefill is done before the next arrival, and routing sees no load.

Routing rules (``RULES``; parameters are keyword arguments of :func:`hit_ratio`):

* ``round-robin``: request i to instance i mod n;
* ``least-load``: the fewest running requests, ties to the fewest requests routed so far, then the
  lowest index;
* ``sglang`` (SGLang's cache-aware router): when the loads are imbalanced, ``max - min >
  balance_abs_threshold`` and ``max > balance_rel_threshold * min``, the least loaded; otherwise the
  longest match, unless its match rate (matched blocks over the request's blocks) is below
  ``cache_threshold``, then the instance with the fewest cached blocks (SGLang's smallest tree);
  defaults 32, 1.0001, 0.5 as SGLang's;
* ``llm-d`` (llm-d's weighted scorer): ``prefix_weight * matched / blocks + queue_weight * (max L - L)
  / (max L - min L) (1 when all equal) + kv_weight * (1 - held blocks / capacity)``, the highest score;
  defaults 3, 2, 2;
* ``consistent-hash``: a ring of ``vnodes`` points per instance, the request's key being its first
  ``k`` block ids (session affinity); ``consistent-hash-bounded`` walks the ring past instances whose
  load reaches ``ceil((1 + epsilon) * (total load + 1) / n)`` (consistent hashing with bounded loads).

Ties among equal scores go to the least loaded, then the lowest index. The ideal beside every answer
is one global cache of unlimited capacity with the same readiness rule.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fluidopt.core.errors import ScenarioError
from fluidopt.workloads.replay import TraceWorkload

__all__ = ["H_MAX", "RULES", "HitRatio", "hit_ratio", "hit_ratio_on_gpu"]

RULES = ("round-robin", "least-load", "sglang", "llm-d", "consistent-hash", "consistent-hash-bounded")
_OPTIONS = {
    "round-robin": {},
    "least-load": {},
    "sglang": {"balance_abs_threshold": 32.0, "balance_rel_threshold": 1.0001, "cache_threshold": 0.5},
    "llm-d": {"prefix_weight": 3.0, "queue_weight": 2.0, "kv_weight": 2.0},
    "consistent-hash": {"k": 2, "vnodes": 64},
    "consistent-hash-bounded": {"k": 2, "vnodes": 64, "epsilon": 0.25},
}


@dataclass(frozen=True)
class HitRatio:
    """What :func:`hit_ratio` found. Token counts are prompt tokens; ``instance`` and ``cached`` are
    per request in trace order; ``by_class`` and ``by_instance`` have columns ``requests``,
    ``prompt_tokens``, ``cached_tokens``, ``hit_ratio`` (and ``ideal`` by class)."""

    rule: str
    n_instances: int
    capacity_blocks: int | None
    prompt_tokens: int
    cached_tokens: int
    ideal_cached_tokens: int
    instance: np.ndarray = field(repr=False)
    cached: np.ndarray = field(repr=False)
    by_class: pd.DataFrame = field(repr=False)
    by_instance: pd.DataFrame = field(repr=False)
    evictions: int = 0

    @property
    def hit_ratio(self) -> float:
        """Cached over all prompt tokens."""
        return self.cached_tokens / self.prompt_tokens

    @property
    def ideal(self) -> float:
        """The hit ratio of one global cache of unlimited capacity."""
        return self.ideal_cached_tokens / self.prompt_tokens


def _trace(trace) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple, np.ndarray, tuple[str, ...], int]:
    if isinstance(trace, TraceWorkload):
        if trace.hashes is None:
            raise ScenarioError(f"hit_ratio: trace {trace.name!r} has no block hashes (read a JSON-lines trace "
                                "with hash ids, or generate one)")
        return (trace.time, trace.prompt, trace.output, trace.hashes, trace.cls, trace.class_names,
                int(trace.block_size))
    if isinstance(trace, pd.DataFrame) and {"time", "prompt", "output", "hashes"} <= set(trace.columns):
        if "class" in trace.columns:
            codes, names = pd.factorize(trace["class"].astype(str), sort=False)
        else:
            codes, names = np.zeros(len(trace), dtype=np.int64), ["all"]
        return (trace["time"].to_numpy(float), trace["prompt"].to_numpy(np.int64), trace["output"].to_numpy(np.int64),
                tuple(trace["hashes"]), np.asarray(codes, np.int64), tuple(map(str, names)),
                int(trace.attrs.get("block_size", 512)))
    raise ScenarioError(f"hit_ratio: trace: expected a TraceWorkload with hashes or a frame from read_jsonl_trace, "
                        f"got {type(trace).__name__}")


def _ring(n: int, vnodes: int) -> tuple[np.ndarray, np.ndarray]:
    pts = [(_h64(f"instance-{g}-{v}".encode()), g) for g in range(n) for v in range(vnodes)]
    pts.sort()
    return np.array([p for p, _ in pts], dtype=np.uint64), np.array([g for _, g in pts], dtype=np.int64)


def _h64(data: bytes) -> int:
    # a fixed hash (not Python's salted hash()) so a ring is the same in every process
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _check(name: str, v, *, integer: bool = False, low: float = 0.0, allow_none: bool = False):
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v) \
            or v < low or (integer and v != int(v)):
        what = "an integer" if integer else "a number"
        raise ScenarioError(f"hit_ratio: {name} = {v!r}: expected {what} >= {low:g}"
                            + (" or None (unlimited)" if allow_none else ""))
    return int(v) if integer else float(v)


def hit_ratio(trace, rule: str = "round-robin", n_instances: int = 8, capacity_blocks: int | None = None, *,
              prefill_time_per_token: float = 0.0, decode_time_per_token: float = 0.0, **options) -> HitRatio:
    """The token hit ratio of per-instance prefix caches under routing ``rule`` (module docstring).

    :param trace: a :class:`TraceWorkload` with hashes (``--trace`` of a JSON-lines file, or the
        synthetic generator's) or a frame from :func:`fluidopt.workloads.jsonl.read_jsonl_trace`.
    :param n_instances: instances (GPUs or replicas), each with its own cache.
    :param capacity_blocks: blocks per instance's cache (None: unlimited, nothing is evicted).
    :param prefill_time_per_token: seconds per uncached prompt token (when a computed block is ready).
    :param decode_time_per_token: seconds per output token (how long a request holds its blocks and
        counts in its instance's load).
    :param options: the rule's parameters (module docstring); unknown keys are refused with the list.
    """
    if rule not in _OPTIONS:
        raise ScenarioError(f"hit_ratio: rule = {rule!r}: expected one of {', '.join(RULES)}")
    unknown = sorted(set(options) - set(_OPTIONS[rule]))
    if unknown:
        raise ScenarioError(f"hit_ratio: rule {rule!r} has no option {', '.join(unknown)}; it takes "
                            f"{', '.join(_OPTIONS[rule]) or 'none'}")
    opt = {**_OPTIONS[rule], **options}
    n = _check("n_instances", n_instances, integer=True, low=1)
    cap = _check("capacity_blocks", capacity_blocks, integer=True, low=1, allow_none=True)
    p_tok = _check("prefill_time_per_token", prefill_time_per_token)
    d_tok = _check("decode_time_per_token", decode_time_per_token)
    for k, v in opt.items():
        opt[k] = _check(k, v, integer=k in ("k", "vnodes"), low=1 if k in ("k", "vnodes") else 0.0)
    t_arr, prompt, output, hashes, cls, class_names, B = _trace(trace)

    lru = [OrderedDict() for _ in range(n)]  # block -> ready time, oldest first
    pins = [dict() for _ in range(n)]  # block -> running requests holding it
    load = np.zeros(n, dtype=np.int64)
    routed = np.zeros(n, dtype=np.int64)
    running: list[tuple[float, int, int, list]] = []  # (finish, seq, instance, held blocks)
    ideal: dict = {}
    N = len(t_arr)
    inst = np.empty(N, dtype=np.int64)
    cached = np.empty(N, dtype=np.int64)
    ideal_cached = np.empty(N, dtype=np.int64)
    evictions = 0
    ring = _ring(n, opt["vnodes"]) if rule.startswith("consistent") else None

    def match(g: int, h, t: float) -> int:
        c = lru[g]
        m = 0
        for b in h:
            r = c.get(b)
            if r is None or r > t:
                break
            m += 1
        return m

    for i in range(N):
        t = float(t_arr[i])
        while running and running[0][0] <= t:
            _, _, g, held = heapq.heappop(running)
            load[g] -= 1
            pg = pins[g]
            for b in held:
                if pg[b] == 1:
                    del pg[b]
                else:
                    pg[b] -= 1
        h = [int(x) for x in hashes[i]]
        k_blocks = len(h)
        if rule == "round-robin":
            g = i % n
        elif rule == "least-load":
            g = min(range(n), key=lambda j: (load[j], routed[j], j))
        elif rule == "sglang":
            lo, hi = int(load.min()), int(load.max())
            if hi - lo > opt["balance_abs_threshold"] and hi > opt["balance_rel_threshold"] * lo:
                g = min(range(n), key=lambda j: (load[j], j))
            else:
                m = [match(j, h, t) for j in range(n)]
                g = min(range(n), key=lambda j: (-m[j], load[j], j))
                if k_blocks == 0 or m[g] / k_blocks < opt["cache_threshold"]:
                    g = min(range(n), key=lambda j: (len(lru[j]), load[j], j))
        elif rule == "llm-d":
            lo, hi = int(load.min()), int(load.max())
            score = []
            for j in range(n):
                s = opt["prefix_weight"] * (match(j, h, t) / k_blocks if k_blocks else 0.0)
                s += opt["queue_weight"] * ((hi - load[j]) / (hi - lo) if hi > lo else 1.0)
                s += opt["kv_weight"] * (1.0 - len(pins[j]) / cap if cap else 1.0)
                score.append(s)
            g = min(range(n), key=lambda j: (-score[j], load[j], j))
        else:
            pts, owner = ring
            key = _h64(",".join(map(str, h[: opt["k"]])).encode())
            pos = int(np.searchsorted(pts, np.uint64(key), side="left"))
            if rule == "consistent-hash":
                g = int(owner[pos % len(owner)])
            else:
                bound = math.ceil((1.0 + opt["epsilon"]) * (int(load.sum()) + 1) / n)
                for step in range(len(owner)):
                    g = int(owner[(pos + step) % len(owner)])
                    if load[g] < bound:
                        break
        m = match(g, h, t)
        c_tok = min(m * B, int(prompt[i]))
        p_end = t + (int(prompt[i]) - c_tok) * p_tok
        finish = p_end + int(output[i]) * d_tok
        # the global cache: unlimited, the same readiness rule
        mi = 0
        for b in h:
            r = ideal.get(b)
            if r is None or r > t:
                break
            mi += 1
        i_end = t + (int(prompt[i]) - min(mi * B, int(prompt[i]))) * p_tok
        for b in h[mi:]:
            ideal[b] = min(ideal.get(b, math.inf), i_end)
        ideal_cached[i] = min(mi * B, int(prompt[i]))
        # this instance's cache: pin what is there, make room for the new blocks, keep the leading ones that fit
        c, pg = lru[g], pins[g]
        new = [b for b in h if b not in c]
        held = [b for b in h if b in c]
        for b in held:
            pg[b] = pg.get(b, 0) + 1
        if cap is not None and len(c) + len(new) > cap:
            need = len(c) + len(new) - cap
            victims = []
            for b in c:
                if b not in pg:
                    victims.append(b)
                    if len(victims) == need:
                        break
            for b in victims:
                del c[b]
            evictions += len(victims)
            new = new[: max(0, cap - len(c))]
        for b in new:
            c[b] = p_end
            pg[b] = pg.get(b, 0) + 1
        for b in h[m:]:
            if b in c and c[b] > p_end:
                c[b] = p_end  # already being computed by a running request: the earlier completion counts
        for b in reversed(h):  # deepest oldest: a prefix is evicted from its tail
            if b in c:
                c.move_to_end(b)
        heapq.heappush(running, (finish, i, g, held + new))
        load[g] += 1
        routed[g] += 1
        inst[i], cached[i] = g, c_tok

    P = np.asarray(prompt, dtype=np.int64)

    def table(keys, labels, with_ideal: bool) -> pd.DataFrame:
        rows = []
        for j in range(len(labels)):
            sel = keys == j
            pt, ct = int(P[sel].sum()), int(cached[sel].sum())
            row = {"requests": int(sel.sum()), "prompt_tokens": pt, "cached_tokens": ct,
                   "hit_ratio": ct / pt if pt else math.nan}
            if with_ideal:
                row["ideal"] = int(ideal_cached[sel].sum()) / pt if pt else math.nan
            rows.append(row)
        return pd.DataFrame(rows, index=pd.Index(list(labels), name="class" if with_ideal else "instance"))

    return HitRatio(rule=rule, n_instances=n, capacity_blocks=cap, prompt_tokens=int(P.sum()),
                    cached_tokens=int(cached.sum()), ideal_cached_tokens=int(ideal_cached.sum()),
                    instance=inst, cached=cached, by_class=table(np.asarray(cls), class_names, True),
                    by_instance=table(inst, range(n), False), evictions=evictions)


H_MAX = 0.999  # the fluid model takes h < 1; a trace of identical prompts would reach 1


def hit_ratio_on_gpu(trace, gpu, rule: str = "round-robin", n_instances: int = 8, capacity_blocks: int | None = None,
                     **options) -> HitRatio:
    """:func:`hit_ratio` timed by the fluid model's law of ``gpu`` (a :class:`~fluidopt.core.model.GPUProfile`):
    ``tau_mix / chunk`` s per uncached prompt token, ``tau_mix`` s per output token. The estimate behind
    ``--from-trace``, the cache-aware gate's own h and the trace plan; cap what it gives at :data:`H_MAX`
    before the fluid model takes it."""
    return hit_ratio(trace, rule, n_instances, capacity_blocks, prefill_time_per_token=gpu.tau_mix / gpu.chunk,
                     decode_time_per_token=gpu.tau_mix, **options)
