"""``fluidopt rl``: train the RL router (Double DQN) and evaluate routers head to head on RL episodes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fluidopt.core.errors import UsageError

EPILOG = """\
examples:
  fluidopt rl train examples/scenarios/rl-router-v100.toml --variant wg --out wg-rl-4.npz
  fluidopt rl train examples/scenarios/rl-router-v100-8.toml --arch shared --multi-dispatch --wait-mask fits --out wg-rl-8.npz
  fluidopt rl evaluate examples/scenarios/rl-router-v100.toml --policies round-robin,jsq,wg-rl --episodes 5
  fluidopt rl evaluate examples/scenarios/rl-router-v100.toml --policies wg-rl --option wg-rl:weights=wg-rl-4.npz
  fluidopt rl imitate examples/scenarios/rl-router-paper-regime.toml --expert small-large --state log --out wg.npz
  fluidopt rl regimes examples/scenarios/rl-router-paper-regime.toml --rates 10,20,30 --kv 3000,8000,30000 --out regimes

Training needs the rl extra: pip install -e ".[rl]". Evaluation (and the registered policies
baseline-rl, wa-rl, wg-rl) runs without it. See docs/rl.md.
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("rl", help="train and evaluate the workload-guided RL router",
                              description="Train the RL router (Double DQN) or evaluate routers on RL episodes.",
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="rl_command", metavar="ACTION")
    t = sub.add_parser("train", help="train a Double DQN router and write its weight file (.npz)")
    t.add_argument("scenario", metavar="SCENARIO", help="scenario TOML (instances = its GPUs)")
    t.add_argument("--variant", choices=("baseline", "wa", "wg"), default="wg", help="reward variant (default wg)")
    t.add_argument("--episodes", type=int, default=30, help="training episodes (default 30)")
    t.add_argument("--requests", type=int, default=2000, help="requests per episode (default 2000)")
    t.add_argument("--seed", type=int, default=0, help="seed: same seed, same weights bit for bit (default 0)")
    t.add_argument("--eps-episodes", type=int, default=20, help="episodes of epsilon-greedy exploration (default 20)")
    t.add_argument("--train-every", type=int, default=1, help="environment steps per gradient update (default 1)")
    t.add_argument("--objective", choices=("latency", "revenue", "lost-revenue", "time-in-system", "request-latency",
                                            "request-normalized", "request-excess"), default="latency",
                   help="reward: the RL paper's latency reward (default), revenue in price units, or minus the "
                        "revenue of abandoned requests, or minus the request-seconds in the system (time-in-system: sums to minus "
                        "the total end-to-end latency; an ablation, docs/rl.md section 2), or per-request credit (request-latency: "
                        "each dispatch is credited with minus its own request's time from dispatch to resolution, a "
                        "gamma = 0 target; request-normalized: the same with the realised output length replaced by the "
                        "predicted one; request-excess: the time from dispatch to resolution less the request's "
                        "solo service time; ablations, docs/rl.md section 2)")
    t.add_argument("--arch", choices=("mlp", "shared"), default="mlp",
                   help="Q-network: the paper's MLP (default; fixed instance count) or the per-instance "
                        "shared-weights scorer (any instance count)")
    t.add_argument("--multi-dispatch", action="store_true",
                   help="decide again at the same epoch after a dispatch, until 'wait' or an empty router queue "
                        "(default: the paper's one decision per 0.02 s epoch)")
    t.add_argument("--wait-mask", choices=("none", "fits"), default="none",
                   help="'fits': 'wait' is valid only when the head of the router queue fits on no instance, "
                        "in training and in the trained router (default 'none': the paper's MDP; docs/rl.md section 2)")
    t.add_argument("--hidden", type=int, default=None, help="hidden width (default: 64 m / 4 for mlp, 32 for shared)")
    t.add_argument("--batch-size", type=int, default=512, help="replay batch (default 512)")
    t.add_argument("--gamma", type=float, default=0.99, help="discount per 0.02 s epoch (default 0.99)")
    t.add_argument("--reward-scale", type=float, default=0.01, help="reward multiplier for the optimiser (default 0.01)")
    t.add_argument("--out", required=True, metavar="FILE", help="weight file to write (.npz)")
    t.add_argument("--curves", default=None, metavar="CSV", help="write the per-episode training curves")
    t.add_argument("--checkpoint", default=None, metavar="FILE", help="torch checkpoint after every episode")
    t.add_argument("--progress", action="store_true", help="a progress line with the episode reward on stderr")
    i = sub.add_parser("imitate", help="fit a router to a rule (the reserving hold rule or Small-Large) by "
                                       "behaviour cloning and write its weight file (.npz)")
    i.add_argument("scenario", metavar="SCENARIO", help="scenario TOML (instances = its GPUs)")
    i.add_argument("--episodes", type=int, default=8, help="rule-driven episodes recorded (default 8)")
    i.add_argument("--requests", type=int, default=2000, help="requests per episode (default 2000)")
    i.add_argument("--epochs", type=int, default=60, help="passes over the recorded decisions (default 60)")
    i.add_argument("--seed", type=int, default=0, help="seed: same seed, same weights bit for bit (default 0)")
    i.add_argument("--expert", choices=("reserve", "small-large"), default="reserve",
                   help="the rule to fit, under its own action mask: the reserving hold rule (reserve, the default) "
                        "or Dedicated Small-Large's groups (small-large)")
    i.add_argument("--hidden", type=int, default=32, help="hidden width (default 32)")
    i.add_argument("--state", choices=("v1", "log"), default="v1",
                   help="state layout: v1 (request counts / 128, capped at 1; the default) or log (log1p(count) / "
                        "log1p(8192): no saturation in a deep overload; docs/rl.md section 6b)")
    i.add_argument("--out", required=True, metavar="FILE", help="weight file to write (.npz)")
    i.add_argument("--progress", action="store_true", help="progress lines on stderr")
    e = sub.add_parser("evaluate", help="run routers on the same RL episodes and print the comparison table")
    e.add_argument("scenario", metavar="SCENARIO")
    e.add_argument("--policies", default=None,
                   help="comma-separated policy names (default: the RL paper's table: round-robin ... wg-rl, and "
                        "sb3-dqn, sb3-ppo where the scenario ships them)")
    e.add_argument("--episodes", type=int, default=20, help="episodes (default 20)")
    e.add_argument("--requests", type=int, default=2000, help="requests per episode (default 2000)")
    e.add_argument("--seed", type=int, default=1000, help="evaluation seed (default 1000, apart from training's)")
    e.add_argument("--accuracy", type=float, default=None,
                   help="noisy-oracle bucket accuracy (default: the paper's Table 1 per task for "
                        "rl-router-paper-regime, else 0.79)")
    e.add_argument("--option", action="append", default=[], metavar="POLICY:KEY=VALUE",
                   help="an option for one policy (repeatable), e.g. wg-rl:weights=my.npz")
    e.add_argument("--csv", default=None, metavar="FILE", help="write the per-episode rows")
    e.add_argument("--json", action="store_true", help="print the summary as JSON")
    g = sub.add_parser("regimes", help="routers over a grid of arrival rate x KV capacity per instance: a table "
                                       "(CSV) and a heatmap of each router's gain over round robin")
    g.add_argument("scenario", metavar="SCENARIO")
    g.add_argument("--policies", default=None,
                   help="comma-separated routers (default: round-robin, least-requests, jsq, min-min, small-large, "
                        "max-capacity, max-capacity-reserve, wg-rl)")
    g.add_argument("--rates", default="10,20,30", help="total arrival rates, requests/s (default 10,20,30)")
    g.add_argument("--kv", default="3000,5000,8000,30000",
                   help="KV tokens per instance (default 3000,5000,8000,30000)")
    g.add_argument("--episodes", type=int, default=5, help="episodes per cell (default 5)")
    g.add_argument("--requests", type=int, default=2000, help="requests per episode (default 2000)")
    g.add_argument("--seed", type=int, default=1000, help="evaluation seed (default 1000)")
    g.add_argument("--option", action="append", default=[], metavar="POLICY:KEY=VALUE",
                   help="an option for one policy (repeatable), e.g. wg-rl:weights=my.npz")
    g.add_argument("--out", required=True, metavar="FOLDER",
                   help="folder for regimes.csv and regimes.png (written together, or neither)")
    g.add_argument("--progress", action="store_true", help="one line per grid cell on stderr")
    return p


