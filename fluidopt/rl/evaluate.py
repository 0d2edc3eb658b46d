"""Head-to-head evaluation of routers on RL-style episodes (no torch needed).

:func:`evaluate` runs every policy on the same episodes: episode k of seed s is the first
``n_requests`` arrivals of the scenario's workload drawn with :func:`~fluidopt.rl.core.episode_seed`
(s, k), and every router that uses output-length predictions gets the same noisy-oracle predictions
(seeded with the same episode seed). Each run goes until every request of the episode is resolved
(no warm-up; the cohort is the whole episode). :func:`summarize` gives per-policy means with 95%
confidence intervals over episodes (t distribution) and the improvement over a baseline.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario
from fluidopt.core.tquantile import t_quantile
from fluidopt.rl.core import episode_seed, episode_workload, in_system
from fluidopt.rl.predictors import BucketTokens, NoisyOracle
from fluidopt.workloads.base import TraceWarning

__all__ = ["GATE_AND_ROUTE_POLICIES", "PAPER_POLICIES", "PAPER_IMPROVEMENT", "evaluate", "policy_options", "run_episode",
           "summarize", "trace_episodes"]

PAPER_POLICIES = ("round-robin", "random", "least-requests", "jsq", "max-capacity", "max-capacity-reserve", "min-min",
                  "decode-balancer", "small-large", "baseline-rl", "wa-rl", "wg-rl")
GATE_AND_ROUTE_POLICIES = ("gate-and-route", "prioritize-and-route", "sli-gate-and-route", "fi-wsp", "fg-sp", "gi-wsp",
                           "gf-wsp")
"""The gate-and-route family and the prefill/decode paper's baselines (they need prices: the fluid LP)."""
PAPER_IMPROVEMENT = {"wg-rl": 11.43, "wa-rl": 7.79, "baseline-rl": 4.35, "jsq": 0.46, "max-capacity": 2.60,
                     "min-min": 1.50}
"""Improvement of mean end-to-end latency over round robin reported by Jain et al. (percent)."""

_PREDICTED = ("jsq", "min-min", "small-large")  # heuristic balancers that take predictor=
_RL = ("baseline-rl", "wa-rl", "wg-rl", "sb3-dqn", "sb3-ppo")


def _options(policy: str, seed: int, accuracy: float, extra: dict | None) -> dict:
    opts = dict(extra or {})
    base = policy.removesuffix("-chunked")
    if base in _PREDICTED and "predictor" not in opts:
        opts["predictor"] = BucketTokens(NoisyOracle(accuracy, seed=seed))
    if base in _RL:
        opts.setdefault("predictor_seed", seed)
        opts.setdefault("accuracy", accuracy)
    return opts


def policy_options(policy: str, seed: int, *, accuracy: float = 0.79, extra: dict | None = None) -> dict:
    """Controller options that give ``policy`` the noisy-oracle predictions seeded with ``seed`` (the
    same for every router that predicts: JSQ, Min-Min, Small-Large and the RL routers), plus ``extra``."""
    return _options(policy, seed, accuracy, extra)


def run_episode(scenario: Scenario, policy, workload, *, seed: int, options: dict | None = None,
                drain: float = 3600.0, backend: str = "auto"):
    """Run ``policy`` on one episode's ``workload`` until all its requests are resolved (or ``drain``
    seconds after the last arrival); return the SimResult. Ctrl-C or SIGTERM (the engine stops between
    two events) raises :class:`~fluidopt.core.interrupt.Interrupted`: a cut-short episode is never returned."""
    from fluidopt.sim.api import make_engine

    last = float(workload.duration)
    eng = make_engine(scenario, policy, horizon=last + drain, service="tokens", seed=seed, workload=workload,
                      controller_options=options, progress=False, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)  # an episode ends before the horizon by design
        eng.start()
    t = 0.0
    while not eng.done:
        t = max(t + 5.0, eng.now)
        eng.advance(min(t, last + drain))
        if eng.now > last and in_system(eng) == 0:
            break
    res = eng.finish()
    import fluidopt.core.interrupt as interrupt

    interrupt.raise_if_cut(res)
    res.meta["controller"] = eng.controller
    return res


def trace_episodes(trace, n_requests: int, *, speedup: float = 1.0, max_episodes: int | None = None) -> list:
    """A recorded trace cut into episodes: window k is rows [k N, (k + 1) N) (N = ``n_requests``; a
    shorter tail is dropped), its times shifted so its first arrival is at 0 and divided by
    ``speedup`` (on top of any speed-up the trace already has). Returns TraceWorkloads, at most
    ``max_episodes``; the same trace and arguments give the same episodes to every router."""
    from fluidopt.workloads.replay import TraceWorkload

    if not isinstance(trace, TraceWorkload):
        raise ScenarioError(f"trace_episodes: expected a TraceWorkload, got {type(trace).__name__}")
    if isinstance(n_requests, bool) or not isinstance(n_requests, int) or n_requests < 1:
        raise ScenarioError(f"trace_episodes: n_requests: expected an integer >= 1, got {n_requests!r}")
    if isinstance(speedup, bool) or not isinstance(speedup, (int, float)) or not (speedup > 0 and math.isfinite(speedup)):
        raise ScenarioError(f"trace_episodes: speedup: expected a number > 0, got {speedup!r}")
    k_max = trace.n_requests // n_requests
    if k_max == 0:
        raise ScenarioError(f"trace_episodes: n_requests = {n_requests}: the trace has only {trace.n_requests} requests")
    if max_episodes is not None:
        k_max = min(k_max, int(max_episodes))
    out = []
    for k in range(k_max):
        a, b = k * n_requests, (k + 1) * n_requests
        frame = pd.DataFrame({"time": trace.time[a:b] - trace.time[a], "prompt": trace.prompt[a:b],
                              "output": trace.output[a:b], "cls": trace.cls[a:b]})
        out.append(TraceWorkload(frame, trace.class_names, speedup=float(speedup), name=f"{trace.name}-window-{k}"))
    return out


