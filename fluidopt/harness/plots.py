"""Figures as matplotlib objects the caller can show or save; :func:`save_figure` writes one safely."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from fluidopt.fluid.solution import FluidSolution
    from fluidopt.harness.comparison import Comparison
    from fluidopt.sim.metrics import SimResult

__all__ = ["plot_comparison", "plot_occupancy", "save_figure"]


def save_figure(fig, path: str | os.PathLike, *, dpi: int = 100) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix) and close it; return the path.

    Parent folders are created; the file appears whole or not at all (written beside it, then
    renamed), so an interrupted script never leaves a truncated image. A pyplot figure gets
    ``tight_layout`` first (one made with a layout engine keeps its own).
    """
    from fluidopt.core.files import atomic_path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def save_png(fig, path: str | os.PathLike, *, dpi: int) -> None:
    """Write ``fig`` to ``path`` as PNG as it stands (no layout pass, the path as given: a writer of
    :func:`fluidopt.core.files.write_generation`), then close it. A figure made through pyplot stays in
    pyplot's list until closed, so a process that runs many commands (``fluidopt.cli.main`` in a test
    worker, a notebook) would otherwise keep every figure it ever saved."""
    try:
        fig.savefig(path, dpi=dpi, format="png")
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def _figure(ncols: int, width: float = 4.2, height: float = 3.4):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    axes = fig.subplots(1, ncols)
    return fig, np.atleast_1d(axes)


def plot_comparison(comparison: Comparison, scenario: str | None = None) -> Figure:
    """Three panels per policy: revenue / LP bound, abandoned fraction, mean end-to-end latency (s).

    Error bars are 95% half-widths (over seeds, or the batch-means interval of a single seed).
    """
    summ = comparison.summary()
    if scenario is None:
        scenario = summ["scenario"].iloc[0]
    summ = summ[summ["scenario"] == scenario]
    fig, axes = _figure(3)
    pos = np.arange(len(summ))
    panels = (
        ("ratio", f"revenue / LP optimum ({comparison.pricing})"),
        ("abandoned_fraction", "abandoned fraction"),
        ("e2e_mean", "mean end-to-end latency (s)"),
    )
    for ax, (col, label) in zip(axes, panels):
        err = summ[f"{col}_ci"].to_numpy(dtype=float)
        ax.bar(pos, summ[col], yerr=np.where(np.isfinite(err), err, 0.0), capsize=3, color="#4C72B0")
        ax.set_xticks(pos, summ["policy"], rotation=30, ha="right")
        ax.set_title(label, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    lo = float(np.nanmin(summ["ratio"] - summ["ratio_ci"].fillna(0)))
    axes[0].axhline(1.0, color="k", lw=0.8, ls="--")
    axes[0].set_ylim(max(0.0, min(lo, 1.0) - 0.02), 1.01)
    fig.suptitle(f"{scenario}: policies vs the fluid bound", fontsize=11)
    return fig


def plot_occupancy(result: SimResult, solution: FluidSolution | None = None) -> Figure:
    """Prefill occupancy X_i/n and queues (per GPU) over time, with the LP targets x_i* dashed.

    Needs a result simulated with ``sample_interval``.
    """
    ts = result.timeseries
    if ts is None or ts.empty:
        raise ValueError("plot_occupancy: the result has no time series; simulate with sample_interval=...")
    n = result.n_gpus
    fig, axes = _figure(2)
    colors = [f"C{k}" for k in range(len(result.classes))]
    for k, name in enumerate(result.classes):
        axes[0].plot(ts["time"], ts[f"x[{name}]"] / n, color=colors[k], lw=1, label=f"X/n {name}")
        axes[1].plot(ts["time"], ts[f"q_prefill[{name}]"] / n, color=colors[k], lw=1, label=f"prefill queue {name}")
        axes[1].plot(ts["time"], ts[f"q_decode[{name}]"] / n, color=colors[k], lw=1, ls=":", label=f"decode buffer {name}")
        if solution is not None:
            axes[0].axhline(solution.x[k], color=colors[k], ls="--", lw=1)
    if result.warmup > 0:
        for ax in axes:
            ax.axvspan(0, result.warmup, color="0.9", zorder=0)
    axes[0].set_title("prefill occupancy per GPU (dashed: LP x*)", fontsize=10)
    axes[1].set_title("queues per GPU", fontsize=10)
    for ax in axes:
        ax.set_xlabel("time (s)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result.policy} on {result.scenario}, n = {n}", fontsize=11)
    return fig