def _numbers(text: str, flag: str) -> list[float]:
    """Comma-separated positive numbers of a grid flag; a clear error otherwise."""
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            v = float(part)
        except ValueError:
            raise UsageError(f"{flag}: expected comma-separated numbers, got {part!r}") from None
        if not (v > 0 and v < float("inf")):
            raise UsageError(f"{flag}: expected numbers > 0, got {part}")
        out.append(v)
    return out


def _policy_options(specs: list[str]) -> dict[str, dict]:
    from fluidopt.commands._options import parse_options

    opts: dict[str, dict] = {}
    for spec in specs:
        pol, sep, rest = spec.partition(":")
        if not sep:
            raise UsageError(f"--option {spec!r}: expected POLICY:KEY=VALUE")
        opts.setdefault(pol.strip(), {}).update(parse_options([rest]))
    return opts


def _regimes(args) -> int:
    from fluidopt.core.files import lock_folder, write_generation
    from fluidopt.rl.predictors import scenario_accuracy
    from fluidopt.rl.regimes import DEFAULT_ROUTERS, regime_figure, regime_map
    from fluidopt.scenario import load_scenario

    pols = DEFAULT_ROUTERS if not args.policies else tuple(s.strip() for s in args.policies.split(",") if s.strip())
    rates = _numbers(args.rates, "--rates")
    caps = _numbers(args.kv, "--kv")
    if args.episodes < 1 or args.requests < 1:
        raise UsageError("--episodes and --requests: expected integers >= 1")
    opts = _policy_options(args.option)
    scenario = load_scenario(args.scenario)
    with lock_folder(args.out, "--out", "fluidopt rl regimes") as out:
        def prog(msg):
            print(f"  {msg}", file=sys.stderr, flush=True)

        try:
            table = regime_map(scenario, pols, rates, caps, episodes=args.episodes, n_requests=args.requests,
                               seed=args.seed, accuracy=scenario_accuracy(scenario), options=opts,
                               progress=prog if (args.progress or sys.stderr.isatty()) else None)
        except KeyboardInterrupt as e:
            import fluidopt.core.interrupt as interrupt

            raise interrupt.interrupted_from(e, f"nothing written to {args.out} (the map is written whole or not "
                                                "at all); rerun the same command") from None
        import matplotlib

        matplotlib.use("Agg")
        title = f"{scenario.name}: {args.episodes} episodes x {args.requests} requests per cell, seed {args.seed}"
        fig = regime_figure(table, title)
        files = write_generation(out, {"regimes.csv": lambda p: table.to_csv(p, index=False),
                                       "regimes.png": lambda p: fig.savefig(p, dpi=110, format="png")},
                                 owned=("regimes.csv", "regimes.png"))
    for (lam, kv), grp in table.groupby(["rate", "kv_capacity"], sort=True):
        rr = grp.set_index("policy").loc["round-robin"]
        cells = "  ".join(f"{r.policy} {r.improvement_pct:+.1f}±{r.improvement_ci:.1f}"
                          for r in grp.itertuples() if r.policy != "round-robin")
        print(f"rate {lam:g}/s, KV {kv:g}: RR {rr.e2e_mean:.2f} s, {rr.preemptions:.0f} preemptions | {cells}")
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


