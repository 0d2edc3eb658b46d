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
* ``dynamo-kv``: NVIDIA Dynamo's KV router (:class:`DynamoKV`): the lowest cost
  ``overlap_score_weight * prefill_blocks + decode_blocks``, where ``prefill_blocks`` is the prompt
  tokens the instance would have to prefill, its routed prefills not yet done plus this request's
  uncached tokens, over the block size, and ``decode_blocks`` the distinct KV blocks of the requests
  routed to it and not finished, this request's included. Defaults 1.0 and temperature 0 (Dynamo's).
* ``mooncake``: Mooncake's Conductor (:class:`MooncakeConductor`), the scheduler of the system whose trace
  this is: the instance of the lowest estimated TTFT, its prefill queue's time plus this request's prefill
  of its uncached tokens, both from the scenario's iteration-time law.
"""

from __future__ import annotations

import math
import random

from fluidopt.control.instance import InstanceScheduler
from fluidopt.control.load_balancers import _registered
from fluidopt.control.protocol import Context
from fluidopt.control.token_ledger import _chunk_name, backlog_seconds, prefill_seconds
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import GPUProfile, Scenario
from fluidopt.workloads.prefix import _h64, _ring

__all__ = ["ConsistentHash", "ConsistentHashBounded", "DynamoKV", "LLMDScorer", "MooncakeConductor", "SGLangRouter"]


def _number(owner: str, name: str, v: object, low: float = 0.0) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < low:
        raise ScenarioError(f"{owner}: {name} = {v!r}: expected a finite number >= {low:g}")
    return float(v)


def _lowest(ctx: Context, score: list[float]) -> int:
    """The instance of the lowest score; ties go to the fewest outstanding requests, then the lowest index."""
    lo = min(score)
    return min((g for g in range(len(score)) if score[g] == lo), key=lambda g: (ctx.instance_requests(g), g))


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


class DynamoKV(InstanceScheduler):
    """NVIDIA Dynamo's KV router: the instance of lowest prefill-plus-decode cost, in KV blocks.

    Formula and defaults from Dynamo's router (docs.nvidia.com/dynamo, "Routing Concepts", *Cost
    Calculation*; ai-dynamo/dynamo ``lib/llm/src/kv_router/scheduler.rs``, ``DefaultWorkerSelector``
    and ``softmax_sample``; ``sequence.rs``, the per-worker active blocks and prefill tokens;
    ``config.rs``, ``KvRouterConfig::default``). For arrival r and instance g, with ``bs`` tokens a block:

    * ``prefill_blocks(g) = (pending(g) + prompt - cached(r, g)) / bs``: ``pending(g)``, the uncached
      prompt tokens of the requests routed to g whose prefill has not completed (each counted as it was
      at its routing; cleared when its prefill completes), plus r's own uncached tokens
      (``ctx.cached_prefix_tokens(r, g)``);
    * ``decode_blocks(g) = active(g) + new(r, g)``: ``active(g)``, the distinct block ids of the
      requests routed to g and not finished (a block two requests share counts once), and ``new``, r's
      complete blocks (the first ``prompt // bs`` of ``ctx.req_blocks(r)``) not among them. A request
      without block ids counts ``prompt // bs`` blocks of its own;
    * ``cost(g) = overlap_score_weight * prefill_blocks(g) + decode_blocks(g)``; lower is better.

    ``router_temperature`` 0 takes the lowest cost; ties go to the fewest outstanding requests
    (``ctx.instance_requests``), then the lowest index (Dynamo breaks them by the smaller cached tree,
    then at random; the view has no tree sizes). Above 0 it samples g with probability proportional to
    ``exp(-(cost(g) - min cost) / ((max cost - min cost) * temperature))`` (uniform when all costs are
    equal), drawing one number from ``random.Random(seed)`` or, with ``seed`` None, from ``ctx.rng``.

    Like Dynamo's router it tracks what it routed itself, from the protocol's events, so it runs the same
    over the simulator and over a router's :class:`~fluidopt.control.snapshot.ClusterSnapshot`. Like it,
    it does not see preemptions: a preempted request stays active on its instance and its re-prefill is
    not counted. ``block_size`` must be the workload's (Mooncake's 512): block ids and prefill tokens are
    compared in those blocks.
    """

    name = "dynamo-kv"

    def __init__(self, *, overlap_score_weight: float = 1.0, router_temperature: float = 0.0,
                 block_size: int = 512, seed: int | None = None, **kw):
        super().__init__(**kw)
        _chunk_name(self)
        self.overlap_score_weight = _number("dynamo-kv", "overlap_score_weight", overlap_score_weight)
        self.router_temperature = _number("dynamo-kv", "router_temperature", router_temperature)
        for nm, v, low in (("block_size", block_size, 1), ("seed", seed, 0)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < low):
                raise ScenarioError(f"dynamo-kv: {nm} = {v!r}: expected an integer >= {low}")
        if block_size is None:
            raise ScenarioError("dynamo-kv: block_size = None: expected an integer >= 1 (tokens)")
        self.block_size, self.seed = block_size, seed

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        n = self.n
        self._rng = None if self.seed is None else random.Random(self.seed)
        self._pending = [0] * n  # uncached prompt tokens of routed prefills not yet done (tokens)
        self._active: list[dict[int, int]] = [{} for _ in range(n)]  # block id -> routed requests holding it
        self._anon = [0] * n  # blocks of active requests without block ids
        self._rec: dict[int, list] = {}  # r -> [g, pending tokens (0 once prefilled), block ids, own blocks]

    def _blocks(self, ctx: Context, r: int) -> tuple[tuple[int, ...], int]:
        """r's complete blocks: (their ids, or () without ids; their count)."""
        full = ctx.req_prompt(r) // self.block_size
        ids = tuple(int(b) for b in ctx.req_blocks(r)[:full])
        return ids, (len(ids) if ids else full)

    def costs(self, ctx: Context, r: int) -> list[float]:
        """Dynamo's cost of routing r to each instance (blocks; the class docstring)."""
        prompt, bs, w = ctx.req_prompt(r), self.block_size, self.overlap_score_weight
        ids, own = self._blocks(ctx, r)
        out = []
        for g in range(self.n):
            act = self._active[g]
            new = sum(1 for b in ids if b not in act) if ids else own
            prefill = (self._pending[g] + prompt - ctx.cached_prefix_tokens(r, g)) / bs
            out.append(w * prefill + len(act) + self._anon[g] + new)
        return out

    def route(self, ctx: Context, r: int) -> int:
        c = self.costs(ctx, r)
        n = self.n
        lo, hi = min(c), max(c)
        t = self.router_temperature
        if t == 0.0 or hi == lo:
            if t > 0.0:  # equal costs: Dynamo samples uniformly
                return min(int(self._draw(ctx) * n), n - 1)
            return _lowest(ctx, c)
        p = [math.exp(-(c[g] - lo) / ((hi - lo) * t)) for g in range(n)]
        u = self._draw(ctx) * sum(p)
        acc = 0.0
        for g in range(n):
            acc += p[g]
            if u < acc:
                return g
        return n - 1  # (rounding: u at the very top)

    def _draw(self, ctx: Context) -> float:
        return (self._rng or ctx.rng).random()

    # -- the router's own ledger, kept from the protocol's events ------------------------------------
    def _free(self, r: int) -> None:
        rec = self._rec.pop(r, None)
        if rec is None:
            return
        g, pend, ids, own = rec
        self._pending[g] -= pend
        act = self._active[g]
        for b in ids:
            k = act[b] - 1
            if k:
                act[b] = k
            else:
                del act[b]
        if not ids:
            self._anon[g] -= own

    def dispatch(self, ctx: Context, r: int, g: int) -> None:
        self._free(r)  # r's id was recycled: its previous holder left without a callback
        pend = max(0, ctx.req_prompt(r) - ctx.cached_prefix_tokens(r, g))
        ids, own = self._blocks(ctx, r)
        self._pending[g] += pend
        act = self._active[g]
        for b in ids:
            act[b] = act.get(b, 0) + 1
        if not ids:
            self._anon[g] += own
        self._rec[r] = [g, pend, ids, own]
        super().dispatch(ctx, r, g)

    def on_prefill_done(self, ctx: Context, r: int, g: int) -> None:
        rec = self._rec.get(r)
        if rec is not None and rec[1]:
            self._pending[rec[0]] -= rec[1]
            rec[1] = 0
        super().on_prefill_done(ctx, r, g)

    def on_decode_done(self, ctx: Context, r: int, g: int) -> None:
        self._free(r)

    def on_abandon(self, ctx: Context, r: int, q: int) -> None:
        self._free(r)

    def on_drop(self, ctx: Context, r: int, g: int) -> None:
        self._free(r)


