"""Write your own routing controller, register it under a name, and simulate it (docs/routing.md).

The controller below, ``class-affinity``, is a router of the instance architecture (each GPU a
vLLM-like instance with its own queue): every request class has a *home* set of ``spread``
instances (class i: instances i*spread, ..., i*spread + spread - 1, modulo n), and a request joins
the home instance with the fewest outstanding requests. That is what a router does to keep a
class's shared prompt prefix in few instances' prefix caches. fluidopt's simulator has no prefix
cache, so here it only pays the price of affinity (less balance) and none of the benefit: the
example shows the mechanics, not a recommendation.

Registering takes one decorator; the name then works wherever fluidopt names policies
(``simulate(..., controller="class-affinity")``, the comparison harness, and the CLI's ``--policy``
once the module defining it is imported). The workload is the RL-router paper's five tasks
(docs/routing.md) with lognormal lengths on a V100-like profile.

    python examples/custom_controller.py                   # 8 instances, 300 s, 3 seeds
    python examples/custom_controller.py --gpus 4 --horizon 60 --seeds 1
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse

import pandas as pd

from fluidopt import GPUProfile, RequestClass, Scenario
from fluidopt.control.instance import InstanceScheduler
from fluidopt.control.protocol import Context
from fluidopt.control.registry import available, register
from fluidopt.core.errors import ScenarioError
from fluidopt.sim.api import simulate


# -------------------------------------------------------------------------------------------------
# 1. The controller: an InstanceScheduler subclass only decides where each arrival goes
# -------------------------------------------------------------------------------------------------
class ClassAffinity(InstanceScheduler):
    """Each class has ``spread`` home instances; join the one with the fewest outstanding requests.

    The base class does everything instance-local (FCFS queue per instance, prefill first, decode in
    place, recompute preemption when the KV cache overflows); ``route`` only picks the instance.
    Cost per decision: O(spread).
    """

    name = "class-affinity"

    def __init__(self, spread: int = 2, **kw):
        super().__init__(**kw)  # chunked=False (vLLM prefill-first) unless chunked=True
        if isinstance(spread, bool) or not isinstance(spread, int) or spread < 1:
            raise ScenarioError(f"class-affinity: spread: expected an integer >= 1 (instances per class), got {spread!r}")
        self.spread = spread

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)  # keep this: it finds the instance queues
        n, k = ctx.n_gpus, min(self.spread, ctx.n_gpus)
        self.home = [[(i * k + j) % n for j in range(k)] for i in range(ctx.n_classes)]

    def route(self, ctx: Context, r: int) -> int:
        home = self.home[ctx.req_class(r)]
        return min(home, key=ctx.instance_requests)  # ties: the first home instance


# -------------------------------------------------------------------------------------------------
# 2. Register it: factory(scenario, **options) -> Controller
# -------------------------------------------------------------------------------------------------
@register("class-affinity", description="each class has `spread` home instances; fewest requests among them")
def make_class_affinity(scenario: Scenario, *, spread: int = 2, chunked: bool = False) -> ClassAffinity:
    return ClassAffinity(spread=spread, chunked=chunked)


# -------------------------------------------------------------------------------------------------
# 3. Simulate it next to built-in balancers
# -------------------------------------------------------------------------------------------------
TASKS = (("translation", 29, 62), ("eli5", 30, 334), ("imdb", 212, 143), ("squad", 125, 220), ("wnut", 26, 64))


def five_task_scenario(gpus: int, rate_per_gpu: float) -> Scenario:
    """V100-like instances (prefill 3.2e-4 s/token, decode 0.017 s + 7e-7 s per token of context,
    30k-token KV cache, batch 128) serving five tasks at ``rate_per_gpu`` requests/s per instance."""
    gpu = GPUProfile(alpha=0.017, beta=3.2e-4, tau_solo=0.017, chunk=128, batch=128, kv_capacity=30000.0,
                     kv_time_per_token=7e-7, name="v100-like")
    rate = rate_per_gpu * gpus / len(TASKS)
    classes = tuple(RequestClass(name, prompt=p, decode=d, rate=rate, lengths="lognormal", prompt_sigma=1.0,
                                 decode_sigma=1.0) for name, p, d in TASKS)
    return Scenario(gpu=gpu, gpus=gpus, classes=classes, name="five-tasks")


def compare(gpus: int = 8, rate_per_gpu: float = 5.0, horizon: float = 300.0, warmup: float = 30.0,
            seeds: int = 3, policies: tuple[str, ...] = ("round-robin", "least-requests", "class-affinity")
            ) -> pd.DataFrame:
    """Mean end-to-end latency and time to first token (seconds) per policy, averaged over seeds."""
    sc = five_task_scenario(gpus, rate_per_gpu)
    rows = []
    for policy in policies:
        for seed in range(seeds):
            res = simulate(sc, policy, horizon=horizon, warmup=warmup, seed=seed, service="tokens")
            c = res.cluster
            rows.append({"policy": policy, "seed": seed, "e2e_mean_s": c["e2e_mean"], "e2e_p99_s": c["e2e_p99"],
                         "ttft_mean_s": c["ttft_mean"], "throughput": c["throughput"],
                         "preemptions": res.totals["preemptions"]})
    df = pd.DataFrame(rows)
    return df.groupby("policy", sort=False).mean(numeric_only=True).drop(columns="seed")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=8, help="instances (default 8)")
    ap.add_argument("--rate", type=float, default=5.0, help="requests/s per instance (default 5)")
    ap.add_argument("--horizon", type=float, default=300.0, help="simulated seconds per run (default 300)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per policy (default 3)")
    args = ap.parse_args(argv)
    print("registered:", "class-affinity", "-", available()["class-affinity"])
    table = compare(args.gpus, args.rate, args.horizon, min(30.0, args.horizon / 5), args.seeds)
    print(f"five tasks, {args.gpus} instances, {args.rate:g} req/s each, {args.horizon:g} s x {args.seeds} seeds")
    print(table.to_string(float_format=lambda v: f"{v:.4g}"))
    return 0


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
