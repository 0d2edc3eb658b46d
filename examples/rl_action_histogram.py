"""Action histograms of trained RL routers: where a learned policy sends its requests (docs/rl.md section 8).

    python examples/rl_action_histogram.py SCENARIO WEIGHTS [WEIGHTS ...] [--gpus N] [--horizon S] [--seed S]
        [--episode-requests N]

Runs each weight file's router (as ``wg-rl`` with ``weights=``) once on the scenario (``--gpus``: with
that many GPUs; ``--episode-requests``: on one RL episode of that many requests instead of a
``--horizon``-second run of the scenario's workload) and prints, per file: the share of dispatches
each instance received (1 / m each when balanced), the busiest instance's share, the fraction of
decisions that waited, and the run's mean end-to-end latency and revenue per GPU per second. A
collapsed policy shows as one or a few instances taking most of the work.
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse

import numpy as np

from fluidopt.rl.core import episode_seed, episode_workload
from fluidopt.rl.evaluate import policy_options, run_episode
from fluidopt.scenario import load_scenario
from fluidopt.sim.api import make_engine


def histogram(scenario, weights: str, *, horizon: float, seed: int, episode_requests: int | None) -> dict:
    opts = policy_options("wg-rl", seed, extra={"weights": weights})
    if episode_requests:
        es = episode_seed(seed, 0)
        wl = episode_workload(scenario, episode_requests, es)
        res = run_episode(scenario, "wg-rl", wl, seed=es, options=policy_options("wg-rl", es, extra={"weights": weights}))
        ctrl = res.meta["controller"]
    else:
        eng = make_engine(scenario, "wg-rl", horizon=horizon, service="tokens", seed=seed, controller_options=opts,
                          progress=False)
        eng.start()
        eng.advance(horizon)
        res = eng.finish()
        ctrl = eng.controller
    sent = np.array(ctrl.sent, dtype=float)
    share = sent / max(1.0, sent.sum())
    return {"share": share, "max_share": float(share.max()), "min_share": float(share.min()),
            "wait_fraction": ctrl.waits / max(1, ctrl.decisions), "decisions": ctrl.decisions,
            "e2e_mean": float(res.cluster.get("e2e_mean", float("nan"))),
            "revenue_per_gpu": float(res.cluster.get("revenue_per_gpu", float("nan"))), "dispatch": ctrl.net.dispatch,
            "arch": ctrl.net.arch}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario")
    ap.add_argument("weights", nargs="+")
    ap.add_argument("--gpus", type=int, default=None)
    ap.add_argument("--horizon", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=2000)
    ap.add_argument("--episode-requests", type=int, default=None)
    a = ap.parse_args()
    sc = load_scenario(a.scenario)
    if a.gpus:
        sc = sc.with_gpus(a.gpus)
    for w in a.weights:
        h = histogram(sc, w, horizon=a.horizon, seed=a.seed, episode_requests=a.episode_requests)
        shares = " ".join(f"{100 * s:.1f}" for s in h["share"])
        print(f"{w} ({h['arch']}, {h['dispatch']} dispatch): busiest instance {100 * h['max_share']:.1f}% "
              f"(least {100 * h['min_share']:.1f}%, balanced {100 / sc.gpus:.1f}%), waits {100 * h['wait_fraction']:.1f}% "
              f"of {h['decisions']:,} decisions, mean e2e {h['e2e_mean']:.2f} s, revenue/GPU/s {h['revenue_per_gpu']:.1f}")
        print(f"  shares (%): {shares}")


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
