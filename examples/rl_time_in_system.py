"""Ablation beside the paper's MDP: RL routers trained on the time-in-system objective (docs/rl.md section 6).

    python examples/rl_time_in_system.py [--train] [--weights-dir examples/weights] [--episodes 20]
        [--requests 2000] [--seed 1000] [--out docs/data]

The time-in-system reward (``--objective time-in-system``, docs/rl.md section 2) is minus the
request-seconds the requests spend in the system during a step, so an episode's rewards sum to
minus its total end-to-end latency. ``--train`` first trains the agents of ``AGENTS`` on the
4-instance RL setting, one after the other, with the ``fluidopt rl train`` commands printed
(deterministic bit for bit from the seed), into ``--weights-dir``, with their training curves in
``--out``; without it the weight files must be there already.

Then every router runs on the paper-table protocol of examples/rl_paper_table.py (the same
episodes: episode k is the first N arrivals drawn with episode_seed(seed, k), the same noisy-oracle
predictions): round robin, least requests, the three shipped RL routers (paper's MDP) and the
ablation agents, and round robin and least requests driven through the RL environment at its 0.02 s
decision epochs (multi-dispatch, ``fits`` mask: the RL routers' timing with a heuristic's choices,
which separates the cost of the epochs from the cost of the choices). Writes rl_tis_episodes.csv (one row per router and episode, with the RL routers'
decisions, waits and the busiest instance's share of the dispatches) and rl_tis.csv (means, 95% CIs,
improvement over round robin with a paired CI) and rl_tis_diagnostics.csv (each masked agent's
Q-values over its greedy decisions on evaluation episode 0, and the TD error of its last ten training
episodes from the curves --train wrote), and prints markdown tables.
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
import math
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from fluidopt.rl.core import episode_seed, episode_workload
from fluidopt.rl.evaluate import policy_options, run_episode, summarize
from fluidopt.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = "examples/scenarios/rl-router-v100.toml"
COMMON = "--episodes 30 --requests 2000 --eps-episodes 20 --multi-dispatch"
TIS = "--objective time-in-system"
AGENTS = (
    # label, variant, weight file, training arguments beside COMMON, episodes evaluated (None: all). The agent
    # without the wait mask waits for ever in some episodes (each then runs to the 3,600 s drain limit, about
    # 3 minutes of CPU): it is evaluated on the first 2 only.
    ("tis-baseline-rl, no mask", "baseline", "baseline-rl-tis-shared-4.npz",
     f"{TIS} --seed 0 --train-every 4 --arch shared --gamma 0.998", 2),
    ("tis-baseline-rl", "baseline", "baseline-rl-tis-shared-fits-4.npz",
     f"{TIS} --seed 0 --train-every 4 --arch shared --wait-mask fits --gamma 0.998", None),
    ("tis-baseline-rl, seed 1", "baseline", "baseline-rl-tis-shared-fits-seed1-4.npz",
     f"{TIS} --seed 1 --train-every 4 --arch shared --wait-mask fits --gamma 0.998", None),
    ("tis-wg-rl", "wg", "wg-rl-tis-shared-fits-4.npz",
     f"{TIS} --seed 0 --train-every 4 --arch shared --wait-mask fits --gamma 0.998", None),
    ("tis-wg-rl, seed 1", "wg", "wg-rl-tis-shared-fits-seed1-4.npz",
     f"{TIS} --seed 1 --train-every 4 --arch shared --wait-mask fits --gamma 0.998", None),
    ("tis-wg-rl, seed 2", "wg", "wg-rl-tis-shared-fits-seed2-4.npz",
     f"{TIS} --seed 2 --train-every 4 --arch shared --wait-mask fits --gamma 0.998", None),
    ("tis-wg-rl, flat MLP", "wg", "wg-rl-tis-mlp-fits-4.npz",
     f"{TIS} --seed 0 --train-every 4 --arch mlp --wait-mask fits --gamma 0.998", None),
    ("tis-wg-rl, one update per step", "wg", "wg-rl-tis-shared-fits-every1-4.npz",
     f"{TIS} --seed 0 --train-every 1 --arch shared --wait-mask fits --gamma 0.998", None),
    ("tis-wg-rl, gamma 0.99", "wg", "wg-rl-tis-shared-fits-gamma099-4.npz",
     f"{TIS} --seed 0 --train-every 4 --arch shared --wait-mask fits", None),
    ("paper-reward wg-rl (same recipe)", "wg", "wg-rl-paper-shared-fits-4.npz",
     "--seed 0 --train-every 4 --arch shared --wait-mask fits", None),
    ("paper-reward wg-rl (same recipe), seed 1", "wg", "wg-rl-paper-shared-fits-seed1-4.npz",
     "--seed 1 --train-every 4 --arch shared --wait-mask fits", None),
    ("paper-reward wg-rl (same recipe), seed 2", "wg", "wg-rl-paper-shared-fits-seed2-4.npz",
     "--seed 2 --train-every 4 --arch shared --wait-mask fits", None),
)
BASELINES = ("round-robin", "least-requests", "baseline-rl", "wa-rl", "wg-rl")


def train_command(variant: str, out: Path, extra: str, curves: Path) -> list[str]:
    return (["fluidopt", "rl", "train", SCENARIO, "--variant", variant] + shlex.split(COMMON) + shlex.split(extra)
            + ["--out", str(out), "--curves", str(curves)])


def run(scenario, label: str, policy: str, weights: str | None, *, episodes: int, n_requests: int, seed: int) -> list:
    rows = []
    for k in range(episodes):
        es = episode_seed(seed, k)
        wl = episode_workload(scenario, n_requests, es)
        extra = {"weights": weights} if weights else None
        t0 = time.perf_counter()
        res = run_episode(scenario, policy, wl, seed=es, options=policy_options(policy, es, extra=extra))
        c = res.cluster
        ctrl = res.meta["controller"]
        rw = getattr(ctrl, "router_wait", math.nan)
        sent = np.array(getattr(ctrl, "sent", []), dtype=float)
        decisions = getattr(ctrl, "decisions", math.nan)
        rows.append({"policy": label, "episode": k, "seed": es, "e2e_mean": c["e2e_mean"], "ttft_mean": c["ttft_mean"],
                     "tpot_mean": c["tpot_mean"], "e2e_p99": c["e2e_p99"], "preemptions": c["preemptions"],
                     "router_wait_mean": rw / n_requests if not math.isnan(rw) else math.nan,
                     "completed": int(res.totals.get("completed", 0)), "requests": n_requests,
                     "decisions": decisions,
                     "wait_fraction": getattr(ctrl, "waits", math.nan) / decisions if sent.size else math.nan,
                     "max_instance_share": float(sent.max() / sent.sum()) if sent.size and sent.sum() else math.nan,
                     "min_instance_share": float(sent.min() / sent.sum()) if sent.size and sent.sum() else math.nan,
                     "t_end": res.t_end, "wall_seconds": time.perf_counter() - t0})
    return rows


def run_on_ticks(scenario, label: str, rule: str, *, episodes: int, n_requests: int, seed: int) -> list:
    """A scripted rule driven through the RL environment (multi-dispatch epochs, ``fits`` mask, so it
    never waits here): the RL routers' timing with a heuristic's choices. ``rule``: ``"round-robin"``
    (cyclic over dispatches) or ``"least-requests"`` (fewest requests routed to the instance and
    unfinished, ties cyclic as in the least-requests controller). Episode k is the same request sequence
    as in :func:`run` (``RouterEnv`` draws episode k of a run seeded s with episode_seed(s, k))."""
    from fluidopt.rl.env import RouterEnv

    env = RouterEnv(scenario, variant="baseline", n_requests=n_requests, multi_dispatch=True, wait_mask="fits")
    m = env.m
    rows = []
    for k in range(episodes):
        env.reset(seed=seed) if k == 0 else env.reset()
        eng, start, waits, sent, done = env.eng, 0, 0, np.zeros(m), False
        while not done:
            if not env.wait_valid():
                if rule == "round-robin":
                    a = start
                else:
                    a, bv, g = start, eng.instance_requests(start), start
                    for _ in range(m - 1):
                        g = g + 1 if g + 1 < m else 0
                        if eng.instance_requests(g) < bv:
                            a, bv = g, eng.instance_requests(g)
                start = a + 1 if a + 1 < m else 0
                sent[a] += 1
            else:
                a = m
                waits += 1
            _, _, term, trunc, _ = env.step(a)
            done = term or trunc
        rw = env.core.router_wait
        res = env.result()
        c = res.cluster
        dec = sent.sum() + waits
        rows.append({"policy": label, "episode": k, "seed": episode_seed(seed, k), "e2e_mean": c["e2e_mean"],
                     "ttft_mean": c["ttft_mean"], "tpot_mean": c["tpot_mean"], "e2e_p99": c["e2e_p99"],
                     "preemptions": c["preemptions"], "router_wait_mean": rw / n_requests,
                     "completed": int(res.totals.get("completed", 0)), "requests": n_requests, "decisions": dec,
                     "wait_fraction": waits / dec, "max_instance_share": sent.max() / sent.sum(),
                     "min_instance_share": sent.min() / sent.sum(), "t_end": res.t_end, "wall_seconds": math.nan})
    env.close()
    return rows


def q_diagnostics(scenario, weights: str, *, n_requests: int, seed: int) -> dict:
    """Q-values of a (masked, multi-dispatch) weight file over the decisions of its own greedy run on
    evaluation episode 0: the median Q of the instance actions and the median gaps best - second best
    and best - worst (in the optimiser's reward units)."""
    from fluidopt.rl.env import RouterEnv
    from fluidopt.rl.mlp import load_weights

    net = load_weights(weights, n_instances=scenario.gpus)
    env = RouterEnv(scenario, variant="baseline", n_requests=n_requests, multi_dispatch=True, wait_mask=net.wait_mask)
    obs, _ = env.reset(seed=seed)
    m = env.m
    qs, done = [], False
    while not done:
        q = net.q(obs)
        qs.append(q[:m])
        a = int(np.argmax(q)) if env.wait_valid() else int(np.argmax(q[:m]))
        obs, _, term, trunc, _ = env.step(a)
        done = term or trunc
    env.close()
    q = np.sort(np.array(qs), 1)
    return {"q_median": float(np.median(q)), "gap_best_second": float(np.median(q[:, -1] - q[:, -2])),
            "gap_best_worst": float(np.median(q[:, -1] - q[:, 0])), "decisions": len(qs)}


def diagnostics_row(scenario, label: str, weights: Path, curves: list[Path], *, n_requests: int, seed: int) -> dict:
    """One agent's q_diagnostics row, with its training loss (mean of the last ten episodes) and TD error
    from the first of ``curves`` that exists (written by --train)."""
    d = {"policy": label, **q_diagnostics(scenario, str(weights), n_requests=n_requests, seed=seed)}
    for path in curves:
        if path.exists():
            loss = pd.read_csv(path)["loss"].iloc[-10:].mean()
            d.update(loss_last10=loss, td_error=math.sqrt(2.0 * loss))
            break
    return d


def print_q_table(diag: list[dict], digits: int) -> None:
    """The Q-value diagnostics table (q_diagnostics rows, with td_error where known)."""
    print("\nQ-values over the greedy decisions of evaluation episode 0 (reward units x 0.01); TD error "
          "sqrt(2 x Huber loss) of the last ten training episodes:\n")
    print("| agent | median Q | gap best - second (median) | gap best - worst (median) | TD error |")
    print("|---|---|---|---|---|")
    for d in diag:
        td = f"{d['td_error']:.{digits}f}" if "td_error" in d else ""
        print(f"| {d['policy']} | {d['q_median']:.{digits}f} | {d['gap_best_second']:.5f} | {d['gap_best_worst']:.5f} "
              f"| {td} |")


def parse_and_train(agents, curves: str) -> tuple[argparse.Namespace, Path, Path]:
    """The ablation scripts' command line (this one's and rl_request_credit.py's): (arguments,
    weights directory, output directory); with --train, first (re)train ``agents`` (each command
    printed; learning curves to OUT/rl_curves_<curves>_<weights stem>.csv)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--only", default=None, help="comma-separated weight files of AGENTS to train (with --train)")
    ap.add_argument("--weights-dir", default="examples/weights")
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--out", default="fluidopt-examples/data")
    a = ap.parse_args()
    wdir, out = Path(a.weights_dir), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.train:
        wdir.mkdir(parents=True, exist_ok=True)
        only = set(a.only.split(",")) if a.only else None
        for label, variant, fname, extra, _ in agents:
            if only is not None and fname not in only:
                continue
            cmd = train_command(variant, wdir / fname, extra, out / f"rl_curves_{curves}_{Path(fname).stem}.csv")
            print("$", shlex.join(cmd), flush=True)
            c0 = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
            subprocess.run([sys.executable, "-m", "fluidopt", *cmd[1:]], check=True, cwd=ROOT)  # this interpreter's
            print(f"  {label}: {resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - c0:.0f} CPU s", file=sys.stderr)
    return a, wdir, out


def main() -> None:
    a, wdir, out = parse_and_train(AGENTS, "tis")
    sc = load_scenario(ROOT / SCENARIO)
    t0 = time.time()
    rows = []
    for pol in BASELINES:
        rows += run(sc, pol, pol, None, episodes=a.episodes, n_requests=a.requests, seed=a.seed)
    agents = [ag for ag in AGENTS if (wdir / ag[2]).exists()]
    for ag in AGENTS:
        if ag not in agents:
            print(f"skipping {ag[0]}: {wdir / ag[2]} not found (train it with --train --only {ag[2]})", file=sys.stderr)
    for label, variant, fname, _, cap in agents:
        rows += run(sc, label, f"{variant}-rl", str(wdir / fname), episodes=min(a.episodes, cap or a.episodes),
                    n_requests=a.requests, seed=a.seed)
    for rule in ("round-robin", "least-requests"):
        rows += run_on_ticks(sc, f"{rule} on 0.02 s ticks", rule, episodes=a.episodes, n_requests=a.requests,
                             seed=a.seed)
    df = pd.DataFrame(rows)
    df.to_csv(out / "rl_tis_episodes.csv", index=False)
    s = summarize(df)
    extra = df.groupby("policy", sort=False)[["wait_fraction", "max_instance_share", "min_instance_share"]].mean()
    s = s.join(extra, on="policy")
    s.to_csv(out / "rl_tis.csv", index=False)
    diag = []
    for label, _, fname, _, cap in agents:
        if cap is not None:  # the agent without the mask: no diagnostics (it may wait for ever)
            continue
        diag.append(diagnostics_row(sc, label, wdir / fname, [out / f"rl_curves_tis_{Path(fname).stem}.csv"],
                                    n_requests=a.requests, seed=a.seed))
    pd.DataFrame(diag).to_csv(out / "rl_tis_diagnostics.csv", index=False)
    print(f"{a.episodes} episodes x {a.requests} requests, seed {a.seed}, {time.time() - t0:.0f} s wall\n")
    print("| router | episodes | mean e2e (s) | vs round robin | TTFT (s) | TPOT (ms) | router wait (s) | waits | "
          "busiest / least busy instance |")
    print("|---|---|---|---|---|---|---|---|---|")
    for _, r in s.iterrows():
        rw = "" if math.isnan(r["router_wait_mean"]) else f"{r['router_wait_mean']:.3f}"
        wf = "" if math.isnan(r["wait_fraction"]) else f"{100 * r['wait_fraction']:.1f}%"
        sh = ("" if math.isnan(r["max_instance_share"]) else
              f"{100 * r['max_instance_share']:.1f}% / {100 * r['min_instance_share']:.1f}%")
        print(f"| {r['policy']} | {r['episodes']} | {r['e2e_mean']:.3f} ± {r['e2e_mean_ci']:.3f} | {r['improvement_pct']:.2f}% ± "
              f"{r['improvement_ci']:.2f} | {r['ttft_mean']:.3f} | {1000 * r['tpot_mean']:.2f} | {rw} | {wf} | {sh} |")
    print("\nPaired against the shipped wg-rl and against least requests (improvement of mean e2e, %):\n")
    print("| router | vs wg-rl | vs least-requests |")
    print("|---|---|---|")
    vw = summarize(df, baseline="wg-rl").set_index("policy")
    vl = summarize(df, baseline="least-requests").set_index("policy")
    for label, *_ in agents:
        print(f"| {label} | {vw.at[label, 'improvement_pct']:.2f}% ± {vw.at[label, 'improvement_ci']:.2f} | "
              f"{vl.at[label, 'improvement_pct']:.2f}% ± {vl.at[label, 'improvement_ci']:.2f} |")
    print_q_table(diag, 3)


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
