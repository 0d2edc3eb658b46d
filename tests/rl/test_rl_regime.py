"""The paper's operating point: the reserve action mask, the imitation router, per-scenario weights and
accuracies, and the regime map (library and command line)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from fluidopt.core.errors import ScenarioError, UsageError
from fluidopt.rl.core import LOG_COUNT_CAP, STATE_LAYOUT, STATE_LAYOUT_LOG, bucket_counts
from fluidopt.rl.mlp import WEIGHTS_DIR, load_weights, shipped_weights_path
from fluidopt.rl.predictors import TABLE1_ACCURACY, scenario_accuracy
from fluidopt.rl.regimes import regime_map, scenario_at
from fluidopt.scenario import load_scenario, scenario_from_dict
from fluidopt.workloads import TraceWorkload

from .conftest import RL_SCENARIO, ROOT

REGIME = ROOT / "examples" / "scenarios" / "rl-router-paper-regime.toml"
V8 = str(ROOT / "examples" / "scenarios" / "rl-router-v100-8.toml")


def kv_scenario():
    """Two instances with a 1,000-token KV cache (10 kept free); one class, mean output 400 tokens."""
    return scenario_from_dict({
        "name": "kv-1000",
        "gpu": {"alpha": 0.01, "beta": 1e-4, "tau_solo": 0.02, "chunk": 64, "batch": 8, "kv_capacity": 1000.0},
        "cluster": {"gpus": 2},
        "classes": [{"name": "a", "prompt": 100, "decode": 400, "rate": 1.0}],
    })


def test_reserve_mask_by_hand():
    from fluidopt.rl.env import RouterEnv

    # request 0 (prompt 500) arrives first, request 1 (prompt 100, 400 reserved) 1 ms later
    wl = TraceWorkload(pd.DataFrame({"time": [0.0, 0.001], "prompt": [500, 100], "output": [2000, 50], "cls": [0, 0]}),
                       ("a",))
    env = RouterEnv(kv_scenario(), workload=wl, wait_mask="reserve", multi_dispatch=True, max_time=5.0)
    env.reset(seed=0)
    assert env.action_masks().tolist() == [True, True, False]  # an empty fleet: any instance, no wait
    env.step(0)
    # instance 0 holds 500 prompt tokens: 1000 - 500 - 10 < 100 + 400; instance 1 is empty
    assert env.action_masks().tolist() == [False, True, False]
    with pytest.raises(ScenarioError, match="action 0 is masked"):
        env.step(0)
    with pytest.raises(ScenarioError, match="wait.*masked"):
        env.step(2)
    env.step(1)
    env.close()


def test_imitation_is_deterministic_and_agrees_with_the_rule():
    from fluidopt.rl.imitate import ImitationConfig, expert_action, imitate

    assert expert_action(np.array([0, 0, 0, 0, 0.3, 0, 0, 0, 0, 0, 0.5, 0, 0, 0, 0], dtype=np.float32),
                         np.array([True, False, False])) == 0  # the freer instance is not valid
    assert expert_action(np.zeros(15, dtype=np.float32), np.array([False, False, True])) == 2
    sc = scenario_at(load_scenario(REGIME), 20.0, 3000.0)
    cfg = ImitationConfig(episodes=1, n_requests=300, epochs=3, seed=3)
    a, st = imitate(sc, cfg)
    b, _ = imitate(sc, cfg)
    assert st["samples"] > 20 and st["waits"] > 0
    for (W1, b1), (W2, b2) in zip(a.scorer + a.wait, b.scorer + b.wait):
        assert np.array_equal(W1, W2) and np.array_equal(b1, b2)
    assert a.wait_mask == "reserve" and a.dispatch == "multi"


def test_each_shipped_scenario_has_its_default_wg_rl():
    reg, fig, v4, v8 = (load_scenario(ROOT / "examples" / "scenarios" / f) for f in
                        ("rl-router-paper-regime.toml", "rl-router-paper-regime-fig4b.toml", "rl-router-v100.toml",
                         "rl-router-v100-8.toml"))
    assert shipped_weights_path("wg", 4, reg.name) == WEIGHTS_DIR / "wg-rl-regime.npz"
    assert shipped_weights_path("wg", 4, fig.name) == WEIGHTS_DIR / "wg-rl-regime-fig4b.npz"
    assert shipped_weights_path("wg", 4, v4.name) == WEIGHTS_DIR / "wg-rl-tis.npz"
    assert shipped_weights_path("wg", 8, v8.name) == WEIGHTS_DIR / "wg-rl-tis.npz"
    assert shipped_weights_path("wg", 4, "other") == WEIGHTS_DIR / "wg-rl-4.npz"
    for f in ("wg-rl-regime.npz", "wg-rl-regime-fig4b.npz"):
        net = load_weights(WEIGHTS_DIR / f, n_instances=4)
        assert (net.arch, net.wait_mask, net.dispatch) == ("shared", "small-large", "multi")
        assert net.layout == STATE_LAYOUT_LOG  # the regime routers read the log-count state
    from fluidopt.control.registry import make_controller

    assert make_controller("wg-rl", reg).net.wait_mask == "small-large"
    assert make_controller("wg-rl", reg).layout == STATE_LAYOUT_LOG  # the router fills the file's layout
    assert make_controller("wg-rl", v8).net.arch == "shared"
    assert make_controller("wg-rl", v8).layout == STATE_LAYOUT  # older files: the v1 layout, as before


def test_small_large_expert_by_hand():
    from fluidopt.rl.imitate import small_large_action

    obs = np.zeros(27, dtype=np.float32)
    # bucket counts / 128 per instance: 3, 1, 5, 2 requests; free capacity 0.2, 0.9, 0.1, 0.3
    for g, (n, free) in enumerate(((3, 0.2), (1, 0.9), (5, 0.1), (2, 0.3))):
        obs[6 * g + 1] = n / 128
        obs[6 * g + 4] = free
    assert small_large_action(obs, np.array([True, True, False, False, False])) == 1  # fewer requests
    assert small_large_action(obs, np.array([False, False, True, True, False])) == 3
    obs[6 * 3 + 1] = 5 / 128  # a tie in requests (5, 5): the more free capacity
    assert small_large_action(obs, np.array([False, False, True, True, False])) == 3
    obs[6 * 3 + 4] = 0.1  # a full tie: the lowest index
    assert small_large_action(obs, np.array([False, False, True, True, False])) == 2


def test_log_layout_counts_do_not_saturate_and_read_back_exactly():
    from fluidopt.rl.imitate import small_large_action

    obs = np.zeros(27, dtype=np.float32)
    # instance g's three bucket counts, beyond B = 128 where the v1 entries are all 1
    counts = ((300, 40, 7), (250, 10, 100), (0, 1, 8192), (128, 129, 5000))
    for g, c in enumerate(counts):
        for j in range(3):
            obs[6 * g + 1 + j] = np.log1p(c[j]) / np.log1p(LOG_COUNT_CAP)
        obs[6 * g + 4] = 0.0
    for g, c in enumerate(counts):
        assert bucket_counts(obs, g, STATE_LAYOUT_LOG) == c
    assert obs[6 * 2 + 3] == pytest.approx(1.0)  # the cap reads 1
    # fewest requests within the group: 347 vs 360 (instance 0), 8193 vs 5257 (instance 3)
    assert small_large_action(obs, np.array([True, True, False, False, False]), STATE_LAYOUT_LOG) == 0
    assert small_large_action(obs, np.array([False, False, True, True, False]), STATE_LAYOUT_LOG) == 3
    with pytest.raises(ScenarioError, match="layout: expected one of"):
        bucket_counts(obs, 0, "fluidopt-rl-state-v0")


def test_environment_fills_the_log_layout_from_its_counters():
    from fluidopt.rl.env import RouterEnv
    from fluidopt.rl.imitate import ImitationConfig

    sc = load_scenario(REGIME)
    env = RouterEnv(sc, n_requests=400, wait_mask="small-large", multi_dispatch=True, seed=0, layout=STATE_LAYOUT_LOG)
    obs, _ = env.reset(seed=0)
    most = 0
    for _ in range(300):  # always the first valid instance: the load piles up on instances 0 and 2
        obs, _, term, trunc, _ = env.step(int(np.argmax(env.action_masks())))
        if term or trunc:
            break
        for g in range(4):
            assert bucket_counts(obs, g, STATE_LAYOUT_LOG) == tuple(env.core.cnt[g])
            assert obs[6 * g] == pytest.approx(np.log1p(env.core.n_prompt[g]) / np.log1p(LOG_COUNT_CAP), rel=1e-6)
        most = max(most, sum(env.core.cnt[0]))
    assert most > 128  # past the v1 layout's saturation
    env.close()
    with pytest.raises(ScenarioError, match="RouterEnv: layout: expected one of"):
        RouterEnv(sc, layout="v3")
    with pytest.raises(ScenarioError, match="imitation: layout: expected one of"):
        ImitationConfig(layout="v3")


def test_small_large_mask_follows_the_predicted_bucket():
    from fluidopt.rl.core import small_large_groups
    from fluidopt.rl.env import RouterEnv

    sc = load_scenario(REGIME)
    assert small_large_groups(sc) == (2, pytest.approx((62 * 334) ** 0.5))
    env = RouterEnv(sc, n_requests=60, wait_mask="small-large", multi_dispatch=True, seed=0)
    env.reset(seed=0)
    seen = set()
    done = False
    while not done:
        mask = env.action_masks().tolist()
        b = env.core.held[env.eng.head(env.core.router_queue)][0]
        assert mask == ([True, True, False, False, False] if b == 0 else [False, False, True, True, False])
        seen.add(b)
        if b == 0:
            with pytest.raises(ScenarioError, match="not in the head's Small-Large group"):
                env.step(3)
        _, _, term, trunc, _ = env.step(0 if b == 0 else 2)
        done = term or trunc
    assert seen >= {0, 1}
    env.close()


def test_table1_accuracies_apply_to_the_regime_scenario_by_class_name():
    reg = load_scenario(REGIME)
    assert scenario_accuracy(reg) == (0.931, 0.704, 0.799, 0.653, 0.951)
    assert scenario_accuracy(reg) == tuple(TABLE1_ACCURACY[c] for c in reg.class_names)
    assert scenario_accuracy(load_scenario(RL_SCENARIO)) == 0.79


def test_scenario_at_scales_the_mix_and_sets_the_cache():
    sc = scenario_at(load_scenario(RL_SCENARIO), 30.0, 5000.0)
    assert [c.rate for c in sc.classes] == [6.0] * 5 and sc.gpu.kv_capacity == 5000.0
    assert sc.name == "rl-router-v100" and sc.gpu.tau_solo == 0.017


def test_regime_map_small_grid_and_its_errors():
    sc = load_scenario(REGIME)
    t = regime_map(sc, ["max-capacity-reserve"], [20.0], [3000.0, 30000.0], episodes=2, n_requests=150)
    assert list(t.policy) == ["round-robin", "max-capacity-reserve"] * 2
    rr = t[t.policy == "round-robin"]
    assert (rr.improvement_pct == 0.0).all() and list(rr.kv_capacity) == [3000.0, 30000.0]
    for bad in ([0.0], [-1.0], [float("nan")]):
        with pytest.raises(ScenarioError, match="rates: expected finite numbers > 0"):
            regime_map(sc, ["jsq"], bad, [3000.0])
        with pytest.raises(ScenarioError, match="kv capacities: expected finite numbers > 0"):
            regime_map(sc, ["jsq"], [20.0], bad)
    with pytest.raises(UsageError, match="unknown policy 'no-such-router'"):
        regime_map(sc, ["no-such-router"], [20.0], [3000.0])
    v8 = load_scenario(ROOT / "examples" / "scenarios" / "rl-router-v100-8.toml")
    with pytest.raises(ScenarioError, match="trained for 4 instances, the scenario has 8"):
        regime_map(v8, ["wg-rl"], [20.0], [3000.0], options={"wg-rl": {"weights": str(WEIGHTS_DIR / "wg-rl-4.npz")}})


@pytest.mark.integration
def test_regimes_command_writes_table_and_heatmap_and_rejects_bad_grids(tmp_path, cli_here):
    out = tmp_path / "map"
    # the one real ``python -m fluidopt rl`` process of the suite (the entry point); the refusals below run here
    r = subprocess.run([sys.executable, "-m", "fluidopt", "rl", "regimes", str(REGIME), "--policies", "max-capacity",
                        "--rates", "20", "--kv", "3000", "--episodes", "2", "--requests", "100", "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    t = pd.read_csv(out / "regimes.csv")
    assert list(t.policy) == ["round-robin", "max-capacity"]
    assert (out / "regimes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for args, msg in ((["--rates", "20,0"], "--rates: expected numbers > 0, got 0"),
                      (["--kv", "-5"], "--kv: expected numbers > 0, got -5"),
                      (["--policies", "nope"], "unknown policy 'nope'"),
                      (["--option", f"wg-rl:weights={WEIGHTS_DIR / 'wg-rl-4.npz'}", "--policies", "wg-rl", V8],
                       "trained for 4 instances, the scenario has 8")):
        scen = [a for a in args if a == V8] or [str(REGIME)]
        args = [a for a in args if a != V8]
        r = cli_here("rl", "regimes", *scen, "--out", str(tmp_path / "x"), "--episodes", "1", "--requests", "50", *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert msg in r.stderr


def test_chunked_prefill_in_the_environment_and_the_routers():
    from fluidopt.control.registry import make_controller
    from fluidopt.rl.env import RouterEnv
    from fluidopt.rl.evaluate import evaluate, summarize

    sc = load_scenario(REGIME)
    env = RouterEnv(sc, n_requests=50, wait_mask="reserve", multi_dispatch=True, chunked=True, seed=0)
    env.reset(seed=0)
    assert env.core.chunked_prefill and env.eng.controller.chunked_prefill
    env.close()
    for name in ("wg-rl-chunked", "sb3-dqn-chunked", "max-capacity-reserve-chunked"):
        c = make_controller(name, sc)
        assert c.chunked_prefill and c.name == name
    df = evaluate(sc, ["round-robin-chunked", "wg-rl-chunked"], episodes=1, n_requests=200)
    s = summarize(df).set_index("policy")
    assert s.loc["round-robin-chunked", "improvement_pct"] == 0.0  # the chunked baseline
    assert (df.completed == 200).all()


def test_sb3_wrapper_and_export_match_the_torch_networks():
    pytest.importorskip("stable_baselines3")
    import torch
    from stable_baselines3 import DQN, PPO

    from fluidopt.rl.sb3 import export_dqn, export_ppo, make_env

    sc = load_scenario(REGIME)
    env = make_env(sc, seed=0, n_requests=150)
    obs, _ = env.reset(seed=0)
    steps = 0
    done = False
    while not done:  # every state the agent sees offers a choice; invalid actions are replaced
        assert env.env.action_masks().sum() > 1
        obs, _, term, trunc, _ = env.step(0)
        done = term or trunc
        steps += 1
    assert env.replaced > 0 and steps < 150
    X = torch.rand(20, 27)
    dqn = DQN("MlpPolicy", env, policy_kwargs={"net_arch": [64, 64]}, seed=0, device="cpu")
    net = export_dqn(dqn, 4, "{}")
    want = dqn.q_net.q_net(X).detach().numpy()
    got = np.array([net.q(x) for x in X.numpy()])
    assert np.allclose(got, want, atol=1e-5) and net.wait_mask == "reserve"
    ppo = PPO("MlpPolicy", env, seed=0, device="cpu", n_steps=64, batch_size=32,
              policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "activation_fn": torch.nn.ReLU})
    net = export_ppo(ppo, 4, "{}")
    want = ppo.policy.action_net(ppo.policy.mlp_extractor.policy_net(X)).detach().numpy()
    assert np.allclose(np.array([net.q(x) for x in X.numpy()]), want, atol=1e-5)
    env.close()


@pytest.mark.integration
def test_imitate_and_evaluate_reject_bad_input_with_exit_2(tmp_path, cli_here):
    for args, msg in ((["imitate", str(REGIME), "--epochs", "0", "--out", str(tmp_path / "w.npz")],
                       "--epochs: expected an integer >= 1, got 0"),
                      (["imitate", str(REGIME), "--state", "v3", "--out", str(tmp_path / "w.npz")],
                       "--state: invalid choice: 'v3'"),
                      (["evaluate", str(REGIME), "--accuracy", "1.5", "--episodes", "1"],
                       "--accuracy: expected a probability in [0, 1], got 1.5"),
                      (["evaluate", str(REGIME), "--policies", "wg-rl", "--episodes", "1", "--option",
                        f"wg-rl:weights={tmp_path / 'none.npz'}"], "none.npz: no such file")):
        r = cli_here("rl", *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert msg in r.stderr