class MooncakeConductor(InstanceScheduler):
    """Mooncake's Conductor: the instance where the request's first token is estimated to come soonest.

    From Mooncake's KVCache-centric scheduling (Qin et al., "Mooncake: Trading More Storage for Less
    Computation", FAST 2025, Algorithm 1): for each prefill instance, the estimated TTFT is the time its
    prefill queue needs plus this request's prefill given the prefix cached there, and the request goes to
    the lowest. Both estimates come from the scenario's iteration-time law (``gpu``), in seconds:

    * ``T_prefill(u) = alpha + beta * u`` for ``u = max(1, prompt - cached(r, g))`` uncached tokens
      (``ctx.cached_prefix_tokens``; the engine prefills at least one token); with chunked prefill
      ``ceil(u / C) * tau_mix``;
    * ``T_queue(g) = k * alpha + beta * W``: the k prefills routed to g and not yet done, W uncached tokens in
      all, each counted as it was at its routing (prefill first: each is its own iteration); with chunked
      prefill ``(W / C + k / 2) * tau_mix``, half a chunk of rounding a prompt (as ``min-min``);
    * with the GPU's ``timemodel`` (docs/simulator.md section 1.3) both come from that law
      (``token_ledger.prefill_seconds``: the u tokens' attention over the cached prefix included);
    * ``cost(g) = T_queue(g) + T_prefill(u_g)``; ties go to the fewest outstanding requests
      (``ctx.instance_requests``), then the lowest index.

    What Mooncake does that this does not: its instances share a distributed KV store, so when another
    instance holds a much longer prefix (``kvcache_balancing_threshold``) the Conductor copies those blocks over
    and charges the transfer; here each instance's cache is its own and nothing moves between them. Its
    decode side (prefill/decode disaggregation) and its early rejection against TTFT and TBT SLOs are not
    modelled: every instance here is colocated, and every request is served. Like ``dynamo-kv`` it keeps its
    own ledger from the protocol's events (the same over the simulator and a
    :class:`~fluidopt.control.snapshot.ClusterSnapshot`) and does not see preemptions.
    """

    name = "mooncake"

    def __init__(self, gpu: GPUProfile, **kw):
        super().__init__(**kw)
        if not isinstance(gpu, GPUProfile):
            raise ScenarioError(f"mooncake: gpu: expected a GPUProfile (the iteration-time law), got {gpu!r}")
        self.gpu = gpu
        _chunk_name(self)

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self._k = [0] * self.n  # routed prefills not yet done
        self._w = [0] * self.n  # their uncached prompt tokens, as at routing
        self._rec: dict[int, tuple[int, int]] = {}  # r -> (g, uncached tokens) until its prefill completes

    def prefill_time(self, tokens: int, cached: int = 0) -> float:
        """Seconds to prefill ``tokens`` uncached tokens over ``cached`` cached ones on one instance (the
        class docstring; the cached tokens matter only to a law's attention term)."""
        return prefill_seconds(self.gpu, tokens, self.chunked_prefill, cached)

    def queue_time(self, g: int) -> float:
        """Seconds of routed, unfinished prefill ahead of a new request on instance g."""
        return backlog_seconds(self.gpu, self._k[g], self._w[g], self.chunked_prefill)

    def _uncached(self, ctx: Context, r: int, g: int) -> int:
        return max(1, ctx.req_prompt(r) - ctx.cached_prefix_tokens(r, g))

    def ttft_estimates(self, ctx: Context, r: int) -> list[float]:
        """Estimated TTFT of r on each instance (seconds): queue plus its own prefill."""
        P = ctx.req_prompt(r)
        out = []
        for g in range(self.n):
            u = self._uncached(ctx, r, g)
            out.append(self.queue_time(g) + self.prefill_time(u, P - u))
        return out

    def route(self, ctx: Context, r: int) -> int:
        return _lowest(ctx, self.ttft_estimates(ctx, r))

    def dispatch(self, ctx: Context, r: int, g: int) -> None:
        self._done(r)  # r's id was recycled: its previous holder left without a callback
        u = self._uncached(ctx, r, g)
        self._k[g] += 1
        self._w[g] += u
        self._rec[r] = (g, u)
        super().dispatch(ctx, r, g)

    def _done(self, r: int) -> None:
        rec = self._rec.pop(r, None)
        if rec is not None:
            g, u = rec
            self._k[g] -= 1
            self._w[g] -= u

    def on_prefill_done(self, ctx: Context, r: int, g: int) -> None:
        self._done(r)
        super().on_prefill_done(ctx, r, g)

    def on_decode_done(self, ctx: Context, r: int, g: int) -> None:
        self._done(r)

    def on_abandon(self, ctx: Context, r: int, q: int) -> None:
        self._done(r)

    def on_drop(self, ctx: Context, r: int, g: int) -> None:
        self._done(r)


