"""The model: frozen dataclasses for a GPU profile, request classes and a scenario.

Units throughout: seconds, tokens, requests. Arrival rates in a :class:`RequestClass` are for the
whole cluster (requests per second); the fluid LP works per GPU, so :meth:`Scenario.rates` divides
by the number of GPUs. Every derived rate (tau, mu_p, mu_m, mu_s, w) is computed here and nowhere
else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fluidopt.core.demand import Demand, check_markets
from fluidopt.core.errors import ScenarioError

LENGTH_DISTRIBUTIONS = ("exponential", "fixed", "lognormal")


# Inputs beyond these are unit mistakes, and they break the solver's numerics (HiGHS treats 1e20 as
# infinite) or the simulator's integer state long before they mean anything.
MAX_MAGNITUDE = 1e12
MAX_INT = 2**31 - 1


def _check_positive(where: str, name: str, value: float, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ScenarioError(f"{where}.{name}: expected a number, got {value!r} ({type(value).__name__})")
    try:
        value = float(value)
    except OverflowError:
        raise ScenarioError(f"{where}.{name}: expected a number at most {MAX_MAGNITUDE:g}, got {value!r}") from None
    if not math.isfinite(value):
        raise ScenarioError(f"{where}.{name}: expected a finite number, got {value!r}")
    if value > MAX_MAGNITUDE:
        raise ScenarioError(f"{where}.{name}: expected a number at most {MAX_MAGNITUDE:g}, got {value!r}")
    if allow_zero:
        if value < 0:
            raise ScenarioError(f"{where}.{name}: expected a number >= 0, got {value!r}")
    elif value <= 0:
        raise ScenarioError(f"{where}.{name}: expected a number > 0, got {value!r}")
    return value


def _check_int(where: str, name: str, value: int, *, minimum: int, maximum: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ScenarioError(f"{where}.{name}: expected an integer, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ScenarioError(f"{where}.{name}: expected an integer >= {minimum}, got {value!r}")
    if value > maximum:
        raise ScenarioError(f"{where}.{name}: expected an integer at most {maximum:,}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class GPUProfile:
    """Iteration-time law of one GPU serving one model.

    A mixed iteration (one prefill chunk of ``chunk`` tokens plus decodes) takes
    ``tau_mix = alpha + beta * chunk`` seconds; a decode-only ("solo") iteration takes ``tau_solo``
    seconds, so a solo decode stream produces ``gamma = 1 / tau_solo`` tokens per second.

    Optional fields describe the instance-level setting of the RL-router paper (KV-cache limits and
    context-dependent iteration time); the fluid model ignores them.
    """

    alpha: float  # s, mixed-iteration intercept
    beta: float  # s per prefill token in the chunk
    tau_solo: float  # s, decode-only iteration
    chunk: int  # C, prefill tokens per mixed iteration
    batch: int  # B, concurrent requests per GPU (prefill included)
    name: str = field(default="", compare=False)
    kv_capacity: float | None = None  # tokens of KV cache per GPU (None: unlimited)
    kv_time_per_token: float = 0.0  # s added to every iteration per token of resident context
    # Price of one GPU-hour (any currency; None: not priced). Capacity planning costs fleets with it;
    # it is not part of the iteration-time law, so it takes no part in comparisons.
    price_per_hour: float | None = field(default=None, compare=False)
    # The generalised iteration-time law (fluidopt.calibration.timemodels.IterationLaw: prefill quadratic in
    # the prompt, decode in context tokens and batch size). None: the straight line above. When set, the
    # tokens-mode simulator times every iteration with it; the fluid LP and markov service keep alpha,
    # beta and tau_solo (docs/simulator.md section 1.3).
    timemodel: Any = None

    def __post_init__(self) -> None:
        w = "gpu"
        _check_positive(w, "alpha", self.alpha, allow_zero=True)
        _check_positive(w, "beta", self.beta, allow_zero=True)
        _check_positive(w, "tau_solo", self.tau_solo)
        _check_int(w, "chunk", self.chunk, minimum=1)
        _check_int(w, "batch", self.batch, minimum=1)
        if self.tau_mix <= 0:
            raise ScenarioError(f"gpu: alpha + beta * chunk must be > 0, got {self.tau_mix!r}")
        if self.kv_capacity is not None:
            _check_positive(w, "kv_capacity", self.kv_capacity)
        _check_positive(w, "kv_time_per_token", self.kv_time_per_token, allow_zero=True)
        if self.price_per_hour is not None:
            _check_positive(w, "price_per_hour", self.price_per_hour, allow_zero=True)
        if self.timemodel is not None:
            if not all(hasattr(self.timemodel, k) for k in ("prefill", "decode", "mixed")):
                raise ScenarioError(f"gpu.timemodel: expected an IterationLaw (fluidopt.calibration.timemodels), got "
                                    f"{type(self.timemodel).__name__}")
            if self.kv_time_per_token:
                raise ScenarioError("gpu: give kv_time_per_token or a timemodel, not both (the law's decode term per "
                                    "context token is its KV time)")

    @classmethod
    def from_gamma(cls, alpha: float, beta: float, gamma: float, chunk: int, batch: int, **kw) -> GPUProfile:
        """Build a profile from the solo decode speed ``gamma`` (tokens/s per stream)."""
        _check_positive("gpu", "gamma", gamma)
        return cls(alpha=alpha, beta=beta, tau_solo=1.0 / gamma, chunk=chunk, batch=batch, **kw)

    @property
    def tau_mix(self) -> float:
        """Seconds per mixed iteration: alpha + beta * chunk."""
        return self.alpha + self.beta * self.chunk

    @property
    def gamma(self) -> float:
        """Tokens per second of one decode stream on a solo GPU (1 / tau_solo)."""
        return 1.0 / self.tau_solo

    @property
    def decode_buffer_free(self) -> bool:
        """Prop. 3.2 condition gamma * tau_mix >= (B - 1) / B: the bundled LP needs no decode buffer."""
        return self.gamma * self.tau_mix >= (self.batch - 1) / self.batch


@dataclass(frozen=True)
class RequestClass:
    """One class of requests.

    ``prompt`` and ``decode`` are mean token counts; ``rate`` is the cluster-wide Poisson arrival
    rate (requests/s); ``patience`` is theta, the abandonment rate (1/s) while waiting in any queue
    (0 means infinitely patient). ``prefill_price``/``decode_price`` override the scenario's token
    prices for this class. The ``lengths`` fields only matter to the token-level simulator.
    """

    name: str
    prompt: float  # mean prompt tokens P_i
    decode: float  # mean output tokens D_i
    rate: float  # arrivals per second, whole cluster
    patience: float = 0.0  # theta_i, 1/s
    prefill_price: float | None = None  # per prompt token
    decode_price: float | None = None  # per output token
    lengths: str = "exponential"  # distribution of token lengths: exponential, fixed, lognormal
    prompt_sigma: float | None = None  # lognormal shape of prompt length
    decode_sigma: float | None = None  # lognormal shape of output length
    # service-level objectives (simulator metrics only; None: no such objective). A request meets
    # its class's SLO when it completes with TTFT <= ttft_slo, mean inter-token latency (TPOT)
    # <= itl_slo, and completion time <= arrival + deadline and <= deadline_at (absolute seconds).
    ttft_slo: float | None = None  # s
    itl_slo: float | None = None  # s per output token
    deadline: float | None = None  # s after arrival
    deadline_at: float | None = None  # s, absolute simulation time
    # how ``rate`` responds to the class's price per request (fluidopt.core.demand; None: it does not)
    demand: Demand | None = None
    # share of prompt tokens found in a prefix cache (docs/prefix-cache.md): the fluid model prefills
    # (1 - h) x prompt per request and keeps the whole prompt in KV; the simulator does not read it yet
    hit_ratio: float = 0.0

    @property
    def prefill_tokens(self) -> float:
        """Mean prompt tokens a request prefills (tokens): (1 - hit_ratio) x prompt."""
        return (1.0 - self.hit_ratio) * self.prompt

    @property
    def has_slo(self) -> bool:
        """Whether the class has any service-level objective."""
        return any(v is not None for v in (self.ttft_slo, self.itl_slo, self.deadline, self.deadline_at))

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ScenarioError(f"classes.name: expected a non-empty string, got {self.name!r}")
        w = f"classes[{self.name}]"
        _check_positive(w, "prompt", self.prompt)
        _check_positive(w, "decode", self.decode)
        _check_positive(w, "rate", self.rate)
        _check_positive(w, "patience", self.patience, allow_zero=True)
        if self.prefill_price is not None:
            _check_positive(w, "prefill_price", self.prefill_price, allow_zero=True)
        if self.decode_price is not None:
            _check_positive(w, "decode_price", self.decode_price, allow_zero=True)
        if self.lengths not in LENGTH_DISTRIBUTIONS:
            raise ScenarioError(
                f"{w}.lengths: expected one of {', '.join(LENGTH_DISTRIBUTIONS)}, got {self.lengths!r}"
            )
        for s in ("prompt_sigma", "decode_sigma"):
            v = getattr(self, s)
            if v is not None:
                _check_positive(w, s, v)
        if self.lengths == "lognormal" and (self.prompt_sigma is None or self.decode_sigma is None):
            raise ScenarioError(f"{w}: lengths = 'lognormal' needs prompt_sigma and decode_sigma (> 0)")
        for s in ("ttft_slo", "itl_slo", "deadline"):
            v = getattr(self, s)
            if v is not None:
                _check_positive(w, s, v)
        if self.deadline_at is not None:
            _check_positive(w, "deadline_at", self.deadline_at, allow_zero=True)
        h = self.hit_ratio
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not (0.0 <= h < 1.0):
            raise ScenarioError(f"{w}.hit_ratio: expected a number in [0, 1) (the share of prompt tokens found in "
                                f"the prefix cache), got {h!r}")
        if self.demand is not None and not isinstance(self.demand, Demand):
            raise ScenarioError(f"{w}.demand: expected a fluidopt.core.demand.Demand, got {type(self.demand).__name__}")


@dataclass(frozen=True)
class Fleet:
    """A fleet whose size may change during a run (the simulator's autoscaling model).

    The scenario's ``gpus`` is the most GPUs the fleet may hold; ``initial`` of them (GPUs 0 ..
    initial-1) are online at time 0, the others offline until a controller adds them. An added GPU
    counts towards GPU-hours at once and takes work after ``startup_delay`` seconds. A request evicted
    to host memory restores its KV cache at ``kv_swap_time_per_token`` seconds per token of context
    (instead of recomputing its prefill).
    """

    initial: int | None = None  # GPUs online at t = 0 (None: all)
    startup_delay: float = 0.0  # s from adding a GPU to its first work
    kv_swap_time_per_token: float = 0.0  # s per context token to restore an evicted request's KV
    types: tuple[InstanceType, ...] = ()  # instance types a planner may mix (issue 31; the planners only)

    def __post_init__(self) -> None:
        if self.initial is not None:
            _check_int("fleet", "initial", self.initial, minimum=0)
        _check_positive("fleet", "startup_delay", self.startup_delay, allow_zero=True)
        _check_positive("fleet", "kv_swap_time_per_token", self.kv_swap_time_per_token, allow_zero=True)
        types = tuple(self.types)
        object.__setattr__(self, "types", types)
        for k, t in enumerate(types):
            if not isinstance(t, InstanceType):
                raise ScenarioError(f"fleet.types[{k}]: expected an InstanceType, got {type(t).__name__}")
        names = [t.name for t in types]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ScenarioError(f"fleet.types.name: instance type names must be unique, repeated: {', '.join(dup)}")


@dataclass(frozen=True)
class InstanceType:
    """A kind of instance a fleet may mix (issue 31): ``gpu`` its GPU profile (the iteration law),
    ``price_per_hour`` per instance-hour (default the profile's ``price_per_hour``), ``startup_delay``
    (s from adding one to its first work) and ``max`` (the most instances of this type; None: the
    cluster's maximum)."""

    name: str
    gpu: GPUProfile | None
    price_per_hour: float | None = None
    startup_delay: float = 0.0
    max: int | None = None

    def __post_init__(self) -> None:
        w = f"fleet.types[{self.name!r}]"
        if not isinstance(self.name, str) or not self.name:
            raise ScenarioError(f"fleet.types.name: expected a non-empty string, got {self.name!r}")
        if not isinstance(self.gpu, GPUProfile):
            raise ScenarioError(f"{w}.gpu: expected a GPU profile (a shipped profile's name or a table of alpha, "
                                f"beta, gamma or tau_solo, chunk, batch), got {self.gpu!r}")
        price = self.price_per_hour if self.price_per_hour is not None else self.gpu.price_per_hour
        if price is None:
            raise ScenarioError(f"{w}.price_per_hour: expected a price per instance-hour (here or in its GPU "
                                f"profile), got none")
        _check_positive(w, "price_per_hour", price, allow_zero=True)
        object.__setattr__(self, "price_per_hour", float(price))
        _check_positive(w, "startup_delay", self.startup_delay, allow_zero=True)
        if self.max is not None:
            _check_int(w, "max", self.max, minimum=0)


ARRIVAL_PROCESSES = ("poisson", "gamma", "trace", "rates")


@dataclass(frozen=True)
class ArrivalSpec:
    """Ongoing arrivals of class ``cls`` in a workflow (the scenario file's ``[[arrivals]]`` tables).

    ``process``: ``"poisson"`` (``rate`` requests/s, default the class's rate), ``"gamma"`` (a
    stationary Gamma renewal process with ``rate`` and coefficient of variation ``cv``), ``"trace"``
    (the rows of a trace file ``file``, Azure LLM inference or generic CSV, all of them this class's,
    with the trace's token counts) or ``"rates"`` (Poisson with a piecewise-constant rate: a CSV ``file``
    of per-slot rates, a ``rate`` column or one column of numbers, slots of ``slot`` seconds). Lengths
    (except for a trace) follow the class's ``prompt``, ``decode`` and ``lengths``."""

    cls: str
    process: str = "poisson"
    rate: float | None = None  # requests/s (poisson, gamma); None: the class's rate
    cv: float | None = None  # gamma only
    file: str | None = None  # trace, rates
    slot: float | None = None  # s, rates only

    def __post_init__(self) -> None:
        w = f"arrivals[{self.cls}]"
        if not isinstance(self.cls, str) or not self.cls:
            raise ScenarioError(f"arrivals.class: expected a class name, got {self.cls!r}")
        if self.process not in ARRIVAL_PROCESSES:
            raise ScenarioError(f"{w}.process: expected one of {', '.join(ARRIVAL_PROCESSES)}, got {self.process!r}")
        if self.rate is not None:
            _check_positive(w, "rate", self.rate)
        need = {"poisson": (), "gamma": ("cv",), "trace": ("file",), "rates": ("file", "slot")}[self.process]
        allowed = {"poisson": ("rate",), "gamma": ("rate", "cv"), "trace": ("file",), "rates": ("file", "slot")}
        for k in need:
            if getattr(self, k) is None:
                raise ScenarioError(f"{w}.{k}: expected a value for process = {self.process!r}, got none")
        for k in ("rate", "cv", "file", "slot"):
            if getattr(self, k) is not None and k not in allowed[self.process]:
                raise ScenarioError(f"{w}.{k}: not used by process = {self.process!r} (it takes "
                                    f"{', '.join(allowed[self.process]) or 'no option'})")
        if self.cv is not None:
            _check_positive(w, "cv", self.cv)
        if self.slot is not None:
            _check_positive(w, "slot", self.slot)
        if self.file is not None and (not isinstance(self.file, str) or not self.file):
            raise ScenarioError(f"{w}.file: expected a file path, got {self.file!r}")


@dataclass(frozen=True)
class BacklogSpec:
    """``count`` requests of class ``cls`` all arriving at ``at`` seconds (the scenario file's
    ``[[backlogs]]`` tables), due by ``deadline`` (absolute seconds; default the class's ``deadline_at``,
    or ``at`` + its ``deadline``). Lengths follow the class's ``prompt``, ``decode`` and ``lengths``."""

    cls: str
    count: int
    at: float = 0.0
    deadline: float | None = None

    def __post_init__(self) -> None:
        w = f"backlogs[{self.cls}]"
        if not isinstance(self.cls, str) or not self.cls:
            raise ScenarioError(f"backlogs.class: expected a class name, got {self.cls!r}")
        _check_int(w, "count", self.count, minimum=0)
        _check_positive(w, "at", self.at, allow_zero=True)
        if self.deadline is not None:
            _check_positive(w, "deadline", self.deadline, allow_zero=True)
            if self.deadline <= self.at:
                raise ScenarioError(f"{w}.deadline: expected a time after its arrival at = {self.at:g} s, "
                                    f"got {self.deadline:g}")


@dataclass(frozen=True)
class Workflow:
    """A whole workflow in the scenario: ongoing ``arrivals`` per class and batch ``backlogs`` (the
    file's ``[[arrivals]]`` and ``[[backlogs]]``), and the run's ``horizon`` (``[workflow] horizon``). With
    a workflow, a class gets ongoing arrivals only from an :class:`ArrivalSpec` (its ``rate`` is then
    used only by the planners)."""

    arrivals: tuple[ArrivalSpec, ...] = ()
    backlogs: tuple[BacklogSpec, ...] = ()
    horizon: float | None = None  # s: the run's default length (``fluidopt simulate``)

    def __post_init__(self) -> None:
        if self.horizon is not None:
            _check_positive("workflow", "horizon", self.horizon)
        object.__setattr__(self, "arrivals", tuple(self.arrivals))
        object.__setattr__(self, "backlogs", tuple(self.backlogs))
        seen = [a.cls for a in self.arrivals]
        dup = sorted({c for c in seen if seen.count(c) > 1})
        if dup:
            raise ScenarioError(f"arrivals: one [[arrivals]] table per class, repeated: {', '.join(dup)}")


def _check_workflow(wf: Workflow, classes: tuple[RequestClass, ...]) -> tuple[RequestClass, ...]:
    """Check a workflow against the classes; a backlog's deadline becomes its class's ``deadline_at``
    when the class has none (the simulator keeps one deadline per class). Returns the classes."""
    if not isinstance(wf, Workflow):
        raise ScenarioError(f"workflow: expected a Workflow, got {type(wf).__name__}")
    names = [c.name for c in classes]
    out = list(classes)
    for k, a in enumerate(wf.arrivals):
        if a.cls not in names:
            raise ScenarioError(f"arrivals[{k}].class: expected a class of the scenario ({', '.join(names)}), "
                                f"got {a.cls!r}")
    for k, b in enumerate(wf.backlogs):
        w = f"backlogs[{k}]"
        if b.cls not in names:
            raise ScenarioError(f"{w}.class: expected a class of the scenario ({', '.join(names)}), got {b.cls!r}")
        i = names.index(b.cls)
        c = out[i]
        if b.deadline is not None:
            if c.deadline_at is None:
                out[i] = c = replace(c, deadline_at=float(b.deadline))
            elif c.deadline_at != b.deadline:
                raise ScenarioError(f"{w}.deadline: expected the class's deadline_at = {c.deadline_at:g} s (the "
                                    f"simulator keeps one deadline per class), got {b.deadline:g}")
        if c.deadline is None and c.deadline_at is None:
            raise ScenarioError(f"{w}: class {b.cls!r} has no deadline: expected a deadline here or deadline / "
                                "deadline_at in its [[classes]] table")
        if c.deadline is None and c.deadline_at <= b.at:
            raise ScenarioError(f"{w}: the deadline of class {b.cls!r}, deadline_at = {c.deadline_at:g} s, is not "
                                f"after the backlog's arrival at = {b.at:g} s: expected a later deadline or an "
                                "earlier arrival")
    return tuple(out)


LAYOUTS = ("colocated", "disaggregated", "best")


@dataclass(frozen=True)
class Layout:
    """How a scenario's GPUs serve (issue 44): ``kind`` ``colocated`` (prefill and decode on the same
    instances, today's model), ``disaggregated`` (a prefill pool and a decode pool, the KV cache moved over a
    link) or ``best`` (the planner chooses). The other fields are the ``[pools]`` table, named as the
    ``solve`` / ``plan`` flags they stand in for (``prefill_tp`` for ``--prefill-tp``); None leaves the
    command's own default, and a flag given on the command line overrides the field.

    ``profile`` (DistServe's profiler JSON), ``colocated_profile`` and ``lengths`` (measured runs) are paths,
    resolved against the scenario file's folder when read; ``tp``: the TP degrees the placement search
    tries. Units as the flags': ``link_gbps`` GB/s, the ``*_ms`` fields milliseconds."""

    kind: str = "colocated"
    profile: str | None = None
    model: str | None = None
    prefill_tp: int | None = None
    decode_tp: int | None = None
    prefill_instances: int | None = None
    decode_instances: int | None = None
    tp: tuple[int, ...] | None = None
    link_gbps: float | None = None
    link_latency_ms: float | None = None
    prefill_max_tokens: int | None = None
    prefill_overhead_ms: float | None = None
    decode_request_ms: float | None = None
    colocated_profile: str | None = None
    colocated_request_ms: float | None = None
    lengths: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in LAYOUTS:
            raise ScenarioError(f"layout: expected one of {', '.join(map(repr, LAYOUTS))}, got {self.kind!r}")
        for k in ("profile", "model", "colocated_profile"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, str) or not v):
                raise ScenarioError(f"pools.{k}: expected a non-empty string, got {v!r}")
        for k in ("prefill_tp", "decode_tp", "prefill_max_tokens"):
            if getattr(self, k) is not None:
                object.__setattr__(self, k, _check_int("pools", k, getattr(self, k), minimum=1))
        for k in ("prefill_instances", "decode_instances"):
            v = getattr(self, k)
            if v is not None:
                if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v < 1:
                    pool = k.split("_")[0]
                    raise ScenarioError(f"pools.{k}: a disaggregated layout needs a {pool} pool, expected an "
                                        f"integer >= 1, got {v!r}")
                object.__setattr__(self, k, _check_int("pools", k, v, minimum=1))
        if (self.prefill_instances is None) != (self.decode_instances is None):
            given = "prefill_instances" if self.decode_instances is None else "decode_instances"
            raise ScenarioError(f"pools.{given}: expected prefill_instances and decode_instances together (a split "
                                f"has both pools), got {given} alone")
        if self.link_gbps is not None:
            v = self.link_gbps
            if not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating)) and v <= 0:
                raise ScenarioError(f"pools.link_gbps: expected a bandwidth in GB/s > 0, got {v!r}")
            object.__setattr__(self, "link_gbps", _check_positive("pools", "link_gbps", v))
        for k in ("link_latency_ms", "prefill_overhead_ms", "decode_request_ms", "colocated_request_ms"):
            if getattr(self, k) is not None:
                object.__setattr__(self, k, _check_positive("pools", k, getattr(self, k), allow_zero=True))
        for k, what in (("tp", "TP degrees, integers >= 1"), ("lengths", "paths of measured runs")):
            v = getattr(self, k)
            if v is None:
                continue
            if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)) or not v:
                raise ScenarioError(f"pools.{k}: expected a non-empty array of {what}, got {v!r}")
            object.__setattr__(self, k, tuple(v))
            for i, x in enumerate(v):
                if k == "tp":
                    _check_int("pools", f"tp[{i}]", x, minimum=1)
                elif not isinstance(x, str) or not x:
                    raise ScenarioError(f"pools.lengths[{i}]: expected a path (a non-empty string), got {x!r}")