def _check_counts(args, names: tuple[str, ...]) -> None:
    """The training commands' counts (each >= 1) and --seed (>= 0), before any work."""
    for name in names:
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}: expected an integer >= 1, got {getattr(args, name)}")
    if args.seed < 0:
        raise UsageError(f"--seed: expected an integer >= 0, got {args.seed}")


def _train(args) -> int:
    # the numbers first: a typo is reported before torch's import (about 2.5 CPU-s), not after
    _check_counts(args, ("episodes", "requests", "train_every", "batch_size"))
    if args.hidden is not None and args.hidden < 1:
        raise UsageError(f"--hidden: expected an integer >= 1, got {args.hidden}")
    if not 0.0 < args.gamma <= 1.0:
        raise UsageError(f"--gamma: expected a number in (0, 1], got {args.gamma}")
    if not args.reward_scale > 0.0:
        raise UsageError(f"--reward-scale: expected a number > 0, got {args.reward_scale}")
    from fluidopt.rl import require_extra

    require_extra("training")
    from fluidopt.commands._checks import check_output_file
    from fluidopt.rl.dqn import DQNConfig, train
    from fluidopt.rl.mlp import save_weights
    from fluidopt.scenario import load_scenario

    for flag in ("out", "curves", "checkpoint"):  # before hours of training, not after
        check_output_file(getattr(args, flag), f"--{flag}")
    scenario = load_scenario(args.scenario)
    cfg = DQNConfig(variant=args.variant, episodes=args.episodes, n_requests=args.requests, seed=args.seed,
                    eps_episodes=args.eps_episodes, train_every=args.train_every, objective=args.objective,
                    arch=args.arch, multi_dispatch=args.multi_dispatch, wait_mask=args.wait_mask, hidden=args.hidden, batch_size=args.batch_size,
                    gamma=args.gamma, reward_scale=args.reward_scale)
    try:
        res = train(scenario, cfg, checkpoint=args.checkpoint, progress=args.progress)
    except KeyboardInterrupt as e:
        import fluidopt.core.interrupt as interrupt

        kept = (f"no weights written to {args.out}" + (f"; the last whole episode's state is in {args.checkpoint}"
                                                      if args.checkpoint else "")
                + "; rerun the same command to train again (same seed, same weights)")
        raise interrupt.interrupted_from(e, kept) from None
    cmd = (f"fluidopt rl train {args.scenario} --variant {args.variant} --episodes {args.episodes} "
           f"--requests {args.requests} --seed {args.seed} --eps-episodes {args.eps_episodes} "
           f"--train-every {args.train_every}{f' --objective {args.objective}' if args.objective != 'latency' else ''}"
           + (f" --arch {args.arch}" if args.arch != "mlp" else "") + (" --multi-dispatch" if args.multi_dispatch else "")
           + (f" --wait-mask {args.wait_mask}" if args.wait_mask != "none" else "")
           + (f" --hidden {args.hidden}" if args.hidden is not None else "")
           + (f" --batch-size {args.batch_size}" if args.batch_size != 512 else "")
           + (f" --gamma {args.gamma}" if args.gamma != 0.99 else "")
           + (f" --reward-scale {args.reward_scale}" if args.reward_scale != 0.01 else "") + f" --out {args.out}")
    path = save_weights(args.out, res.net, command=cmd)
    if args.curves:
        from fluidopt.core.files import atomic_path

        with atomic_path(args.curves) as tmp:
            res.curves.to_csv(tmp, index=False)
    last = res.curves.iloc[-1]
    print(f"wrote {path} ({path.stat().st_size:,} bytes): {args.variant}-rl, {len(res.curves)} episodes, "
          f"{res.state['steps']:,} steps, {res.wall_seconds:.0f} s; last episode reward {last['reward']:,.1f}, "
          f"mean e2e {last['e2e_mean']:.3f} s")
    return 0


