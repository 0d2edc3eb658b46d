"""Classic load balancers over instance-local continuous batching (docs/routing.md).

Every balancer here is an :class:`~fluidopt.control.instance.InstanceScheduler`: each GPU is a
vLLM-like instance with its own FCFS queue and prefill-first continuous batching, and the balancer
only decides *which instance* an arriving request joins (``route``). The instance-local part
(admission, decode in place, recompute preemption) is the base class's. These are the baselines of
the workload-guided RL router paper (Jain et al. 2025) plus the standard ones from the
load-balancing literature:

==================  =========================================  ==========================
name                rule                                       state it reads
==================  =========================================  ==========================
random              uniform instance                           none (``ctx.rng``)
least-requests      fewest requests routed and unfinished      ``instance_requests``
power-of-two        fewer requests of two distinct random ones ``instance_requests``
jsq                 fewest outstanding tokens, predicted       token ledger
decode-balancer     fewest outstanding output tokens, oracle   token ledger (oracle)
max-capacity        most free capacity among instances that    slots, KV, token ledger
                    fit the head, else it waits at the router
max-capacity-       the same, fitting prompt + predicted       slots, KV, token ledger
reserve             output
max-capacity-       most free capacity, chosen once a second   slots, KV, token ledger
interval
min-min             earliest estimated completion time         token ledger, GPU profile
small-large         instance groups by predicted output        token ledger
==================  =========================================  ==========================

Each name also exists as ``<name>-chunked`` (chunked prefill, Sarathi-style mixed iterations); the
plain names run vLLM's classic prefill-first scheduler without chunking, like ``round-robin``.

*Token ledger.* Several balancers need each instance's outstanding work in tokens. The engine's view
knows requests and KV usage but not a router's *predictions*, so :class:`TokenLedgerScheduler`
keeps, per instance g, from the events it sees: the prompt tokens whose prefill has not finished
(a recomputed prefill after a preemption counts prompt + generated tokens again), their number, and
the predicted output tokens of every request routed to g and not finished. A prediction counts in
full until its request completes. With true lengths (the oracle) the output generated so far is
subtracted, read in O(1) from the KV cache the instance holds (tokens mode: resident context minus
the prompts of the decoding requests, plus what preempted requests had generated): exact remaining
work. Subtracting generated tokens from a mere prediction would let a request that outlives its
prediction cancel its neighbours' work and draw traffic to the busiest instance. In
``service="markov"`` nothing is generated token by token (service times are exponential with
class-mean rates), so predictions always count in full: by memorylessness, the expected remaining
work of a class-mean prediction.

*Predictions.* ``predictor``: ``"mean"`` (default: the class-mean output D_i of the scenario, what a
router knows without a length predictor; never the true length), ``"oracle"`` (the request's true
output length, ``ctx.req_output``), or any callable ``f(ctx, r) -> tokens``. In markov service the
true lengths do not drive service times, so an oracle there carries no information.

*Ties* in an argmin/argmax scan go to the first instance in cyclic order starting just after the
instance chosen last (deterministic, and it spreads load when all instances look alike, e.g. empty).

*Cost.* One decision is an O(n) scan over the n instances with O(1) work each (a few view calls);
ledger updates are O(1) per event. Power of two choices is O(1); random is O(1).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

from fluidopt.control.instance import InstanceScheduler
from fluidopt.control.protocol import Context
from fluidopt.control.registration import register
from fluidopt.control.token_ledger import (  # noqa: F401  (re-exported: the balancers' public names)
    INF,
    ClassMeanOutput,
    OutputPredictor,
    TokenLedgerScheduler,
    _chunk_name,
    _CyclicArg,
    _no_output,
    backlog_seconds,
    oracle_output,
    prefill_seconds,
    resolve_predictor,
)
from fluidopt.core.errors import ScenarioError, UsageError
from fluidopt.core.model import GPUProfile, Scenario

__all__ = [
    "ClassMeanOutput",
    "DecodeBalancer",
    "JoinShortestQueue",
    "LeastRequests",
    "MaxCapacity",
    "MaxCapacityInterval",
    "MinMin",
    "OutputPredictor",
    "PowerOfTwo",
    "RandomRouter",
    "SmallLarge",
    "TokenLedgerScheduler",
    "oracle_output",
    "resolve_predictor",
]

class RandomRouter(InstanceScheduler):
    """Send each arrival to a uniformly random instance (the controller's stream ``ctx.rng``)."""

    name = "random"

    def __init__(self, **kw):
        super().__init__(**kw)
        _chunk_name(self)

    def route(self, ctx: Context, r: int) -> int:
        return ctx.rng.randrange(self.n)


class LeastRequests(_CyclicArg, InstanceScheduler):
    """Least Outstanding Requests: the instance with the fewest requests routed to it and unfinished.

    Outstanding = waiting in the instance's queue + in service on it (``ctx.instance_requests``).
    """

    name = "least-requests"

    def __init__(self, **kw):
        super().__init__(**kw)
        _chunk_name(self)

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self._start = 0

    def route(self, ctx: Context, r: int) -> int:
        return self._pick_min(self.n, ctx.instance_requests)


class PowerOfTwo(InstanceScheduler):
    """Power of two choices: two distinct uniformly random instances; the one with fewer outstanding
    requests wins (ties: the first drawn). With one instance, that instance."""

    name = "power-of-two"

    def __init__(self, **kw):
        super().__init__(**kw)
        _chunk_name(self)

    def route(self, ctx: Context, r: int) -> int:
        n = self.n
        if n == 1:
            return 0
        rng = ctx.rng
        a = rng.randrange(n)
        b = rng.randrange(n - 1)
        if b >= a:
            b += 1  # uniform over the other n - 1 instances
        return b if ctx.instance_requests(b) < ctx.instance_requests(a) else a


# =================================================================================================
# The token ledger and the balancers built on it
# =================================================================================================
class JoinShortestQueue(TokenLedgerScheduler):
    """Join the Shortest Queue in tokens: the instance with the fewest outstanding prompt + output
    tokens, output predicted by ``predictor`` (default: class means)."""

    name = "jsq"

    def __init__(self, predictor: OutputPredictor, **kw):
        super().__init__(predictor, **kw)
        _chunk_name(self)

    def route(self, ctx: Context, r: int) -> int:
        return self._pick_min(self.n, lambda g: self.outstanding_tokens(ctx, g))


class DecodeBalancer(TokenLedgerScheduler):
    """Decode Balancer: the instance with the fewest outstanding output tokens, true lengths (oracle)."""

    name = "decode-balancer"

    def __init__(self, predictor: OutputPredictor = oracle_output, **kw):
        super().__init__(predictor, **kw)
        _chunk_name(self)

    def route(self, ctx: Context, r: int) -> int:
        return self._pick_min(self.n, lambda g: self.outstanding_output(ctx, g))


class _FreeCapacity(TokenLedgerScheduler):
    """A token-ledger scheduler that measures each instance's free capacity (see :meth:`free_capacity`)."""

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self.batch = ctx.batch
        cap = ctx.gpu_kv_free(0)
        self._kvcap = None if cap == INF else float(cap)

    def free_kv(self, ctx: Context, g: int) -> float:
        """Tokens of g's KV cache free now net of the prompts waiting in g's queue (the running prefill's
        context is resident already, so it is not subtracted twice); ``inf`` without a KV capacity."""
        if self._kvcap is None:
            return INF
        queued = self._pp[g]
        p = ctx.gpu_prefill(g)
        if p >= 0:
            queued -= ctx.req_prompt(p) + ctx.req_generated(p)  # the running prefill is resident already
        return ctx.gpu_kv_free(g) - queued

    def free_capacity(self, ctx: Context, g: int) -> float:
        """Free share of g's capacity (slots, and KV cache when it is limited), net of g's queue."""
        f = (self.batch - ctx.instance_requests(g)) / self.batch
        if self._kvcap is not None:
            f = min(f, self.free_kv(ctx, g) / self._kvcap)
        return f


class MaxCapacityInterval(_FreeCapacity):
    """Maximum capacity, chosen once per interval (fluidopt's earlier ``max-capacity``): every
    ``interval`` seconds (default 1.0) pick the instance with the most free capacity; every arrival
    until the next pick goes there. Nothing waits at the router.

    Free capacity of g, as a fraction: slots ``(B - instance_requests(g)) / B`` (free slots net of
    g's queue); with a KV capacity K also ``(kv_free(g) - queued prompt tokens) / K`` (free cache net
    of the prompts waiting at g), and the smaller of the two counts. Before the first pick: instance 0.
    The paper's Maximum Capacity Usage holds the head request at the router instead
    (:class:`MaxCapacity`).
    """

    name = "max-capacity-interval"

    def __init__(self, *, interval: float = 1.0, **kw):
        # the ledger's queued prompt tokens are all it needs: no output prediction
        super().__init__(_no_output, **kw)
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not (
            math.isfinite(interval) and interval > 0
        ):
            raise ScenarioError(f"max-capacity-interval: interval: expected seconds > 0, got {interval!r}")
        self.tick_interval = float(interval)
        _chunk_name(self)

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self.target = 0

    def on_tick(self, ctx: Context) -> None:
        self.target = self._pick_min(self.n, lambda g: -self.free_capacity(ctx, g))

    def route(self, ctx: Context, r: int) -> int:
        return self.target


class MaxCapacity(_FreeCapacity):
    """Maximum Capacity Usage as Jain et al. define it: the head of the router queue goes to the
    instance with the most free capacity *that can process it*; if no instance can, it waits at the
    router (FCFS: nothing behind it is dispatched), and it is dispatched at the instant capacity frees
    (a prefill or decode completion, or a dropped request, on any instance).

    Instance g can process request r (prompt P, plus the tokens it generated before a preemption)
    when g holds no request at all, or when g has a free batch slot counting its queue
    (``instance_requests(g) < B``) and its free KV cache net of the prompts queued there and the
    scheduler's watermark (:meth:`free_kv`) holds ``need(r)`` tokens: P for ``max-capacity``,
    P + the predicted output for the reserving variant ``max-capacity-reserve`` (``reserve=True``;
    the prediction is the ``predictor``'s, default the class mean, capped at the usable cache so
    that a long prediction waits for an instance with that much room rather than for ever). Among
    the instances that can, the one with the most free capacity (:meth:`free_capacity`) wins; ties in
    cyclic order after the last choice.
    """

    name = "max-capacity"

    def __init__(self, predictor: OutputPredictor = _no_output, *, reserve: bool = False, **kw):
        super().__init__(predictor, **kw)
        if not isinstance(reserve, bool):
            raise ScenarioError(f"max-capacity: reserve: expected true or false, got {reserve!r}")
        self.reserve = reserve
        if reserve:
            self.name = "max-capacity-reserve"
        _chunk_name(self)
        if reserve and self.chunked_prefill:
            self.name = "max-capacity-reserve-chunked"

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self._res = self.kv_watermark * self._kvcap if self._kvcap is not None else 0.0
        self.holds = 0  # arrivals that waited at the router

    def need(self, ctx: Context, r: int) -> float:
        """KV tokens request r must find free on an instance (prompt + generated; + predicted output)."""
        n = ctx.req_prompt(r) + ctx.req_generated(r)
        if self.reserve:
            n += self.predict(ctx, r)
            if self._kvcap is not None:
                n = min(n, self._kvcap - self._res)
        return n

    def can_process(self, ctx: Context, g: int, need: float) -> bool:
        """Whether instance g can take a request needing ``need`` KV tokens now (class doc)."""
        n_g = ctx.instance_requests(g)
        if n_g == 0:
            return True
        if n_g >= self.batch:
            return False
        return self.free_kv(ctx, g) - self._res >= need

    def choose(self, ctx: Context, r: int) -> int:
        """The instance for r: the most free capacity among those that can process it; -1 if none."""
        need = self.need(ctx, r)
        n = self.n
        s = self._start if self._start < n else 0
        best, bv = -1, -INF
        g = s
        for _ in range(n):
            if self.can_process(ctx, g, need):
                v = self.free_capacity(ctx, g)
                if v > bv:
                    best, bv = g, v
            g = g + 1 if g + 1 < n else 0
        if best >= 0:
            self._start = best + 1 if best + 1 < n else 0
        return best

    def route(self, ctx: Context, r: int) -> int | None:
        if ctx.qlen(self.router_queue):
            self.holds += 1
            return None  # FCFS: r queues behind the held head
        g = self.choose(ctx, r)
        if g < 0:
            self.holds += 1
            return None
        return g

    def release(self, ctx: Context) -> None:
        """Dispatch the router queue's head while some instance can process it (FCFS)."""
        q = self.router_queue
        while ctx.qlen(q):
            r = ctx.head(q)
            g = self.choose(ctx, r)
            if g < 0:
                return
            self.dispatch(ctx, r, g)

    def on_slot_freed(self, ctx: Context, g: int) -> None:
        super().on_slot_freed(ctx, g)
        self.release(ctx)

    def on_drop(self, ctx: Context, r: int, g: int) -> None:
        super().on_drop(ctx, r, g)
        self.release(ctx)

    def on_abandon(self, ctx: Context, r: int, q: int) -> None:
        super().on_abandon(ctx, r, q)
        self.release(ctx)  # the head may have left the router queue


class MinMin(TokenLedgerScheduler):
    """Min-Min: the instance where the request is estimated to complete earliest.

    Estimated completion of r (prompt P, predicted output D) on g, in seconds from now::

        max(T_slot, T_backlog) + T_prefill(P) + D * tau_d(g)

    * tau_d(g) = tau_solo + kv_time_per_token * (KV tokens on g): g's current decode iteration.
    * T_backlog: the prefills routed to g and unfinished, k prompts of W tokens in all, run first
      (FCFS, prefill first): k alpha + beta W without chunking; (W / C + k / 2) tau_mix with
      chunked prefill (half a chunk of rounding per prompt).
    * T_slot: with N = ``instance_requests(g)`` >= B, r waits for N + 1 - B slots to free; slots
      turn over at B per (mean outstanding output per request) * tau_d(g), so
      T_slot = (N + 1 - B) * (O / N) * tau_d(g) / B with O the outstanding predicted output on g.
    * T_prefill(P) = alpha + beta P without chunking, ceil(P / C) tau_mix with chunking.

    With the GPU's ``timemodel`` (docs/simulator.md section 1.3) the three come from that law instead:
    tau_d(g) is its decode step at g's decodes and KV tokens, T_prefill and T_backlog its prefill time
    (``token_ledger.prefill_seconds``, ``backlog_seconds``).
    """

    name = "min-min"

    def __init__(self, predictor: OutputPredictor, gpu: GPUProfile, **kw):
        super().__init__(predictor, **kw)
        if not isinstance(gpu, GPUProfile):
            raise ScenarioError(f"min-min: gpu: expected a GPUProfile (the iteration-time law), got {gpu!r}")
        self.gpu = gpu
        _chunk_name(self)

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self.batch = ctx.batch

    def _tau_d(self, ctx: Context, g: int) -> float:
        gpu = self.gpu
        if gpu.timemodel is not None:  # the law's decode step at g's batch and KV (none known in markov mode)
            return gpu.timemodel.decode.time(ctx.gpu_kv_used(g) if self._tok else 0, max(1, ctx.gpu_decodes(g)))
        if gpu.kv_time_per_token and self._tok:
            return gpu.tau_solo + gpu.kv_time_per_token * ctx.gpu_kv_used(g)
        return gpu.tau_solo

    def prefill_time(self, prompt: int) -> float:
        """Seconds of one prefill of ``prompt`` tokens on an instance."""
        return prefill_seconds(self.gpu, prompt, self.chunked_prefill)

    def completion_estimate(self, ctx: Context, g: int, prompt: int, output: float) -> float:
        """Estimated seconds until a request (``prompt``, predicted ``output`` tokens) sent to g completes."""
        tau = self._tau_d(ctx, g)
        backlog = backlog_seconds(self.gpu, self._pk[g], self._pp[g], self.chunked_prefill)
        N = ctx.instance_requests(g)
        B = self.batch
        wait = backlog
        if N >= B:
            t_slot = (N + 1 - B) * (self.outstanding_output(ctx, g) / N) * tau / B
            wait = max(wait, t_slot)
        return wait + self.prefill_time(prompt) + output * tau

    def route(self, ctx: Context, r: int) -> int:
        p = ctx.req_prompt(r) + ctx.req_generated(r)
        d = self.predict(ctx, r)
        return self._pick_min(self.n, lambda g: self.completion_estimate(ctx, g, p, d))


class SmallLarge(TokenLedgerScheduler):
    """Dedicated Small-Large: instances split into a small-request and a large-request group.

    A request is *small* when its predicted output is <= ``threshold`` tokens (default: the
    geometric mean of the smallest and largest class-mean outputs), else *large*. The first
    ``small_gpus`` instances serve small requests, the rest large ones. Default: the split that
    best equalises the two groups' load per instance (:meth:`plan_small_gpus`), at least one
    instance for each group that has load (n >= 2); classes go to groups by their mean output.
    ``load="tokens"`` (default) measures a class's load as rate_i (P_i + D_i), its token load;
    ``load="slots"`` as rate_i (T_prefill(P_i) + D_i tau_solo), the mean number of slots it keeps
    busy (Little's law); neither is right everywhere (docs/routing.md). A request whose group has
    no instance goes to the other group. Within a group: ``within="round-robin"`` (default) or
    ``"jsq"`` (fewest outstanding tokens, as :class:`JoinShortestQueue`).
    """

    name = "small-large"

    def __init__(self, predictor: OutputPredictor, *, threshold: float, small_share: float,
                 small_gpus: int | None = None, within: str = "round-robin", **kw):
        super().__init__(predictor, **kw)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not (
            math.isfinite(threshold) and threshold >= 0
        ):
            raise ScenarioError(f"small-large: threshold: expected output tokens >= 0, got {threshold!r}")
        if isinstance(small_share, bool) or not isinstance(small_share, (int, float)) or not 0 <= small_share <= 1:
            raise ScenarioError(f"small-large: small_share: expected a fraction in [0, 1], got {small_share!r}")
        if small_gpus is not None and (isinstance(small_gpus, bool) or not isinstance(small_gpus, int) or small_gpus < 0):
            raise ScenarioError(f"small-large: small_gpus: expected an integer >= 0, got {small_gpus!r}")
        if within not in ("round-robin", "jsq"):
            raise ScenarioError(f"small-large: within: expected 'round-robin' or 'jsq', got {within!r}")
        self.threshold = float(threshold)
        self.small_share = float(small_share)
        self.small_gpus_option = small_gpus
        self.within = within
        _chunk_name(self)

    @staticmethod
    def plan_from_scenario(scenario: Scenario, threshold: float | None = None, *, load: str = "tokens",
                           chunked: bool = False) -> tuple[float, float]:
        """(threshold, small_share): the default split of :class:`SmallLarge` from the class means."""
        if load not in ("slots", "tokens"):
            raise ScenarioError(f"small-large: load: expected 'slots' or 'tokens', got {load!r}")
        D = [c.decode for c in scenario.classes]
        if threshold is None:
            threshold = math.sqrt(min(D) * max(D))
        gpu = scenario.gpu
        if load == "tokens":
            w = [c.rate * (c.prompt + c.decode) for c in scenario.classes]
        else:
            w = [c.rate * ((math.ceil(c.prompt / gpu.chunk) * gpu.tau_mix if chunked else gpu.alpha + gpu.beta * c.prompt)
                           + c.decode * gpu.tau_solo) for c in scenario.classes]
        small = sum(x for x, c in zip(w, scenario.classes) if c.decode <= threshold)
        return float(threshold), small / sum(w)

    def plan_small_gpus(self, n: int) -> int:
        """Instances in the small group on a fleet of n.

        The option ``small_gpus`` if given; else, with small share s of the load, the k in 1..n-1 that
        minimises the larger per-instance load max(s / k, (1 - s) / (n - k)) (ties: k nearest n s);
        k = 0 when s = 0, k = n when s = 1 or n = 1 (and s > 0).
        """
        if self.small_gpus_option is not None:
            return min(self.small_gpus_option, n)
        s = self.small_share
        if s <= 0.0:
            return 0
        if s >= 1.0 or n == 1:
            return n
        return min(range(1, n), key=lambda k: (max(s / k, (1.0 - s) / (n - k)), abs(k - n * s)))

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        k = self.plan_small_gpus(self.n)
        self.small_gpus = k
        self._groups = ((0, k), (k, self.n))  # [lo, hi) of the small and the large group
        self._rr = [0, k]

    def route(self, ctx: Context, r: int) -> int:
        large = self.predict(ctx, r) > self.threshold
        lo, hi = self._groups[large]
        if hi <= lo:
            large = not large
            lo, hi = self._groups[large]
        if self.within == "jsq":
            best, bv = lo, INF
            for g in range(lo, hi):
                v = self.outstanding_tokens(ctx, g)
                if v < bv:
                    best, bv = g, v
            return best
        g = self._rr[large]
        if not lo <= g < hi:
            g = lo
        self._rr[large] = g + 1 if g + 1 < hi else lo
        return g


# =================================================================================================
# Registry
# =================================================================================================
_SUPPLIED = {"self", "predictor", "gpu", "means", "threshold", "small_share", "kw", "kwargs"}


def _option_names(build: Callable[..., InstanceScheduler]) -> tuple[str, ...]:
    """The options a balancer takes: its builder's keywords and those of its class's constructors."""
    import typing

    names = [p.name for p in list(inspect.signature(build).parameters.values())[1:]
             if p.kind is not p.VAR_KEYWORD]
    cls = typing.get_type_hints(build).get("return")
    for klass in getattr(cls, "__mro__", ()):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in _SUPPLIED and p.name not in names:
                names.append(p.name)
    return tuple(names)


def _registered(name: str, aliases: tuple[str, ...], description: str, build: Callable[..., InstanceScheduler]) -> None:
    names = _option_names(build)

    def make(nm: str, scenario: Scenario, options: dict, allowed: tuple[str, ...]) -> InstanceScheduler:
        bad = sorted(k for k in options if k not in allowed)
        if bad:
            raise UsageError(f"policy {nm!r}: unknown option {', '.join(map(repr, bad))}; "
                             f"it takes: {', '.join(allowed)}")
        return build(scenario, **options)

    def plain(scenario: Scenario, **options) -> InstanceScheduler:
        return make(name, scenario, options, names)

    def chunked(scenario: Scenario, **options) -> InstanceScheduler:
        allowed = tuple(k for k in names if k != "chunked")
        return make(f"{name}-chunked", scenario, options, allowed) if set(options) - set(allowed) else \
            build(scenario, chunked=True, **options)

    plain.options = names
    chunked.options = tuple(k for k in names if k != "chunked")
    register(name, plain, description=f"{description} (instances: prefill first, no chunking)", aliases=aliases)
    register(f"{name}-chunked", chunked, description=f"{description} (instances: chunked prefill)",
             aliases=tuple(f"{a}-chunked" for a in aliases))


def _build_random(scenario: Scenario, **kw) -> RandomRouter:
    return RandomRouter(**kw)


def _build_lor(scenario: Scenario, **kw) -> LeastRequests:
    return LeastRequests(**kw)


def _build_po2(scenario: Scenario, **kw) -> PowerOfTwo:
    return PowerOfTwo(**kw)


def _build_jsq(scenario: Scenario, *, predictor: str | OutputPredictor = "mean", **kw) -> JoinShortestQueue:
    return JoinShortestQueue(resolve_predictor(predictor, scenario), **kw)


def _build_db(scenario: Scenario, *, predictor: str | OutputPredictor = "oracle", **kw) -> DecodeBalancer:
    return DecodeBalancer(resolve_predictor(predictor, scenario), **kw)


def _build_mcu_interval(scenario: Scenario, **kw) -> MaxCapacityInterval:
    return MaxCapacityInterval(**kw)


def _build_mcu(scenario: Scenario, **kw) -> MaxCapacity:
    return MaxCapacity(**kw)


def _build_mcu_reserve(scenario: Scenario, *, predictor: str | OutputPredictor = "mean", **kw) -> MaxCapacity:
    return MaxCapacity(resolve_predictor(predictor, scenario), reserve=True, **kw)


def _build_minmin(scenario: Scenario, *, predictor: str | OutputPredictor = "mean", **kw) -> MinMin:
    return MinMin(resolve_predictor(predictor, scenario), scenario.gpu, **kw)


def _build_sl(scenario: Scenario, *, predictor: str | OutputPredictor = "mean", threshold: float | None = None,
              load: str = "tokens", **kw) -> SmallLarge:
    thr, share = SmallLarge.plan_from_scenario(scenario, threshold, load=load, chunked=bool(kw.get("chunked")))
    return SmallLarge(resolve_predictor(predictor, scenario), threshold=thr, small_share=share, **kw)


_register_specs = (
    ("random", (), "uniformly random instance", _build_random),
    ("least-requests", ("lor", "least-outstanding-requests"), "fewest outstanding requests per instance", _build_lor),
    ("power-of-two", ("po2", "p2c"), "fewer outstanding requests of two random instances", _build_po2),
    ("jsq", ("join-shortest-queue",), "fewest outstanding prompt + predicted output tokens", _build_jsq),
    ("decode-balancer", (), "fewest outstanding output tokens, oracle lengths", _build_db),
    ("max-capacity", ("mcu", "maximum-capacity-usage"),
     "most free capacity among the instances that fit the head's prompt, else it waits at the router", _build_mcu),
    ("max-capacity-reserve", ("mcu-reserve",),
     "most free capacity among the instances that fit prompt + predicted output, else it waits at the router",
     _build_mcu_reserve),
    ("max-capacity-interval", (), "most free capacity, chosen once a second, nothing waits", _build_mcu_interval),
    ("min-min", (), "earliest estimated completion time", _build_minmin),
    ("small-large", ("dedicated-small-large",), "instance groups for small and large predicted outputs", _build_sl),
)
for _name, _aliases, _desc, _build in _register_specs:
    _registered(_name, _aliases, _desc, _build)
del _name, _aliases, _desc, _build
