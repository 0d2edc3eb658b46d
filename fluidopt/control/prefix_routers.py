"""Cache-aware routers as users run them (issue 42): SGLang's cache-aware router and llm-d's weighted
scorer, over instances that keep prefix (KV) caches (docs/prefix-cache.md, "Cache-aware routers").

Both route each arrival to an instance (``fluidopt.control.instance``: vLLM-style instances, prefill
first, or chunked with ``-chunked``) and read the cache only through the protocol's query
``ctx.cached_prefix_tokens(r, g)``: the simulator answers it from its per-instance caches, a router
from its own index (``ClusterSnapshot``). An instance's load is its outstanding requests
(``ctx.instance_requests(g)``: its queue plus its GPU). Ties go to the least loaded, then the lowest index.

* ``sglang``: when the loads are imbalanced, ``max - min > balance_abs_threshold`` and ``max >
  balance_rel_threshold * min``, the least loaded; otherwise the longest match, unless its match rate
  (matched over prompt tokens) is below ``cache_threshold``, then the least loaded. SGLang sends that
  case to the instance with the smallest tree; the view has no cache sizes, and the least loaded is
  what SGLang's balancing aims at. Defaults 32, 1.0001, 0.5 (SGLang's).
* ``llm-d``: the highest score ``prefix_weight * matched / prompt + queue_weight * (max L - L) / (max L -
  min L) (1 when all loads are equal) + kv_weight * (1 - KV used / KV capacity) (1 without a
  capacity)``. Defaults 3, 2, 2 (llm-d's scorer weights in its sample configuration).
* ``consistent-hash``: a ring of ``vnodes`` points per instance (BLAKE2b, the same ring as
  :mod:`fluidopt.workloads.prefix`); a request's key is its first ``k`` block ids (``ctx.req_blocks``),
  so a session's turns, which share their first blocks, go to one instance (session affinity). A
  request without block ids goes to the least loaded. ``consistent-hash-bounded`` walks the ring past
  instances whose load reaches ``ceil((1 + epsilon) * (total load + 1) / n)`` (consistent hashing with
  bounded loads). Defaults k = 2, vnodes = 64, epsilon = 0.25.
"""

from __future__ import annotations

import math

from fluidopt.control.instance import InstanceScheduler
from fluidopt.control.load_balancers import _registered
from fluidopt.control.protocol import Context
from fluidopt.control.token_ledger import _chunk_name
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario
from fluidopt.workloads.prefix import _h64, _ring

__all__ = ["ConsistentHash", "ConsistentHashBounded", "LLMDScorer", "SGLangRouter"]


def _number(owner: str, name: str, v: object, low: float = 0.0) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < low:
        raise ScenarioError(f"{owner}: {name} = {v!r}: expected a finite number >= {low:g}")
    return float(v)


class SGLangRouter(InstanceScheduler):
    """SGLang's cache-aware router (module docstring)."""

    name = "sglang"

    def __init__(self, *, balance_abs_threshold: float = 32.0, balance_rel_threshold: float = 1.0001,
                 cache_threshold: float = 0.5, **kw):
        super().__init__(**kw)
        _chunk_name(self)
        self.balance_abs_threshold = _number("sglang", "balance_abs_threshold", balance_abs_threshold)
        self.balance_rel_threshold = _number("sglang", "balance_rel_threshold", balance_rel_threshold)
        self.cache_threshold = _number("sglang", "cache_threshold", cache_threshold)
        if self.cache_threshold > 1.0:
            raise ScenarioError(f"sglang: cache_threshold = {cache_threshold!r}: expected a match rate in [0, 1]")

    def route(self, ctx: Context, r: int) -> int:
        n = self.n
        load = [ctx.instance_requests(g) for g in range(n)]
        least = min(range(n), key=lambda g: (load[g], g))
        lo, hi = load[least], max(load)
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            return least
        match = [ctx.cached_prefix_tokens(r, g) for g in range(n)]
        best = min(range(n), key=lambda g: (-match[g], load[g], g))
        if match[best] < self.cache_threshold * ctx.req_prompt(r):
            return least
        return best


