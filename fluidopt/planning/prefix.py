"""The capacity plan of a trace with block hashes, with and without a prefix cache, verified by replaying it.

The fluid plan (:func:`fluid_cache_plan`) sizes the fleet for the trace's observed rate and mean lengths
(:func:`fluidopt.workloads.traces.classes_from_trace`) with every class served (``served`` = 1 by default:
with no abandonment a fleet must keep up) and the prefill of each request shrunk to (1 - h) x prompt,
h the token hit ratio that routing ``rule`` keeps on the trace over the planned fleet
(:func:`fluidopt.workloads.prefix.hit_ratio`, the GPU's time law as ``--from-trace`` uses it). h depends
on the fleet (fewer instances share more), so the plan iterates: start at the cache-blind fleet,
estimate h over ceil(n) instances, plan again, until ceil(n) repeats (a fleet seen before ends it too).
``rule=None`` is the plan without a cache (h = 0).

The check (:func:`replay_check`) replays the trace on n GPUs with a registered routing policy, the cache
on or off, until every request resolves, and judges a :class:`TraceSLO`: the share of requests complete
by the trace's last arrival (a fleet that falls behind leaves a backlog that grows with the trace), and
optionally the mean and p99 TTFT over the whole trace. :func:`smallest_fleet` steps n up from a start
until the SLO holds and reports the fleet one GPU smaller beside it.
"""

from __future__ import annotations

import math
import tempfile
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import fluidopt.core.interrupt as interrupt
from fluidopt.core.errors import UsageError
from fluidopt.core.model import Scenario

__all__ = ["RULE_POLICY", "TraceSLO", "CachePlan", "ReplayCheck", "fluid_cache_plan", "replay_check", "smallest_fleet"]


# the registered routing policy of each hit-ratio rule (fluidopt.workloads.prefix.RULES)
RULE_POLICY = {"round-robin": "round-robin", "least-load": "least-requests", "sglang": "sglang", "llm-d": "llm-d",
               "consistent-hash": "consistent-hash", "consistent-hash-bounded": "consistent-hash-bounded"}


@dataclass(frozen=True)
class TraceSLO:
    """What a fleet must deliver on a replayed trace. ``served``: the share of the trace's requests
    complete by its last arrival (0, 1]; ``ttft_mean``, ``ttft_p99``: seconds over every request of
    the trace (None: not checked)."""

    served: float = 0.99
    ttft_mean: float | None = None
    ttft_p99: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.served, bool) or not (isinstance(self.served, (int, float)) and 0.0 < self.served <= 1.0):
            raise UsageError(f"TraceSLO.served: expected a share in (0, 1], got {self.served!r}")
        for name in ("ttft_mean", "ttft_p99"):
            v = getattr(self, name)
            bad = isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)
            if v is not None and bad:
                raise UsageError(f"TraceSLO.{name}: expected seconds > 0, got {v!r}")

    def describe(self) -> str:
        parts = [f"served by the last arrival >= {self.served:g}"]
        if self.ttft_mean is not None:
            parts.append(f"mean TTFT <= {self.ttft_mean:g} s")
        if self.ttft_p99 is not None:
            parts.append(f"p99 TTFT <= {self.ttft_p99:g} s")
        return ", ".join(parts)


@dataclass(frozen=True)
class CachePlan:
    """A fluid plan for a trace. ``hit_ratio``: the h planned with (0 without a cache); ``ideal``: one
    global unlimited cache's h (NaN without a rule); ``n_fluid``: fluid GPUs (continuous);
    ``gpus``: ceil(n_fluid); ``steps``: the (instances, h, n_fluid) of each iteration."""

    rule: str | None
    capacity_blocks: int | None
    hit_ratio: float
    ideal: float
    n_fluid: float
    gpus: int
    binding: str
    steps: tuple[tuple[int, float, float], ...]


@dataclass(frozen=True)
class ReplayCheck:
    """One replay: the fleet, the policy, whether the cache was on, the measured statistics (seconds,
    shares) and whether the SLO held. ``metrics``: ``served`` (complete by the last arrival),
    ``completed`` (by the end of the drain), ``ttft_mean``, ``ttft_p90``, ``ttft_p99``, ``e2e_mean``,
    ``hit_ratio`` (cached over prompt tokens of the requests that started prefill), ``wall_s``."""

    gpus: int
    policy: str
    prefix_cache: bool
    metrics: dict[str, float]
    met: bool


def _plan_scenario(scenario: Scenario, workload) -> Scenario:
    """The scenario whose classes are the trace's: its observed rates and mean lengths."""
    from fluidopt.workloads.traces import classes_from_trace

    return replace(scenario, classes=tuple(classes_from_trace(workload)))


def _fluid_gpus(scenario: Scenario, h: float, served: float) -> tuple[float, int, str]:
    from fluidopt.fluid.capacity import fluid_fleet_bound
    from fluidopt.fluid.sli import MinServedFraction

    sc = replace(scenario, classes=tuple(replace(c, hit_ratio=float(h)) for c in scenario.classes))
    fb = fluid_fleet_bound(sc, [MinServedFraction(c.name, served) for c in sc.classes])
    return float(fb.gpus), int(fb.gpus_int), fb.binding_sli or (fb.binding[0] if fb.binding else "")


