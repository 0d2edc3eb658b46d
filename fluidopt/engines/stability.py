"""Where does one engine instance stop being stable? Li-Dai-Peng's boundary, checked by simulation.

Li, Dai and Peng ("Throughput-Optimal Scheduling Algorithms for LLM Inference and AI Agents", arXiv
2504.07347) model an instance that runs iterations of at most ``b`` tokens (prompt tokens and one
token per decode), a full iteration taking ``t_b`` seconds. A *work-conserving* scheduler (one that
never leaves budget unused while work waits: Orca, Sarathi-Serve, chunked prefill) is stable exactly
when

    lam * (m_p + m_d) < b / t_b,        i.e. lam < lam* = b / (t_b * (m_p + m_d))   requests/s,

with ``m_p`` the mean prompt tokens and ``m_d`` the mean decode tokens of a request. Here a request
of ``o`` output tokens gets its first one from its prefill iteration, so it has ``o - 1`` decode
iterations and ``m_d = E[o] - 1``. A scheduler that never mixes prompts and decodes in one
iteration (vLLM before chunked prefill) can lose capacity: :data:`SCENARIOS` ``counterexample``.

The law of a scenario is Li-Dai-Peng's: an iteration of ``n`` tokens takes ``a + beta * n`` seconds
whatever their kind (:meth:`StabilityScenario.law`: prefill ``a + beta * tokens``, decode
``a + beta * B``, no context term), so ``t_b = a + beta * b``.

The check (:func:`check_rate`) replays ``n`` Poisson arrivals through the engine stepper
(:func:`fluidopt.engines.replay`) and applies :func:`fluidopt.queueing.growth.growth_test` to the
number in system up to the last arrival. :func:`stability_boundary` does this on a grid of rates
with common random numbers (the same unit-rate arrival gaps and lengths at every rate), then bisects
between the largest stable and the smallest unstable rate; the simulated boundary is the middle of
the last bracket.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.core.errors import ScenarioError, UsageError, did_you_mean
from fluidopt.queueing.growth import GrowthTest, growth_test

__all__ = ["SCENARIOS", "STABILITY_ENGINES", "BoundaryReport", "RateCheck", "StabilityScenario", "check_rate",
           "check_engine", "closed_form_boundary", "get_scenario", "plot_growth",
           "prefill_first_boundary", "stability_boundary"]

# chunked: Sarathi-style token budget (work-conserving); vllm: prefill-first, whole prompts, never mixes
STABILITY_ENGINES = ("chunked", "vllm")
DEFAULT_LOADS = (0.5, 0.7, 0.8, 0.9, 0.95, 1.05, 1.1, 1.2)  # multiples of the closed-form boundary


@dataclass(frozen=True)
class StabilityScenario:
    """One instance and its requests. ``a`` (s) and ``beta`` (s per token): an iteration of ``n``
    tokens takes ``a + beta * n`` s. ``budget``: tokens per iteration ``b``. ``prompt`` and
    ``output``: inclusive ranges (tokens) of the uniform integer lengths (lo == hi: fixed)."""

    name: str
    a: float
    beta: float
    budget: int
    prompt: tuple[int, int]
    output: tuple[int, int]
    note: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for k in ("a", "beta"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ScenarioError(f"scenario {self.name!r}: {k} = {v!r}: expected seconds >= 0")
        if self.a + self.beta <= 0:
            raise ScenarioError(f"scenario {self.name!r}: a + beta must be > 0 (an iteration takes time)")
        if not (isinstance(self.budget, int) and self.budget >= 1):
            raise ScenarioError(f"scenario {self.name!r}: budget = {self.budget!r}: expected tokens >= 1")
        for k in ("prompt", "output"):
            lo, hi = getattr(self, k)
            if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
                raise ScenarioError(f"scenario {self.name!r}: {k} = ({lo!r}, {hi!r}): expected 1 <= lo <= hi tokens")

    @property
    def m_p(self) -> float:
        """Mean prompt tokens."""
        return (self.prompt[0] + self.prompt[1]) / 2

    @property
    def m_d(self) -> float:
        """Mean decode tokens (output tokens less the one the prefill emits)."""
        return (self.output[0] + self.output[1]) / 2 - 1

    @property
    def t_b(self) -> float:
        """Seconds of a full iteration of ``budget`` tokens."""
        return self.a + self.beta * self.budget

    def law(self) -> IterationLaw:
        """The law: ``a + beta * (prompt tokens + decodes)`` for every iteration (seconds)."""
        return IterationLaw(PrefillLaw(self.a, self.beta, 0.0), DecodeLaw((self.a, 0.0, self.beta)), name=self.name)

    def with_budget(self, budget: int) -> StabilityScenario:
        return StabilityScenario(self.name, self.a, self.beta, int(budget), self.prompt, self.output, self.note)

    def sample(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Unit-rate exponential gaps, prompt and output lengths of ``n`` requests (one seed, so every
        rate sees the same requests: common random numbers)."""
        rng = np.random.default_rng(seed)
        gaps = rng.exponential(1.0, n)
        p = rng.integers(self.prompt[0], self.prompt[1] + 1, n)
        o = rng.integers(self.output[0], self.output[1] + 1, n)
        return gaps, p, o