def evaluate(scenario: Scenario, policies: Sequence[str], *, episodes: int = 20, n_requests: int = 2000,
             seed: int = 0, accuracy: float = 0.79, options: dict | None = None, progress=None,
             workloads: Sequence | None = None) -> pd.DataFrame:
    """One row per (policy, episode): e2e/TTFT/TPOT means (s), preemptions, router wait (RL, s).

    ``workloads``: replay these episodes (e.g. :func:`trace_episodes`) instead of drawing
    ``episodes`` x ``n_requests`` from the scenario; episode k's predictions still use
    ``episode_seed(seed, k)``."""
    if not isinstance(scenario, Scenario):
        raise ScenarioError(f"evaluate: expected a Scenario, got {type(scenario).__name__}")
    if workloads is not None:
        workloads = list(workloads)
        episodes = len(workloads)
    rows = []
    for k in range(episodes):
        es = episode_seed(seed, k)
        wl = episode_workload(scenario, n_requests, es) if workloads is None else workloads[k]
        n_wl = int(wl.n_requests)
        for pol in policies:
            t0 = time.perf_counter()
            res = run_episode(scenario, pol, wl, seed=es,
                              options=_options(pol, es, accuracy, (options or {}).get(pol)))
            c = res.cluster
            ctrl = res.meta["controller"]
            done = int(res.totals.get("completed", 0)) if isinstance(res.totals, dict) else math.nan
            rw = getattr(ctrl, "router_wait", math.nan)
            rows.append({"policy": pol, "episode": k, "seed": es, "e2e_mean": c["e2e_mean"], "ttft_mean": c["ttft_mean"],
                         "tpot_mean": c["tpot_mean"], "e2e_p99": c["e2e_p99"], "preemptions": c["preemptions"],
                         "router_wait_mean": rw / n_wl if not math.isnan(rw) else math.nan,
                         "completed": done, "requests": n_wl, "t_end": res.t_end, "wall_seconds": time.perf_counter() - t0})
            if progress:
                progress(rows[-1])
    return pd.DataFrame(rows)


def _ci(v: np.ndarray) -> float:
    v = v[np.isfinite(v)]
    if v.size < 2:
        return math.nan
    return float(t_quantile(v.size - 1, 0.975) * v.std(ddof=1) / math.sqrt(v.size))


def summarize(df: pd.DataFrame, *, baseline: str = "round-robin") -> pd.DataFrame:
    """Per policy: means and 95% CIs over episodes; improvement of mean e2e over ``baseline`` (%),
    with a paired CI (the same episodes), and the paper's number where it reports one. Without round robin
    in ``df``, ``round-robin-chunked`` is the default baseline (the chunked-prefill head-to-head)."""
    out = []
    if baseline == "round-robin" and baseline not in set(df.policy) and "round-robin-chunked" in set(df.policy):
        baseline = "round-robin-chunked"  # a chunked-prefill head-to-head (the paper's Table 3)
    base = df[df.policy == baseline].set_index("episode")["e2e_mean"] if baseline in set(df.policy) else None
    for pol, g in df.groupby("policy", sort=False):
        row = {"policy": pol, "episodes": len(g)}
        for mcol in ("e2e_mean", "ttft_mean", "tpot_mean", "preemptions", "router_wait_mean"):
            v = g[mcol].to_numpy(dtype=float)
            row[mcol] = float(np.nanmean(v)) if np.isfinite(v).any() else math.nan
            row[f"{mcol}_ci"] = _ci(v)
        if base is not None:
            e = g.set_index("episode")["e2e_mean"]
            common = e.index.intersection(base.index)
            row["improvement_pct"] = 100.0 * (1.0 - e[common].mean() / base[common].mean())
            # the paired half-width of the per-episode 100 (1 - e / base): 100 x that of the ratios
            row["improvement_ci"] = 100.0 * _ci(e[common].to_numpy() / base[common].to_numpy())
        if "requests" in g:
            # latency means cover completed requests only: an episode a router never finishes shows here
            row["completed_share"] = float((g["completed"] / g["requests"]).mean())
        row["paper_improvement_pct"] = PAPER_IMPROVEMENT.get(pol, math.nan)
        out.append(row)
    return pd.DataFrame(out)