@dataclass(frozen=True)
class Rates:
    """Per-class rates of a scenario, per GPU, as numpy arrays indexed by class (fluid LP inputs).

    lam: arrivals per GPU per second; theta: abandonment rate (1/s); mu_p: prefill completions
    per second of one prefill slot; mu_m / mu_s: decode completions per second of one decode slot on
    a mixed / solo GPU; prefill_reward = c_p P, decode_reward = c_d D, w = their sum (per request).
    """

    lam: np.ndarray
    theta: np.ndarray
    mu_p: np.ndarray
    mu_m: np.ndarray
    mu_s: np.ndarray
    prefill_reward: np.ndarray
    decode_reward: np.ndarray

    @property
    def w(self) -> np.ndarray:
        """Bundled reward per completed request: c_p P_i + c_d D_i."""
        return self.prefill_reward + self.decode_reward


@dataclass(frozen=True)
class Scenario:
    """A fleet of ``gpus`` identical GPUs serving ``classes`` at token prices c_p and c_d."""

    gpu: GPUProfile
    gpus: int
    classes: tuple[RequestClass, ...]
    prefill_price: float = 0.0  # c_p, per prompt token
    decode_price: float = 0.0  # c_d, per output token
    name: str = "scenario"
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    fleet: Fleet | None = None  # autoscaling fleet (simulator only); None: a fixed fleet of ``gpus``
    workflow: Workflow | None = None  # arrival processes and batch backlogs (None: Poisson at each class's rate)
    layout: Layout | None = None  # colocated, disaggregated or best, and the pools (None: no layout given)

    def __post_init__(self) -> None:
        if not isinstance(self.gpu, GPUProfile):
            raise ScenarioError(f"gpu: expected a GPUProfile, got {type(self.gpu).__name__}")
        _check_int("cluster", "gpus", self.gpus, minimum=1)
        classes = tuple(self.classes)
        object.__setattr__(self, "classes", classes)
        if not classes:
            raise ScenarioError("classes: expected at least one request class, got none")
        for c in classes:
            if not isinstance(c, RequestClass):
                raise ScenarioError(f"classes: expected RequestClass items, got {type(c).__name__}")
        names = [c.name for c in classes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ScenarioError(f"classes.name: class names must be unique, repeated: {', '.join(dup)}")
        _check_positive("pricing", "prefill", self.prefill_price, allow_zero=True)
        _check_positive("pricing", "decode", self.decode_price, allow_zero=True)
        check_markets(classes)
        if self.fleet is not None:
            if not isinstance(self.fleet, Fleet):
                raise ScenarioError(f"fleet: expected a Fleet, got {type(self.fleet).__name__}")
            if self.fleet.initial is not None and self.fleet.initial > self.gpus:
                raise ScenarioError(
                    f"fleet.initial: expected at most cluster.gpus = {self.gpus} (the fleet's maximum), got {self.fleet.initial}"
                )
        if self.workflow is not None:
            object.__setattr__(self, "classes", _check_workflow(self.workflow, classes))
        if self.layout is not None and not isinstance(self.layout, Layout):
            raise ScenarioError(f"layout: expected a Layout, got {type(self.layout).__name__}")

    # -- convenience -------------------------------------------------------------------------
    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.classes)

    def with_gpus(self, gpus: int) -> Scenario:
        """Same per-GPU load on a fleet of ``gpus`` GPUs (cluster arrival rates scale with n). A workflow's
        Poisson and Gamma arrivals scale with it and its backlogs' counts too (rounded); a trace or a
        rate file cannot be rescaled (ScenarioError)."""
        f = gpus / self.gpus
        wf = self.workflow
        if wf is not None:
            for k, a in enumerate(wf.arrivals):
                if a.process in ("trace", "rates"):
                    raise ScenarioError(f"arrivals[{k}] ({a.cls}): a {a.process} file cannot be rescaled to {gpus} "
                                        f"GPUs; expected the scenario's own cluster.gpus = {self.gpus}")
            wf = replace(wf, arrivals=tuple(a if a.rate is None else replace(a, rate=a.rate * f) for a in wf.arrivals),
                         backlogs=tuple(replace(b, count=int(round(b.count * f))) for b in wf.backlogs))
        return replace(self, gpus=gpus, classes=tuple(replace(c, rate=c.rate * f) for c in self.classes), workflow=wf)

    def with_prices(self, prefill: float | None = None, decode: float | None = None) -> Scenario:
        return replace(
            self,
            prefill_price=self.prefill_price if prefill is None else prefill,
            decode_price=self.decode_price if decode is None else decode,
        )

    def class_prices(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-class (c_p, c_d) token prices after applying per-class overrides."""
        cp = np.array([self.prefill_price if c.prefill_price is None else c.prefill_price for c in self.classes])
        cd = np.array([self.decode_price if c.decode_price is None else c.decode_price for c in self.classes])
        return cp, cd

    def rates(self) -> Rates:
        """Derived per-GPU rates of the fluid model (docs/model.md)."""
        g = self.gpu
        tau = g.tau_mix
        P = np.array([c.prompt for c in self.classes], dtype=float)
        D = np.array([c.decode for c in self.classes], dtype=float)
        cp, cd = self.class_prices()
        return Rates(
            lam=np.array([c.rate for c in self.classes], dtype=float) / self.gpus,
            theta=np.array([c.patience for c in self.classes], dtype=float),
            # a cached prefix is not prefilled; every prompt token is still paid for (prefill_reward)
            mu_p=g.chunk / (np.array([c.prefill_tokens for c in self.classes], dtype=float) * tau),
            mu_m=1.0 / (D * tau),
            mu_s=g.gamma / D,
            prefill_reward=cp * P,
            decode_reward=cd * D,
        )


def paper_gpu() -> GPUProfile:
    """The GPU of the paper's two-class instance (Qwen-8B on A100: alpha, beta, gamma = 45.45)."""
    # price_per_hour: the named profile qwen-8b-a100's (the same GPU), so a plan of the default is costed
    return GPUProfile.from_gamma(alpha=0.0174, beta=6.2e-5, gamma=45.45, chunk=256, batch=16, name="paper",
                                 price_per_hour=1.8)


def paper_scenario(gpus: int = 500, lam: Sequence[float] = (0.5, 0.5), theta: Sequence[float] = (0.1, 0.1)) -> Scenario:
    """The paper's two-class instance (docs/model.md) on ``gpus`` GPUs; ``lam`` is per GPU."""
    classes = (
        RequestClass("short-prompt", prompt=300, decode=1000, rate=lam[0] * gpus, patience=theta[0]),
        RequestClass("long-prompt", prompt=3000, decode=400, rate=lam[1] * gpus, patience=theta[1]),
    )
    return Scenario(
        gpu=paper_gpu(), gpus=gpus, classes=classes, prefill_price=0.1, decode_price=0.2, name="paper-two-class"
    )