def _imitate(args) -> int:
    # the numbers first: a typo is reported before torch's import (about 2.5 CPU-s), not after
    _check_counts(args, ("episodes", "requests", "epochs", "hidden"))
    from fluidopt.rl import require_extra

    require_extra("training")
    from fluidopt.commands._checks import check_output_file
    from fluidopt.rl.core import STATE_LAYOUT, STATE_LAYOUT_LOG
    from fluidopt.rl.imitate import ImitationConfig, imitate
    from fluidopt.rl.mlp import save_weights
    from fluidopt.rl.predictors import scenario_accuracy
    from fluidopt.scenario import load_scenario

    check_output_file(args.out, "--out")
    scenario = load_scenario(args.scenario)
    cfg = ImitationConfig(episodes=args.episodes, n_requests=args.requests, epochs=args.epochs, seed=args.seed,
                          accuracy=scenario_accuracy(scenario), expert=args.expert, hidden=args.hidden,
                          layout=STATE_LAYOUT_LOG if args.state == "log" else STATE_LAYOUT)

    def prog(msg):
        print(f"  {msg}", file=sys.stderr)

    try:
        net, st = imitate(scenario, cfg, progress=prog if args.progress else None)
    except KeyboardInterrupt as e:
        import fluidopt.core.interrupt as interrupt

        raise interrupt.interrupted_from(e, f"no weights written to {args.out}; rerun the same command "
                                            "(same seed, same weights)") from None
    cmd = (f"fluidopt rl imitate {args.scenario} --expert {args.expert} --episodes {args.episodes} "
           f"--requests {args.requests} --epochs {args.epochs} --hidden {args.hidden} --seed {args.seed}"
           + (" --state log" if args.state == "log" else "") + f" --out {args.out}")
    path = save_weights(args.out, net, command=cmd)
    print(f"wrote {path} ({path.stat().st_size:,} bytes): {st['samples']:,} decisions with a choice, agreement "
          f"with the rule {100 * st['agreement']:.2f}%, cross-entropy {st['loss']:.4f}, {st['wall_seconds']:.0f} s")
    return 0