class LLMDScorer(InstanceScheduler):
    """llm-d's weighted scorer: prefix match, queue and KV utilisation (module docstring)."""

    name = "llm-d"

    def __init__(self, *, prefix_weight: float = 3.0, queue_weight: float = 2.0, kv_weight: float = 2.0, **kw):
        super().__init__(**kw)
        _chunk_name(self)
        self.prefix_weight = _number("llm-d", "prefix_weight", prefix_weight)
        self.queue_weight = _number("llm-d", "queue_weight", queue_weight)
        self.kv_weight = _number("llm-d", "kv_weight", kv_weight)

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        free = ctx.gpu_kv_free(0)
        self._kv_cap = None if free == math.inf else float(free)  # at setup every GPU is empty

    def route(self, ctx: Context, r: int) -> int:
        n = self.n
        load = [ctx.instance_requests(g) for g in range(n)]
        lo, hi = min(load), max(load)
        prompt = ctx.req_prompt(r)
        cap = self._kv_cap
        best, key = 0, None
        for g in range(n):
            s = self.prefix_weight * ctx.cached_prefix_tokens(r, g) / prompt
            s += self.queue_weight * ((hi - load[g]) / (hi - lo) if hi > lo else 1.0)
            s += self.kv_weight * (1.0 - ctx.gpu_kv_used(g) / cap if cap else 1.0)
            k = (-s, load[g], g)
            if key is None or k < key:
                best, key = g, k
        return best


class ConsistentHash(InstanceScheduler):
    """Consistent hashing on a request's first ``k`` block ids, optionally with bounded loads (module docstring)."""

    name = "consistent-hash"
    epsilon: float | None = None  # None: no load bound

    def __init__(self, *, k: int = 2, vnodes: int = 64, **kw):
        super().__init__(**kw)
        for nm, v in (("k", k), ("vnodes", vnodes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ScenarioError(f"{type(self).name}: {nm} = {v!r}: expected an integer >= 1")
        self.k, self.vnodes = k, vnodes
        _chunk_name(self)

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        pts, owner = _ring(self.n, self.vnodes)
        self._pts, self._owner = pts.tolist(), owner.tolist()

    def route(self, ctx: Context, r: int) -> int:
        import bisect

        n = self.n
        blocks = ctx.req_blocks(r)
        if len(blocks) == 0:
            return min(range(n), key=lambda g: (ctx.instance_requests(g), g))
        key = _h64(",".join(str(int(b)) for b in blocks[: self.k]).encode())
        pos = bisect.bisect_left(self._pts, key)
        m = len(self._owner)
        if self.epsilon is None:
            return self._owner[pos % m]
        total = sum(ctx.instance_requests(g) for g in range(n))
        bound = math.ceil((1.0 + self.epsilon) * (total + 1) / n)
        for step in range(m):
            g = self._owner[(pos + step) % m]
            if ctx.instance_requests(g) < bound:
                return g
        return self._owner[pos % m]  # (unreachable: some instance is below the average bound)


class ConsistentHashBounded(ConsistentHash):
    """Consistent hashing with bounded loads: past instances at ``ceil((1 + epsilon) * (total + 1) / n)``."""

    name = "consistent-hash-bounded"

    def __init__(self, *, epsilon: float = 0.25, **kw):
        super().__init__(**kw)
        self.epsilon = _number("consistent-hash-bounded", "epsilon", epsilon)


def _build_sglang(scenario: Scenario, **kw) -> SGLangRouter:
    return SGLangRouter(**kw)


def _build_llmd(scenario: Scenario, **kw) -> LLMDScorer:
    return LLMDScorer(**kw)


def _build_ch(scenario: Scenario, **kw) -> ConsistentHash:
    return ConsistentHash(**kw)


def _build_chb(scenario: Scenario, **kw) -> ConsistentHashBounded:
    return ConsistentHashBounded(**kw)


_registered("sglang", (), "SGLang's cache-aware router: the longest cached prefix unless loads are imbalanced "
            "(options balance_abs_threshold=32, balance_rel_threshold=1.0001, cache_threshold=0.5)", _build_sglang)
_registered("llm-d", (), "llm-d's weighted scorer: prefix match + queue + KV utilisation "
            "(options prefix_weight=3, queue_weight=2, kv_weight=2)", _build_llmd)
_registered("consistent-hash", (), "consistent hashing on a request's first k block ids: session affinity "
            "(options k=2, vnodes=64)", _build_ch)
_registered("consistent-hash-bounded", (), "consistent hashing with bounded loads on the first k block ids "
            "(options k=2, vnodes=64, epsilon=0.25)", _build_chb)