# Three work-conserving checks (lengths and budgets differ by an order of magnitude) and the
# counterexample: prompts longer than half the budget never share a prefill-first iteration, so each
# prefill iteration pays the intercept ``a`` for p < b tokens: per request the prefill-first engine
# spends (a + beta p) + m_d t_b / b seconds in heavy traffic against (p + m_d) t_b / b when mixing,
# a loss of a (1 - p / b) per request.
SCENARIOS: dict[str, StabilityScenario] = {
    s.name: s for s in (
        StabilityScenario("short", 0.005, 5e-5, 256, (16, 112), (2, 64), "chat-like: short prompts and answers"),
        StabilityScenario("long", 0.012, 4e-5, 2048, (200, 1000), (100, 400), "long prompts, long answers"),
        StabilityScenario("mixed", 0.008, 3e-5, 512, (1, 1024), (1, 512), "prompts up to twice the budget (chunked only)"),
        StabilityScenario("counterexample", 0.010, 2e-5, 512, (300, 300), (101, 101),
                          "prompt 300 > b/2 = 256: prefill-first loses a(1 - p/b) per request"),
    )
}


def get_scenario(name: str) -> StabilityScenario:
    if name not in SCENARIOS:
        raise UsageError(f"SCENARIO {name!r}: no such scenario{did_you_mean(name, tuple(SCENARIOS))}; expected one "
                         f"of {', '.join(SCENARIOS)}")
    return SCENARIOS[name]


def closed_form_boundary(s: StabilityScenario) -> float:
    """Li-Dai-Peng's lam* = b / (t_b (m_p + m_d)), requests/s."""
    return s.budget / (s.t_b * (s.m_p + s.m_d))


def prefill_first_boundary(s: StabilityScenario) -> float:
    """Heavy-traffic boundary of the prefill-first engine with at most ``b`` running requests, for
    fixed lengths (requests/s): each prefill iteration holds floor(b / p) prompts, each decode
    iteration ``b`` decodes, so a request costs t(p k) / k + m_d t_b / b seconds, k = floor(b / p)."""
    p = s.prompt[1]
    k = max(1, s.budget // p)
    return 1.0 / ((s.a + s.beta * p * k) / k + s.m_d * s.t_b / s.budget)


def check_engine(s: StabilityScenario, engine: str) -> None:
    """Bad combinations as one-line errors: an unknown engine, or prompts longer than the budget
    without chunking (prefill-first needs a whole prompt in one iteration)."""
    if engine not in STABILITY_ENGINES:
        raise UsageError(f"--engine {engine!r}: no such engine{did_you_mean(engine, STABILITY_ENGINES)}; expected one of "
                         f"{', '.join(STABILITY_ENGINES)}")
    if engine == "vllm" and s.prompt[1] > s.budget:
        raise UsageError(f"--budget {s.budget}: smaller than the longest prompt ({s.prompt[1]} tokens) of scenario "
                         f"{s.name!r}, and engine 'vllm' does not chunk prompts; expected a budget >= {s.prompt[1]} "
                         "or --engine chunked")


def _config(s: StabilityScenario, engine: str):
    from fluidopt.engines import engine_config

    if engine == "chunked":
        # no cap on running requests besides the budget itself (each decode takes one of its tokens)
        return engine_config("chunked", max_num_batched_tokens=s.budget, max_num_seqs=10**9)
    # decodes in one iteration <= b, as in Li-Dai-Peng's model of a batch of b tokens
    return engine_config("vllm", max_num_batched_tokens=s.budget, max_num_seqs=s.budget, max_model_len=None)


@dataclass(frozen=True)
class RateCheck:
    """One run at ``rate`` (requests/s): the growth test and the completion rate over the analysed
    part of the run (requests/s)."""

    rate: float
    load: float  # rate / closed-form boundary
    test: GrowthTest
    throughput: float
    requests: int

    @property
    def unstable(self) -> bool:
        return self.test.unstable

    def to_dict(self) -> dict:
        d = {"rate": self.rate, "load": self.load, "throughput": self.throughput, "requests": self.requests}
        d.update({k: v for k, v in self.test.to_dict().items() if k != "means"})
        return d


def check_rate(s: StabilityScenario, engine: str, rate: float, *, requests: int = 20000, seed: int = 0,
               confidence: float = 0.99, warmup: float = 0.2, batches: int = 20, _sample=None) -> RateCheck:
    """Replay ``requests`` Poisson arrivals at ``rate`` (requests/s) and test the queue for growth."""
    from fluidopt.engines import replay

    check_engine(s, engine)
    gaps, p, o = _sample if _sample is not None else s.sample(requests, seed)
    arr = np.cumsum(gaps) / rate
    r = replay(s.law(), _config(s, engine), arr, p, o)
    horizon = float(arr[-1])
    t = growth_test(arr, r.finish, horizon, warmup=warmup, batches=batches, confidence=confidence)
    fin = r.finish
    start = warmup * horizon
    served = int(np.count_nonzero((fin > start) & (fin <= horizon)))
    return RateCheck(float(rate), float(rate / closed_form_boundary(s)), t, served / (horizon - start), len(arr))


@dataclass(frozen=True)
class BoundaryReport:
    """:func:`stability_boundary`'s answer. Rates in requests/s. ``boundary_simulated``: middle of the
    last bracket (None when no grid rate was unstable, or none stable); ``bracket``: (largest stable,
    smallest unstable) rate; ``throughput_saturated``: completion rate of the highest unstable run."""

    scenario: str
    engine: str
    budget: int
    m_p: float
    m_d: float
    t_b: float
    boundary_closed_form: float
    boundary_simulated: float | None
    bracket: tuple[float | None, float | None]
    relative_error: float | None
    throughput_saturated: float | None
    confidence: float
    requests: int
    seed: int
    checks: tuple[RateCheck, ...]

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "checks"}
        d["bracket"] = list(self.bracket)
        d["checks"] = [c.to_dict() for c in self.checks]
        return d


