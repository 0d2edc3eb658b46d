"""Head-to-head of WAIT, Nested WAIT, vLLM-style and Sarathi-style batching on Llama-3-8B / A100
(Vidur's operator profiles, the authors' model and GPU), with paired 95% intervals over seeds
(docs/theory.md, "Head-to-head").

    python benchmarks/bench_theory.py [--seeds 10] [--requests 4000] [--figure docs/figures/theory-head-to-head.png]

Needs /work/shared/data/vidur-profiling (or FLUIDOPT_VIDUR_DATA). Prints a Markdown table per workload.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from fluidopt.engines.headtohead import POLICIES, head_to_head, run_policy, vidur_law

DATA = os.environ.get("FLUIDOPT_VIDUR_DATA", "/work/shared/data/vidur-profiling")

MODEL = "meta-llama/Meta-Llama-3-8B"

# The request mixes of the authors' own runs (github.com/Luoxiaogan/vidur_or, results_analysis/):
# fixed prompt and output tokens per type, types drawn in proportion to their rates, and the total
# booking limit L they swept (vLLM-style and Sarathi-style get max_num_seqs = L).
WORKLOADS = {
    "A: test31/test33, 10 types, prompt 60, output 50..500": dict(
        prompt=60, outputs=list(range(50, 501, 50)), rates=[23, 11, 8, 7, 6, 4, 3, 2, 1, 1], total_limit=128),
    "B: search_long_decode/test6, 3 types, prompt 20, output 100/200/300": dict(
        prompt=20, outputs=[100, 200, 300], rates=[2000, 2000, 6000], total_limit=600),
}
LOADS = (0.5, 0.9, 1.3)  # of the saturated Sarathi-style service rate


def sampler(w):
    def sample(n, seed):
        rng = np.random.default_rng(10_000 + seed)
        r = np.asarray(w["rates"], dtype=float)
        o = np.asarray(w["outputs"])[rng.choice(len(r), n, p=r / r.sum())]
        return np.full(n, w["prompt"]), o
    return sample


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--figure", default=None)
    a = ap.parse_args()
    law, kv, err = vidur_law(DATA, model=MODEL)
    print(f"law {law.name}: prefill {law.prefill}, decode {law.decode.small}; KV {kv:,.0f} tokens; "
          f"worst fit error {100 * err:.1f}%")
    results = {}
    for name, w in WORKLOADS.items():
        t0 = time.process_time()
        sample = sampler(w)
        wp = {k: w[k] for k in ("outputs", "rates", "total_limit")}
        # the service rate: Sarathi-style at about 3x a rough capacity (8,000 output tokens/s), completions/s
        p, o = sample(a.requests, 0)
        guess = 3.0 * 8000.0 / np.mean(o)
        arr = np.cumsum(np.random.default_rng(0).exponential(1 / guess, a.requests))
        r = run_policy("sarathi", law, kv, arr, p, o, wait_params=wp)
        T = arr[-1]
        cap = np.count_nonzero((r.finish > 0.2 * T) & (r.finish <= T)) / (0.8 * T)
        rates = [x * cap for x in LOADS]
        cells = head_to_head(law, kv, rates, sample, seeds=range(a.seeds), requests=a.requests, wait_params=wp)
        results[name] = (cap, cells)
        print(f"\n### {name}: Sarathi-style service rate {cap:.3f} requests/s ({time.process_time() - t0:.0f} CPU-s)\n")
        print("| load | policy | requests/s | output tokens/s | mean E2E s | mean TTFT s | preempt./req | "
              "tokens/s vs vLLM (95% CI) | E2E vs vLLM s (95% CI) |")
        print("|---|---|---|---|---|---|---|---|---|")
        base = {c.rate: c for c in cells if c.policy == "vllm"}
        from scipy.stats import t as st
        for c in cells:
            b = base[c.rate]
            d = c.tokens - b.tokens
            hw = st.ppf(0.975, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size)
            rel = 100 * d.mean() / b.tokens.mean()
            print(f"| {c.rate / cap:.2f} | {c.policy} | {c.throughput.mean():.3f} | {c.tokens.mean():.0f} | "
                  f"{c.e2e.mean():.2f} | {c.ttft.mean():.2f} | {c.preemptions.mean():.3f} | "
                  f"{d.mean():+.1f} ± {hw:.1f} ({rel:+.2f}%) | {c.diff_e2e[0]:+.2f} ± {c.diff_e2e[1]:.2f} |")
    if a.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(results), figsize=(9, 3.3), dpi=90)
        for ax, (name, (cap, cells)) in zip(np.atleast_1d(axes), results.items()):
            for pol in POLICIES:
                cs = [c for c in cells if c.policy == pol]
                ax.plot([c.rate / cap for c in cs], [c.e2e.mean() for c in cs], marker="o", ms=3, label=pol)
            ax.set_yscale("log")
            ax.set_xlabel("load (of Sarathi-style service rate)")
            ax.set_ylabel("mean E2E latency, s")
            ax.set_title(name.split(":")[0], fontsize=9)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.figure)


if __name__ == "__main__":
    main()
