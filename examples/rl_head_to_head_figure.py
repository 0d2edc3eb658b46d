"""Figure of a head-to-head table: (a) the RL setting from docs/data/rl_table.csv (examples/rl_paper_table.py),
or (c) the Azure trace from docs/data/rl_azure_table.csv (examples/rl_azure_head_to_head.py; one panel
per speed-up).

    python examples/rl_head_to_head_figure.py [--out docs/figures/rl_head_to_head.png]
    python examples/rl_head_to_head_figure.py --data docs/data/rl_azure_table.csv --title azure \
        --out docs/figures/rl_azure_head_to_head.png
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
    ap.add_argument("--title", choices=("rl", "azure"), default="rl", help="which head to head the data is")
    a = ap.parse_args()
    t = pd.read_csv(a.data)
    panels = [(sp, g) for sp, g in t.groupby("speedup", sort=True)] if "speedup" in t.columns else [(None, t)]
    fig, axes = plt.subplots(1, len(panels), figsize=(10 * len(panels) if len(panels) == 1 else 7 * len(panels), 4.5),
                             squeeze=False)
    for ax, (sp, g) in zip(axes[0], panels):
        fam = [FAMILY.get(p, "heuristic balancers") for p in g.policy]
        ax.bar(range(len(g)), g.e2e_mean, yerr=g.e2e_mean_ci, color=[COLOR[f] for f in fam], capsize=3)
        ax.set_yscale("log")
        ax.set_xticks(range(len(g)), g.policy, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("mean end-to-end latency (s, log scale)")
        if a.title == "rl":
            ax.set_title("RL setting (4 x Llama-2-7B / V100, 20 req/s): 20 episodes x 2,000 requests, 95% CIs")
        else:
            ax.set_title(f"speed-up {sp:g} ({g['rate'].iloc[0]:.1f} req/s)", fontsize=10)
            fig.suptitle("Azure conversation trace on 8 x Llama-2-7B / V100: windows of 2,000 requests, 95% CIs",
                         fontsize=10)
        ax.legend(handles=[Patch(color=c, label=f) for f, c in COLOR.items()], fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