def _build_sglang(scenario: Scenario, **kw) -> SGLangRouter:
    return SGLangRouter(**kw)


def _build_llmd(scenario: Scenario, **kw) -> LLMDScorer:
    return LLMDScorer(**kw)


def _build_ch(scenario: Scenario, **kw) -> ConsistentHash:
    return ConsistentHash(**kw)


def _build_dynamo(scenario: Scenario, **kw) -> DynamoKV:
    return DynamoKV(**kw)


def _build_chb(scenario: Scenario, **kw) -> ConsistentHashBounded:
    return ConsistentHashBounded(**kw)


def _build_mooncake(scenario: Scenario, **kw) -> MooncakeConductor:
    return MooncakeConductor(scenario.gpu, **kw)


_registered("sglang", (), "SGLang's cache-aware router: the longest cached prefix unless loads are imbalanced "
            "(options balance_abs_threshold=32, balance_rel_threshold=1.0001, cache_threshold=0.5)", _build_sglang)
_registered("llm-d", (), "llm-d's weighted scorer: prefix match + queue + KV utilisation "
            "(options prefix_weight=3, queue_weight=2, kv_weight=2)", _build_llmd)
_registered("consistent-hash", (), "consistent hashing on a request's first k block ids: session affinity "
            "(options k=2, vnodes=64)", _build_ch)
_registered("consistent-hash-bounded", (), "consistent hashing with bounded loads on the first k block ids "
            "(options k=2, vnodes=64, epsilon=0.25)", _build_chb)
_registered("dynamo-kv", (), "NVIDIA Dynamo's KV router: the lowest overlap_score_weight x prefill blocks + decode "
            "blocks (options overlap_score_weight=1, router_temperature=0, block_size=512, seed=None)", _build_dynamo)
_registered("mooncake", (), "Mooncake's Conductor: the lowest estimated TTFT, prefill queue time + the request's "
            "prefill of its uncached tokens, from the iteration-time law", _build_mooncake)