def _evaluate(args) -> int:
    from fluidopt.control.registry import make_controller  # noqa: F401  (built-ins registered on first use)
    from fluidopt.rl.evaluate import PAPER_POLICIES, evaluate, summarize
    from fluidopt.scenario import load_scenario

    opts = _policy_options(args.option)
    if args.episodes < 1 or args.requests < 1:
        raise UsageError("--episodes and --requests: expected integers >= 1")
    from fluidopt.commands._checks import check_output_file

    check_output_file(args.csv, "--csv")
    scenario = load_scenario(args.scenario)
    if args.policies:
        pols = tuple(s.strip() for s in args.policies.split(",") if s.strip())
    else:  # the paper's table, and the stable-baselines3 reference agents where the scenario ships them
        from fluidopt.rl.mlp import SCENARIO_WEIGHTS

        pols = PAPER_POLICIES + tuple(p for p in ("sb3-dqn", "sb3-ppo") if (p, scenario.name) in SCENARIO_WEIGHTS)
    if args.accuracy is not None and not 0.0 <= args.accuracy <= 1.0:
        raise UsageError(f"--accuracy: expected a probability in [0, 1], got {args.accuracy}")
    from fluidopt.rl.predictors import scenario_accuracy

    accuracy = args.accuracy if args.accuracy is not None else scenario_accuracy(scenario)

    import time

    from fluidopt.harness.executor import Progress

    tty, t0, last = sys.stderr.isatty(), time.perf_counter(), [time.perf_counter()]

    def prog(row):
        # every episode on a terminal; off one (a log), a line every few seconds, as the sweeps do
        now = time.perf_counter()
        if tty or now - last[0] >= Progress.LOG_EVERY:
            last[0] = now
            print(f"  episode {row['episode']} {row['policy']}: e2e {row['e2e_mean']:.3f} s"
                  + ("" if tty else f" ({now - t0:.0f} s elapsed)"), file=sys.stderr, flush=True)

    try:
        df = evaluate(scenario, pols, episodes=args.episodes, n_requests=args.requests, seed=args.seed,
                      accuracy=accuracy, options=opts, progress=None if args.json else prog)
    except KeyboardInterrupt as e:
        import fluidopt.core.interrupt as interrupt

        raise interrupt.interrupted_from(e, "no table written (an evaluation is only whole with every episode of "
                                            "every policy); rerun the same command") from None
    if args.csv:
        from fluidopt.core.files import atomic_path

        with atomic_path(args.csv) as tmp:
            df.to_csv(tmp, index=False)
    s = summarize(df)
    from fluidopt.rl.policies import foreign_weights

    # A router run on weights trained for another scenario measures a transfer, not the method: say so
    # beside its number, or a -180% reads as a broken router.
    foreign = {p: foreign_weights(p, scenario, opts.get(p, {}).get("weights")) for p in s["policy"]}
    if args.json:
        rows = [dict(r, weights_trained_on=foreign[r["policy"]]) for r in s.to_dict(orient="records")]
        print(json.dumps(rows, indent=2, default=float))
    else:
        print(f"{scenario.name}: {args.episodes} episodes x {args.requests} requests, seed {args.seed}")
        print(f"{'policy':22s} {'e2e mean (s)':>18s} {'vs RR %':>14s} {'paper %':>8s} {'TTFT (s)':>9s} "
              f"{'TPOT (s)':>9s} {'preempt':>8s} {'done %':>7s}")
        for _, r in s.iterrows():
            imp = f"{r.get('improvement_pct', float('nan')):6.2f}+-{r.get('improvement_ci', float('nan')):.2f}"
            pap = "" if r["paper_improvement_pct"] != r["paper_improvement_pct"] else f"{r['paper_improvement_pct']:.2f}"
            name = r["policy"] + (" *" if foreign[r["policy"]] else "")
            print(f"{name:22s} {r['e2e_mean']:9.3f}+-{r['e2e_mean_ci']:<7.3f} {imp:>14s} {pap:>8s} "
                  f"{r['ttft_mean']:9.3f} {r['tpot_mean']:9.4f} {r['preemptions']:8.1f} "
                  f"{100 * r.get('completed_share', float('nan')):7.1f}")
        for on in dict.fromkeys(v for v in foreign.values() if v):
            pols_on = ", ".join(p for p, v in foreign.items() if v == on)
            print(f"* {pols_on}: weights trained on {on}, not on {scenario.name}; their numbers here measure "
                  f"a transfer, not the router (train weights for this scenario: fluidopt rl train "
                  f"{args.scenario} --variant VARIANT --out FILE, then --option POLICY:weights=FILE)")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.rl_command == "train":
        return _train(args)
    if args.rl_command == "evaluate":
        return _evaluate(args)
    if args.rl_command == "imitate":
        return _imitate(args)
    if args.rl_command == "regimes":
        return _regimes(args)
    raise UsageError("rl: expected an action: train, imitate, evaluate or regimes (fluidopt rl --help)")
