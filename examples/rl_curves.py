"""Training curves of the three RL routers (the paper's Fig. 9 analogue) from the CSVs that
``fluidopt rl train --curves`` writes (examples/rl_train_all.sh writes docs/data/rl_curves_*.csv).

    python examples/rl_curves.py [--data docs/data] [--out docs/figures/rl_training_curves.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LABEL = {"baseline": "Baseline RL", "wa": "Workload-Aware RL", "wg": "Workload-Guided RL"}


def figure(data: Path):
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for v in ("baseline", "wa", "wg"):
        p = data / f"rl_curves_{v}.csv"
        if not p.is_file():
            continue
        c = pd.read_csv(p)
        ax[0].plot(c.episode, c.reward / 1000, label=f"{LABEL[v]} (reward incl. guidance)")
        if v != "baseline":
            ax[0].plot(c.episode, c.reward_without_guidance / 1000, ls="--", label=f"{LABEL[v]} (without guidance)")
        ax[1].plot(c.episode, c.e2e_mean, label=LABEL[v])
    for a in ax:
        a.axvline(19.5, color="grey", lw=0.8, ls=":")
        a.set_xlabel("training episode (2,000 requests; epsilon-greedy before the dotted line)")
    ax[0].set_ylabel("episode reward (thousands)")
    ax[1].set_ylabel("mean end-to-end latency in the episode (s)")
    ax[0].legend(fontsize=7)
    ax[1].legend(fontsize=7)
    fig.suptitle("RL router training on the RL setting (4 x Llama-2-7B / V100, 20 req/s)")
    fig.tight_layout()
    return fig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT / "docs" / "data"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "figures" / "rl_training_curves.png"))
    a = ap.parse_args()
    figure(Path(a.data)).savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
