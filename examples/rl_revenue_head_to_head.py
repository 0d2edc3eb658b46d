"""Head to head (b): revenue / R* on the prefill/decode paper's two-class instance, with WG-RL trained on revenue.

    python examples/rl_revenue_head_to_head.py [--train] [--gpus 4,16,64] [--seeds 5] [--out docs/data]
    python examples/rl_revenue_head_to_head.py --figure docs/figures/rl_revenue_head_to_head.png --out docs/data

The instance (examples/scenarios/paper-two-class.toml, `with_gpus(n)`: the same per-GPU load, 0.5
requests per second per GPU of each class, patience 0.1/s) at n GPUs, on the `tokens` service for
every router (the RL router needs it). Each router runs `--seeds` seeded runs of the scenario's own
Poisson workload (seed s: the same arrivals and the same noisy-oracle predictions, accuracy 0.79,
for every router); revenue per GPU per second after the warm-up (the simulator's bundled revenue:
c_p x prompt + c_d x output tokens of each completed request) over R*, the bundled fluid LP's
optimum per GPU per second (`solve_fluid`).

`--train` first trains WG-RL with the revenue reward (`RewardConfig(objective="revenue")`) at
`--train-gpus` instances (default 4) and writes `examples/weights/wg-rl-revenue-paper-<n>.npz`
(`<variant>-rl-shared-revenue-paper-<n>.npz` with `--arch shared`, the table's `baseline-rl-shared` rows) and the
curves; without it the script uses that file when present (WG-RL is left out at sizes without one).
The RL paper's MDP dispatches at most one request per 0.02 s epoch (50 per second): at 64 GPUs
(64 requests per second) an RL router cannot keep up whatever it learned; `--multi-dispatch`
trains (and its weight file runs) with multi-dispatch epochs, which lift that cap (docs/rl.md
section 2). `--objective lost-revenue` trains on minus the revenue of abandoned requests.
`--wait-mask fits` trains (and its weight file runs) with "wait" valid only when the head of the
router queue fits on no instance (docs/rl.md section 2); with `--arch shared` it writes
`<variant>-rl-shared-masked-revenue-paper-<n>.npz` (the table's `baseline-rl-shared-masked` rows).
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
import math
import time
from pathlib import Path

import pandas as pd

from fluidopt.fluid import solve_fluid
from fluidopt.rl.evaluate import GATE_AND_ROUTE_POLICIES, policy_options
from fluidopt.scenario import load_scenario
from fluidopt.sim.api import simulate

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "examples" / "scenarios" / "paper-two-class.toml"
WEIGHTS = ROOT / "examples" / "weights"
BALANCERS = ("round-robin", "random", "least-requests", "jsq", "max-capacity-interval", "min-min", "decode-balancer", "small-large")
# (warm-up, horizon) in seconds per fleet size: about 40,000 / 160,000 / 260,000 arrivals per run
WINDOWS = {4: (500.0, 5500.0), 16: (500.0, 5500.0), 64: (300.0, 2300.0)}


RL_ROWS = {"wg-rl": "wg-rl-revenue-paper-{n}.npz", "baseline-rl-shared": "baseline-rl-shared-revenue-paper-{n}.npz",
           "baseline-rl-shared-masked": "baseline-rl-shared-masked-revenue-paper-{n}.npz"}
"""Table label -> weight file (run as the registered RL router with ``weights=``; the variant only names
the training reward): WG-RL with the paper's flat MLP and MDP trained on revenue, and Baseline RL with
the shared-weights network and multi-dispatch epochs trained on lost revenue, without and with the
``fits`` wait mask (docs/rl.md)."""


def _router(label: str) -> str:
    """The registered router a table label runs ("baseline-rl-shared" -> "baseline-rl")."""
    return label.removesuffix("-masked").removesuffix("-shared") if label in RL_ROWS else label


def weights_path(n: int, label: str = "wg-rl") -> Path:
    return WEIGHTS / RL_ROWS[label].format(n=n)


def train_revenue(n: int, *, episodes: int, requests: int, eps_episodes: int, train_every: int, gamma: float,
                  seed: int, curves: Path | None, arch: str = "mlp", multi_dispatch: bool = False,
                  batch_size: int = 512, reward_scale: float = 0.01, objective: str = "revenue",
                  variant: str = "wg", wait_mask: str = "none") -> tuple[Path, float]:
    """Train WG-RL on revenue at n instances; returns (weight file, CPU seconds)."""
    from fluidopt.rl.dqn import DQNConfig, train
    from fluidopt.rl.mlp import save_weights

    sc = load_scenario(SCENARIO).with_gpus(n)
    cfg = DQNConfig(variant=variant, objective=objective, episodes=episodes, n_requests=requests, seed=seed,
                    eps_episodes=eps_episodes, train_every=train_every, gamma=gamma, arch=arch,
                    multi_dispatch=multi_dispatch, batch_size=batch_size, reward_scale=reward_scale,
                    wait_mask=wait_mask)
    c0 = time.process_time()
    res = train(sc, cfg, progress=True)
    cpu = time.process_time() - c0
    WEIGHTS.mkdir(parents=True, exist_ok=True)
    cmd = (f"python examples/rl_revenue_head_to_head.py --train --train-gpus {n} --episodes {episodes} "
           f"--requests {requests} --eps-episodes {eps_episodes} --train-every {train_every} --gamma {gamma} "
           f"--train-seed {seed}" + (f" --arch {arch}" if arch != "mlp" else "")
           + (" --multi-dispatch" if multi_dispatch else "") + (f" --batch-size {batch_size}" if batch_size != 512 else "")
           + (f" --reward-scale {reward_scale}" if reward_scale != 0.01 else "")
           + (f" --objective {objective}" if objective != "revenue" else "") + (f" --variant {variant}" if variant != "wg" else "")
           + (f" --wait-mask {wait_mask}" if wait_mask != "none" else ""))
    label = (f"{variant}-rl-shared" if arch == "shared" else f"{variant}-rl") + ("-masked" if wait_mask != "none" else "")
    path = save_weights(WEIGHTS / RL_ROWS.get(label, label + "-revenue-paper-{n}.npz").format(n=n), res.net, command=cmd)
    if curves is not None:
        res.curves.to_csv(curves, index=False)
    return path, cpu


def run(gpus: list[int], *, seeds: int, seed0: int = 2000, policies=BALANCERS, gate_and_route=GATE_AND_ROUTE_POLICIES,
        windows: dict | None = None, progress: bool = False, rl=tuple(RL_ROWS)) -> pd.DataFrame:
    """One row per (n, policy, seed): revenue per GPU per second, its ratio to R*, abandonment, latency."""
    base = load_scenario(SCENARIO)
    windows = windows or WINDOWS
    rows = []
    for n in gpus:
        sc = base.with_gpus(n)
        r_star = solve_fluid(sc).revenue_per_gpu
        pols = list(policies) + list(gate_and_route)
        pols += [lab for lab in rl if weights_path(n, lab).is_file()]
        warm, hor = windows[n]
        for k in range(seeds):
            s = seed0 + k
            for pol in pols:
                extra = {"weights": str(weights_path(n, pol))} if pol in RL_ROWS else None
                c0 = time.process_time()
                res = simulate(sc, _router(pol), horizon=hor, warmup=warm, seed=s, service="tokens", progress=False,
                               controller_options=policy_options(_router(pol), s, extra=extra))
                rev = float(res.cluster["revenue_per_gpu"])
                tot = res.totals
                rows.append({"gpus": n, "policy": pol, "seed": s, "revenue_per_gpu": rev, "r_star": r_star,
                             "ratio": rev / r_star, "abandoned_share": tot["abandoned"] / max(1, tot["requests"]),
                             "e2e_mean": float(res.cluster.get("e2e_mean", math.nan)),
                             "ttft_mean": float(res.cluster.get("ttft_mean", math.nan)),
                             "cpu_seconds": time.process_time() - c0})
                if progress:
                    print(f"n={n} seed={s} {pol}: revenue/R* {rev / r_star:.4f} ({rows[-1]['cpu_seconds']:.1f} CPU s)",
                          flush=True)
    return pd.DataFrame(rows)


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    from scipy import stats

    out = []
    for (n, pol), g in df.groupby(["gpus", "policy"], sort=False):
        v = g["ratio"].to_numpy()
        ci = float(stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else math.nan
        out.append({"gpus": n, "policy": pol, "seeds": v.size, "ratio": v.mean(), "ratio_ci": ci,
                    "revenue_per_gpu": g["revenue_per_gpu"].mean(), "r_star": g["r_star"].iloc[0],
                    "abandoned_share": g["abandoned_share"].mean(), "e2e_mean": g["e2e_mean"].mean(),
                    "ttft_mean": g["ttft_mean"].mean()})
    return pd.DataFrame(out)


def figure(table: Path, out: Path) -> None:
    """Bars of revenue / R* (95% CIs) per router, one group per fleet size, from rl_revenue_table.csv."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = pd.read_csv(table)
    sizes = sorted(t.gpus.unique())
    pols = list(dict.fromkeys(t.policy))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    w = 0.8 / len(sizes)
    for j, n in enumerate(sizes):
        g = t[t.gpus == n].set_index("policy")
        xs = [i + (j - (len(sizes) - 1) / 2) * w for i, p in enumerate(pols) if p in g.index]
        ys = [g.loc[p, "ratio"] for p in pols if p in g.index]
        es = [g.loc[p, "ratio_ci"] for p in pols if p in g.index]
        ax.bar(xs, ys, w, yerr=es, capsize=2, label=f"{n} GPUs")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylim(0.4, 1.02)
    ax.set_xticks(range(len(pols)), pols, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("revenue / R*")
    ax.set_title("Two-class paper instance, tokens service: revenue / R* (95% CIs over seeds); RL agents trained at each size",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="4,16,64")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=2000, help="seeds first-seed .. first-seed + seeds - 1")
    ap.add_argument("--out", default="fluidopt-examples/data")
    ap.add_argument("--train", action="store_true", help="train WG-RL on revenue first (see the module doc)")
    ap.add_argument("--train-gpus", type=int, default=4)
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--eps-episodes", type=int, default=20)
    ap.add_argument("--train-every", type=int, default=4)
    ap.add_argument("--gamma", type=float, default=0.999)
    ap.add_argument("--train-seed", type=int, default=0)
    ap.add_argument("--arch", choices=("mlp", "shared"), default="mlp")
    ap.add_argument("--multi-dispatch", action="store_true")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--reward-scale", type=float, default=0.01)
    ap.add_argument("--variant", choices=("baseline", "wa", "wg"), default="wg", help="reward variant for --train")
    ap.add_argument("--objective", choices=("revenue", "lost-revenue"), default="revenue",
                    help="training reward (docs/rl.md section 2); evaluation is always revenue / R*")
    ap.add_argument("--wait-mask", choices=("none", "fits"), default="none",
                    help="'fits': wait only when the head fits on no instance (docs/rl.md section 2)")
    ap.add_argument("--train-only", action="store_true", help="train, then stop (no evaluation)")
    ap.add_argument("--policies", default=None,
                    help="comma-separated routers to run (default: all; wg-rl where its weights exist)")
    ap.add_argument("--update", action="store_true",
                    help="replace only these (size, router) rows in OUT/rl_revenue_runs.csv, keep the others")
    ap.add_argument("--figure", default=None, metavar="PNG", help="only draw the figure from OUT/rl_revenue_table.csv")
    a = ap.parse_args()
    out = Path(a.out)
    if a.figure:
        figure(out / "rl_revenue_table.csv", Path(a.figure))
        return
    out.mkdir(parents=True, exist_ok=True)
    if a.train:
        path, cpu = train_revenue(a.train_gpus, episodes=a.episodes, requests=a.requests, eps_episodes=a.eps_episodes,
                                  train_every=a.train_every, gamma=a.gamma, seed=a.train_seed,
                                  curves=out / ("rl_revenue_curves_" + ("shared_" if a.arch == "shared" else "")
                                               + ("masked_" if a.wait_mask != "none" else "") + f"{a.train_gpus}.csv"),
                                  arch=a.arch,
                                  multi_dispatch=a.multi_dispatch, batch_size=a.batch_size, reward_scale=a.reward_scale,
                                  objective=a.objective, variant=a.variant, wait_mask=a.wait_mask)
        print(f"trained {path} in {cpu:.0f} CPU s")
        if a.train_only:
            return
    t0 = time.time()
    gpus = [int(x) for x in a.gpus.split(",")]
    if a.policies:
        chosen = [p.strip() for p in a.policies.split(",") if p.strip()]
        df = run(gpus, seeds=a.seeds, seed0=a.first_seed, progress=True, policies=[p for p in chosen if p in BALANCERS],
                 gate_and_route=[p for p in chosen if p in GATE_AND_ROUTE_POLICIES], rl=[p for p in chosen if p in RL_ROWS])
    else:
        df = run(gpus, seeds=a.seeds, seed0=a.first_seed, progress=True)
    if a.update and (out / "rl_revenue_runs.csv").is_file():
        old = pd.read_csv(out / "rl_revenue_runs.csv")
        keep = ~(old.gpus.isin(gpus) & old.policy.isin(set(df.policy)) & old.seed.isin(set(df.seed)))
        rank = {p: i for i, p in enumerate(list(BALANCERS) + list(GATE_AND_ROUTE_POLICIES) + list(RL_ROWS))}
        df = pd.concat([old[keep], df], ignore_index=True)
        df = df.assign(_r=df.policy.map(rank)).sort_values(["gpus", "_r", "seed"], kind="stable").drop(columns="_r")
    df.to_csv(out / "rl_revenue_runs.csv", index=False)
    s = summarize(df)
    s.to_csv(out / "rl_revenue_table.csv", index=False)
    print(f"\n{a.seeds} seeds per router and size, {time.time() - t0:.0f} s wall, {df.cpu_seconds.sum():.0f} CPU s\n")
    print("| GPUs | router | revenue / R* | revenue per GPU per s | abandoned | mean e2e (s) | TTFT (s) |")
    print("|---|---|---|---|---|---|---|")
    for _, r in s.iterrows():
        print(f"| {r['gpus']} | {r['policy']} | {r['ratio']:.4f} ± {r['ratio_ci']:.4f} | {r['revenue_per_gpu']:.1f} | "
              f"{100 * r['abandoned_share']:.1f}% | {r['e2e_mean']:.1f} | {r['ttft_mean']:.2f} |")


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
