"""The regime map: routers over a grid of arrival rate x KV capacity per instance (no torch needed).

:func:`regime_map` evaluates every router of a list on every cell of a grid (the scenario with its
classes' rates scaled to a total arrival rate, and its GPU's KV capacity per instance replaced), on
the same episodes in every cell (:func:`~fluidopt.rl.evaluate.evaluate`: episode k of seed s), and
returns one row per (cell, router): mean end-to-end latency, the gain over round robin with a paired
95% CI, preemptions per episode and the share of requests completed. :func:`regime_figure` draws the
gains as one heatmap per router. ``fluidopt rl regimes SCENARIO`` writes both (docs/rl.md section 6b).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import pandas as pd

from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario

__all__ = ["DEFAULT_ROUTERS", "regime_figure", "regime_map", "scenario_at"]

DEFAULT_ROUTERS = ("round-robin", "least-requests", "jsq", "min-min", "small-large", "max-capacity", "max-capacity-reserve",
                   "wg-rl")
"""The routers of ``fluidopt rl regimes`` by default (round robin is the baseline of every gain)."""


def _positive(name: str, values: Sequence[float]) -> tuple[float, ...]:
    vals = tuple(values)
    if not vals:
        raise ScenarioError(f"regimes: {name}: expected at least one value")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
            raise ScenarioError(f"regimes: {name}: expected finite numbers > 0, got {v!r}")
    if len(set(vals)) != len(vals):
        raise ScenarioError(f"regimes: {name}: a value is repeated in {list(vals)}")
    return tuple(float(v) for v in vals)


def scenario_at(scenario: Scenario, rate: float, kv_capacity: float) -> Scenario:
    """``scenario`` at a total arrival rate (requests/s; every class's rate scaled by the same factor,
    so the mix is kept) and with ``kv_capacity`` KV tokens per instance. The name is kept, so a router
    with per-scenario default weights keeps them across the grid."""
    (rate,) = _positive("rate", [rate])
    (kv_capacity,) = _positive("kv capacity", [kv_capacity])
    total = sum(c.rate for c in scenario.classes)
    if not total > 0:
        raise ScenarioError(f"regimes: scenario {scenario.name!r} has no arrivals (total rate {total})")
    f = rate / total
    classes = tuple(dataclasses.replace(c, rate=c.rate * f) for c in scenario.classes)
    gpu = dataclasses.replace(scenario.gpu, kv_capacity=float(kv_capacity))
    return dataclasses.replace(scenario, gpu=gpu, classes=classes)


def regime_map(scenario: Scenario, policies: Sequence[str], rates: Sequence[float], capacities: Sequence[float], *,
               episodes: int = 5, n_requests: int = 2000, seed: int = 1000, accuracy=0.79,
               options: dict | None = None, progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """One row per (rate, KV capacity, router): ``e2e_mean`` (s) and its CI, ``improvement_pct`` over
    round robin with a paired 95% CI (``improvement_ci``), ``preemptions`` per episode, ``completed_share``.

    Every router is built once on ``scenario`` before anything runs, so an unknown name, a bad option or
    a weight file for another fleet is an error before the grid's work. Round robin is added if missing.
    """
    from fluidopt.control.registry import make_controller
    from fluidopt.rl.evaluate import evaluate, summarize

    if not isinstance(scenario, Scenario):
        raise ScenarioError(f"regimes: expected a Scenario, got {type(scenario).__name__}")
    rates = _positive("rates", rates)
    capacities = _positive("kv capacities", capacities)
    pols = list(dict.fromkeys(policies))
    if not pols:
        raise ScenarioError("regimes: routers: expected at least one")
    if "round-robin" not in pols:
        pols.insert(0, "round-robin")
    for nm in ("episodes", "n_requests"):
        v = episodes if nm == "episodes" else n_requests
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ScenarioError(f"regimes: {nm}: expected an integer >= 1, got {v!r}")
    opts = options or {}
    for p in pols:  # fail early: unknown router, bad option, weights for another fleet
        make_controller(p, scenario, **(opts.get(p) or {}))
    rows = []
    cells = [(lam, kv) for kv in capacities for lam in rates]
    for i, (lam, kv) in enumerate(cells):
        sc = scenario_at(scenario, lam, kv)
        df = evaluate(sc, pols, episodes=episodes, n_requests=n_requests, seed=seed, accuracy=accuracy, options=opts)
        s = summarize(df)
        for _, r in s.iterrows():
            rows.append({"rate": lam, "kv_capacity": kv, "policy": r["policy"], "episodes": int(r["episodes"]),
                         "e2e_mean": r["e2e_mean"], "e2e_mean_ci": r["e2e_mean_ci"],
                         "improvement_pct": r["improvement_pct"], "improvement_ci": r["improvement_ci"],
                         "preemptions": r["preemptions"], "ttft_mean": r["ttft_mean"],
                         "completed_share": r["completed_share"]})
        if progress:
            rr = s.set_index("policy").loc["round-robin"]
            best = s[s.policy != "round-robin"].sort_values("improvement_pct", ascending=False).head(1)
            tail = (f"; best {best.policy.iloc[0]} {best.improvement_pct.iloc[0]:+.1f}%" if len(best) else "")
            progress(f"cell {i + 1}/{len(cells)}: rate {lam:g}/s, KV {kv:g}: round robin {rr['e2e_mean']:.2f} s, "
                     f"{rr['preemptions']:.0f} preemptions{tail}")
    return pd.DataFrame(rows)


def regime_figure(table: pd.DataFrame, title: str = ""):
    """One heatmap per router (round robin left out): its gain over round robin (%) by KV capacity
    (rows) and arrival rate (columns), each cell annotated with gain +- paired CI and preemptions."""
    import numpy as np
    from matplotlib.figure import Figure

    pols = [p for p in dict.fromkeys(table.policy) if p != "round-robin"]
    rates = sorted(table.rate.unique())
    caps = sorted(table.kv_capacity.unique())
    n = max(1, len(pols))
    ncols = min(3, n)
    nrows = -(-n // ncols)
    fig = Figure(figsize=(ncols * (0.9 * len(rates) + 1.6) + 1.2, nrows * (0.55 * len(caps) + 1.2) + 0.6),
                 layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, sharey=True, squeeze=False)).ravel()
    vals = table[table.policy != "round-robin"].improvement_pct.to_numpy(dtype=float)
    lim = float(np.nanmax(np.abs(vals))) if vals.size and np.isfinite(vals).any() else 1.0
    lim = max(lim, 1.0)
    im = None
    for ax, p in zip(axes, pols):
        g = table[table.policy == p].set_index(["kv_capacity", "rate"])
        Z = np.array([[g.loc[(c, r), "improvement_pct"] for r in rates] for c in caps], dtype=float)
        im = ax.imshow(Z, cmap="RdBu", vmin=-lim, vmax=lim, origin="lower", aspect="auto")
        for yi, c in enumerate(caps):
            for xi, r in enumerate(rates):
                e = g.loc[(c, r)]
                dark = abs(e["improvement_pct"]) > 0.6 * lim
                ax.text(xi, yi, f"{e['improvement_pct']:+.1f} ±{e['improvement_ci']:.1f}\n{e['preemptions']:.0f} preempt.",
                        ha="center", va="center", fontsize=6.5, color="white" if dark else "black")
        ax.set_xticks(range(len(rates)), [f"{r:g}" for r in rates])
        ax.set_yticks(range(len(caps)), [f"{c:g}" for c in caps])
        ax.set_xlabel("arrival rate (requests/s)", fontsize=8)
        ax.set_title(p, fontsize=9)
    for ax in axes[len(pols):]:
        ax.set_visible(False)
    for ax in axes[::ncols]:
        ax.set_ylabel("KV tokens per instance", fontsize=8)
    if im is not None:
        fig.colorbar(im, ax=[a for a in axes if a.get_visible()], label="mean E2E gain over round robin (%)")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
