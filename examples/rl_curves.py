"""Training curves of the three RL routers (the paper's Fig. 9 analogue) from the CSVs that
``fluidopt rl train --curves`` writes (examples/rl_train_all.sh writes docs/data/rl_curves_*.csv).

    python examples/rl_curves.py [--data docs/data] [--out docs/figures/rl_training_curves.png]
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LABEL = {"baseline": "Baseline RL", "wa": "Workload-Aware RL", "wg": "Workload-Guided RL"}


def round_robin_e2e(episodes: int, seed: int = 0) -> list[float]:
    """Round robin's mean e2e latency on the training episodes (same workloads: episode_seed(seed, k))."""
    from fluidopt.rl.core import episode_seed, episode_workload
    from fluidopt.rl.evaluate import run_episode
    from fluidopt.scenario import load_scenario

    sc = load_scenario(ROOT / "examples" / "scenarios" / "rl-router-v100.toml")
    out = []
    for k in range(episodes):
        es = episode_seed(seed, k)
        out.append(run_episode(sc, "round-robin", episode_workload(sc, 2000, es), seed=es).cluster["e2e_mean"])
    return out


def figure(data: Path):
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    rr = None
    for v in ("baseline", "wa", "wg"):
        p = data / f"rl_curves_{v}.csv"
        if not p.is_file():
            continue
        c = pd.read_csv(p)
        ax[0].plot(c.episode, c.reward / 1000, label=f"{LABEL[v]} (reward incl. guidance)")
        if v != "baseline":
            ax[0].plot(c.episode, c.reward_without_guidance / 1000, ls="--", label=f"{LABEL[v]} (without guidance)")
        if rr is None:
            rr = round_robin_e2e(len(c))
        ax[1].plot(c.episode, 100 * (1 - c.e2e_mean / rr[: len(c)]), label=LABEL[v])
    for a in ax:
        a.axvline(19.5, color="grey", lw=0.8, ls=":")
        a.set_xlabel("training episode (2,000 requests; epsilon-greedy before the dotted line)")
    ax[0].set_ylabel("episode reward (thousands)")
    ax[1].set_ylabel("e2e latency improvement over round robin\non the same episode (%)")
    ax[1].axhline(0, color="black", lw=0.6)
    ax[0].legend(fontsize=7)
    ax[1].legend(fontsize=7)
    fig.suptitle("RL router training on the RL setting (4 x Llama-2-7B / V100, 20 req/s)")
    fig.tight_layout()
    return fig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT / "docs" / "data"))
    ap.add_argument("--out", default="fluidopt-examples/rl_training_curves.png")
    a = ap.parse_args()
    figure(Path(a.data)).savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