def stability_boundary(s: StabilityScenario, engine: str, rates=None, *, requests: int = 20000, seed: int = 0,
                       confidence: float = 0.99, refine: int = 4) -> BoundaryReport:
    """Grid plus bisection (module docstring). ``rates``: requests/s, default :data:`DEFAULT_LOADS` x
    lam*. ``refine``: bisection steps inside the bracket."""
    check_engine(s, engine)
    lam = closed_form_boundary(s)
    grid = sorted(float(r) for r in (rates if rates is not None else [x * lam for x in DEFAULT_LOADS]))
    if not grid or any(not (math.isfinite(r) and r > 0) for r in grid):
        raise UsageError(f"--rates {grid!r}: expected requests/s > 0")
    sample = s.sample(requests, seed)
    checks = [check_rate(s, engine, r, requests=requests, confidence=confidence, _sample=sample) for r in grid]
    lo = max((c.rate for c in checks if not c.unstable and all(not d.unstable for d in checks if d.rate < c.rate)),
             default=None)
    hi = min((c.rate for c in checks if c.unstable and (lo is None or c.rate > lo)), default=None)
    if lo is not None and hi is not None:
        for _ in range(refine):
            mid = (lo + hi) / 2
            c = check_rate(s, engine, mid, requests=requests, confidence=confidence, _sample=sample)
            checks.append(c)
            if c.unstable:
                hi = mid
            else:
                lo = mid
    checks.sort(key=lambda c: c.rate)
    sim = (lo + hi) / 2 if lo is not None and hi is not None else None
    top = [c for c in checks if c.unstable]
    sat = top[-1].throughput if top else None
    return BoundaryReport(s.name, engine, s.budget, s.m_p, s.m_d, s.t_b, lam, sim, (lo, hi),
                          None if sim is None else sim / lam - 1, sat, confidence, requests, seed, tuple(checks))


def plot_growth(report: BoundaryReport, path) -> None:
    """Figure: growth of the number in system (requests/s, with 2-stderr bars) against load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [c.load for c in report.checks]
    y = [c.test.slope for c in report.checks]
    e = [2 * c.test.stderr for c in report.checks]
    col = ["tab:red" if c.unstable else "tab:blue" for c in report.checks]
    fig, ax = plt.subplots(figsize=(5.5, 3.4), dpi=100)
    ax.axhline(0, color="grey", lw=0.8)
    ax.axvline(1.0, color="k", ls="--", lw=0.8, label="closed form lam*")
    if report.boundary_simulated is not None:
        ax.axvline(report.boundary_simulated / report.boundary_closed_form, color="tab:green", lw=1.0,
                   label="simulated boundary")
    ax.errorbar(x, y, yerr=e, fmt="none", ecolor="grey", lw=0.8)
    ax.scatter(x, y, c=col, s=18, zorder=3)
    ax.set_xlabel("load lam / lam*")
    ax.set_ylabel("queue growth, requests/s")
    ax.set_title(f"{report.scenario}, engine {report.engine}, b = {report.budget} (red: unstable)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