def fluid_cache_plan(scenario: Scenario, workload, rule: str | None, *, capacity_blocks: int | None = None,
                     served: float = 1.0, instances: int | None = None, max_steps: int = 8,
                     **options: Any) -> CachePlan:
    """The fluid fleet for ``workload`` (a trace with block hashes) on ``scenario``'s GPU, with h kept by
    routing ``rule`` over the planned fleet's instances (``capacity_blocks`` blocks each; None:
    unlimited), or without a cache (``rule=None``). ``instances``: estimate h once over that many
    instances instead of iterating. ``options``: the rule's parameters. See the module docstring."""
    from fluidopt.workloads.prefix import H_MAX, hit_ratio_on_gpu

    sc = _plan_scenario(scenario, workload)
    n, n_int, binding = _fluid_gpus(sc, 0.0, served)
    steps: list[tuple[int, float, float]] = []
    if rule is None:
        return CachePlan(None, capacity_blocks, 0.0, math.nan, n, n_int, binding, ((n_int, 0.0, n),))
    seen: dict[int, tuple[float, float]] = {}
    h, ideal = 0.0, math.nan
    for _ in range(1 if instances else max_steps):
        inst = instances or max(1, n_int)
        if inst in seen:
            break
        est = hit_ratio_on_gpu(workload, sc.gpu, rule, inst, capacity_blocks, **options)
        h, ideal = min(est.hit_ratio, H_MAX), est.ideal
        n, n_int, binding = _fluid_gpus(sc, h, served)
        seen[inst] = (h, n)
        steps.append((inst, h, n))
    return CachePlan(rule, capacity_blocks, h, ideal, n, n_int, binding, tuple(steps))


def replay_check(scenario: Scenario, workload, gpus: int, policy: str, slo: TraceSLO, *, prefix_cache: bool = True,
                 drain: float = 3600.0, options: dict | None = None, seed: int = 0) -> ReplayCheck:
    """Replay ``workload`` on ``gpus`` GPUs of ``scenario``'s GPU under ``policy`` (tokens mode), the prefix
    cache on or off, for the trace's span and at most ``drain`` seconds more, and judge ``slo``. Requests
    unresolved at the end count as not served, and their TTFT as the time they waited (a lower bound)."""
    from fluidopt.sim.api import simulate
    from fluidopt.workloads import TraceWarning

    if not isinstance(gpus, int) or gpus < 1:
        raise UsageError(f"replay_check: gpus: expected an integer >= 1, got {gpus!r}")
    sc = replace(scenario, gpus=gpus)
    span = float(workload.frame["time"].max())
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "records.csv"
        with warnings.catch_warnings():
            # "the trace ends before the horizon": intended, the run goes on to resolve the last requests
            warnings.simplefilter("ignore", TraceWarning)
            res = simulate(sc, policy, horizon=span + drain, service="tokens", workload=workload, records=path,
                           progress=False, seed=seed, controller_options=options or None,
                           prefix_cache=prefix_cache)
        interrupt.raise_if_cut(res)
        rec = pd.read_csv(path)
    wall = time.perf_counter() - t0
    n = int(workload.n_requests)
    end = span + drain
    done = rec[rec.outcome == "completed"]
    # TTFT over every request of the trace: one unresolved at the end has waited end - arrival at least
    ttft = np.concatenate([rec.ttft.to_numpy(float)[np.isfinite(rec.ttft.to_numpy(float))],
                           end - rec.arrival.to_numpy(float)[~np.isfinite(rec.ttft.to_numpy(float))]])
    missing = n - len(rec)  # never recorded (still waiting at the end): they waited since their arrival
    if missing > 0:
        arrivals = np.sort(workload.frame["time"].to_numpy(float))[-missing:]
        ttft = np.concatenate([ttft, end - arrivals])
    started = rec[rec.cached_prompt.notna()] if "cached_prompt" in rec else rec.iloc[:0]
    m = {"served": float(((done.arrival + done.e2e) <= span).sum() / n), "completed": float(len(done) / n),
         "ttft_mean": float(ttft.mean()), "ttft_p90": float(np.percentile(ttft, 90)),
         "ttft_p99": float(np.percentile(ttft, 99)), "e2e_mean": float(done.e2e.mean()) if len(done) else math.nan,
         "hit_ratio": float(started.cached_prompt.sum() / started.prompt.sum()) if len(started) else 0.0,
         "wall_s": wall}
    met = m["served"] >= slo.served
    if slo.ttft_mean is not None:
        met = met and m["ttft_mean"] <= slo.ttft_mean
    if slo.ttft_p99 is not None:
        met = met and m["ttft_p99"] <= slo.ttft_p99
    return ReplayCheck(gpus, policy, bool(prefix_cache), m, bool(met))


def smallest_fleet(scenario: Scenario, workload, start: int, policy: str, slo: TraceSLO, *,
                   prefix_cache: bool = True, max_gpus: int | None = None, **kw: Any) -> tuple[int, list[ReplayCheck]]:
    """The smallest n >= ``start`` whose replay meets ``slo``, stepping up one GPU at a time (at most
    ``max_gpus``, default 2 x start), and the replays made, with the one at n - 1 (when n - 1 >= 1) beside
    them so that a plan shows its margin. Raises :class:`UsageError` when no fleet up to ``max_gpus`` meets it."""
    top = max_gpus or 2 * start
    checks: list[ReplayCheck] = []
    n = start
    while n <= top:
        c = replay_check(scenario, workload, n, policy, slo, prefix_cache=prefix_cache, **kw)
        checks.append(c)
        if c.met:
            break
        n += 1
    else:
        raise UsageError(f"plan: {policy} misses the SLO ({slo.describe()}) on every fleet of {start} to {top} GPUs; "
                         "try another --policy or a looser SLO")
    if n == start and n > 1:
        checks.insert(0, replay_check(scenario, workload, n - 1, policy, slo, prefix_cache=prefix_cache, **kw))
    return n, checks
