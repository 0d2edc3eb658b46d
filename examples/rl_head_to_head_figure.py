"""Figure of the head-to-head (a) on the RL setting from docs/data/rl_table.csv (examples/rl_paper_table.py).

    python examples/rl_head_to_head_figure.py [--out docs/figures/rl_head_to_head.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAMILY = {"baseline-rl": "RL routers", "wa-rl": "RL routers", "wg-rl": "RL routers",
          "gate-and-route": "gate-and-route family", "prioritize-and-route": "gate-and-route family",
          "sli-gate-and-route": "gate-and-route family", "fi-wsp": "prefill/decode paper baselines",
          "fg-sp": "prefill/decode paper baselines", "gi-wsp": "prefill/decode paper baselines",
          "gf-wsp": "prefill/decode paper baselines"}
COLOR = {"heuristic balancers": "tab:grey", "RL routers": "tab:red", "gate-and-route family": "tab:blue",
         "prefill/decode paper baselines": "tab:cyan"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT / "docs" / "data" / "rl_table.csv"))
    ap.add_argument("--out", default="fluidopt-examples/rl_head_to_head.png")
    a = ap.parse_args()
    t = pd.read_csv(a.data)
    fam = [FAMILY.get(p, "heuristic balancers") for p in t.policy]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.bar(range(len(t)), t.e2e_mean, yerr=t.e2e_mean_ci, color=[COLOR[f] for f in fam], capsize=3)
    ax.set_yscale("log")
    ax.set_xticks(range(len(t)), t.policy, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("mean end-to-end latency (s, log scale)")
    ax.set_title("RL setting (4 x Llama-2-7B / V100, 20 req/s): 20 episodes x 2,000 requests, 95% CIs")
    ax.legend(handles=[Patch(color=c, label=f) for f, c in COLOR.items()], fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
