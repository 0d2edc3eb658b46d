"""The ``fits`` wait mask (docs/rl.md section 2): "wait" is valid only when the head of the router
queue fits on no instance; hand-built states in the environment and in a snapshot-driven router."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fluidopt.core.errors import ScenarioError
from fluidopt.rl.mlp import SCORER_IN, WAIT_IN, SharedQNetwork, load_weights, save_weights
from fluidopt.workloads import TraceWorkload

from .conftest import blocked_env, tiny_scenario


def _wl(rows):
    return TraceWorkload(pd.DataFrame(rows, columns=["time", "prompt", "output", "cls"]), ("short", "long"), name="mask")


def _always_wait(dispatch: str = "multi", wait_mask: str = "fits", m: int = 2) -> SharedQNetwork:
    """Scores instance g by its free-capacity entry (x_g[4], at most 1); Q(wait) = mean score + 5: it
    always prefers to wait."""
    W0 = np.zeros((SCORER_IN, 1), np.float32)
    W0[4, 0] = 1.0
    scorer = ((W0, np.zeros(1, np.float32)), (np.ones((1, 1), np.float32), np.zeros(1, np.float32)))
    wait = ((np.zeros((WAIT_IN, 1), np.float32), np.zeros(1, np.float32)),
            (np.ones((1, 1), np.float32), np.array([5.0], np.float32)))
    return SharedQNetwork(scorer, wait, m, "baseline", "{}", dispatch, wait_mask)


def test_mask_on_hand_built_kv_states():
    """Two instances with a 2,000-token cache (1% watermark: 20), each holding one 900-token prompt:
    a 1,500-token head fits on neither (wait valid), a 50-token head fits on instance 0."""
    pytest.importorskip("gymnasium")
    from fluidopt.rl.env import RouterEnv

    sc = tiny_scenario(gpus=2, batch=8, kv=2000.0)
    for head_prompt, expect_fit in ((1500, -1), (50, 0)):
        wl = _wl([(0.001, 900, 6000, 1), (0.002, 900, 6000, 1), (0.05, head_prompt, 20, 0)])
        env = RouterEnv(sc, workload=wl, pin={0: 0, 1: 1}, variant="baseline", wait_mask="fits", max_time=5.0)
        obs, _ = env.reset(seed=0)
        eng, core = env.eng, env.core
        assert eng.qlen(core.router_queue) == 1 and eng.now == pytest.approx(0.06)
        for g in range(2):  # by hand: one request each, in its prefill (0.017 + 3.2e-4 x 900 = 0.305 s)
            assert eng.instance_requests(g) == 1 and eng.gpu_prefill(g) == g
            assert eng.gpu_kv_free(g) == 1100.0  # free KV: 2,000 - 900; 1,100 - 20 (watermark) < 1,500
            # the state's free-capacity entry also subtracts the prompt in prefill: (2000 - 900 - 900) / 2000
            assert obs[6 * g + 4] == pytest.approx(0.1, abs=1e-6)
        assert core.head_fits(eng) == expect_fit
        assert env.wait_valid() == (expect_fit < 0)
        assert env.action_masks().tolist() == [True, True, expect_fit < 0]
        if expect_fit < 0:
            env.step(2)  # a valid wait: one epoch passes, the head still waits
            assert env.last_epochs == pytest.approx(1.0) and eng.qlen(core.router_queue) == 1 and env.wait_valid()
        else:
            with pytest.raises(ScenarioError, match=r"action 2 \(wait\) is masked: the head of the router queue fits "
                                                    r"on instance 0"):
                env.step(2)
        # the paper's MDP (no mask): wait is always valid
        env.wait_mask = "none"
        assert env.wait_valid() and env.action_masks().all()
    with pytest.raises(ScenarioError, match="wait_mask: expected one of none, fits, reserve, small-large, got 'sometimes'"):
        RouterEnv(sc, workload=wl, wait_mask="sometimes")


def test_mask_on_an_idle_fleet_and_on_full_batches_in_a_snapshot():
    """Batch 2 on two instances: an idle fleet always fits the head (wait invalid); once every instance
    holds two requests (running or queued) no slot is free and wait is valid again."""
    from fluidopt.control.snapshot import ClusterSnapshot
    from fluidopt.rl.policies import RLRouter

    sc = tiny_scenario(gpus=2, batch=2)
    ctrl = RLRouter(sc, _always_wait(), name="baseline-rl")
    snap = ClusterSnapshot(sc.gpus, sc.gpu.batch, sc.class_names, seed=0, service="tokens")
    snap.setup(ctrl)
    assert ctrl.head_fits(snap) == -1  # no head
    for _ in range(6):
        ctrl.on_arrival(snap, snap.add_request(0, 50, 20))
    assert ctrl.head_fits(snap) == 0 and not ctrl.wait_valid(snap, "fits") and ctrl.wait_valid(snap, "none")
    snap.now = 0.02
    ctrl.on_tick(snap)
    # the network always prefers "wait": the mask overrode it four times (one per free slot), and the fifth
    # decision, with both batches full, was a wait
    assert ctrl.decisions == 5 and ctrl.waits == 1 and ctrl.masked_waits == 4
    assert [snap.instance_requests(g) for g in range(2)] == [2, 2] and snap.qlen(ctrl.router_queue) == 2
    assert ctrl.head_fits(snap) == -1 and ctrl.wait_valid(snap, "fits")


def test_masked_router_does_not_stall_where_the_unmasked_one_waits_for_ever():
    """The stall of docs/rl.md section 5: a network whose wait value tops every dispatch waits for ever
    on an idle fleet; the same network under the mask serves every request."""
    from fluidopt.rl.evaluate import run_episode
    from fluidopt.rl.policies import RLRouter

    sc = tiny_scenario(gpus=2, batch=8)
    wl = _wl([(0.05 * i, 50, 20, 0) for i in range(30)])
    done = {}
    for mask in ("none", "fits"):
        ctrl = RLRouter(sc, _always_wait(wait_mask=mask), name="baseline-rl")
        res = run_episode(sc, ctrl, wl, seed=0, drain=30.0)
        done[mask] = res.totals["completed"]
        if mask == "fits":
            assert ctrl.waits == 0 and ctrl.masked_waits == ctrl.decisions == 30  # the fleet never fills
    assert done == {"none": 0, "fits": 30}


def test_wait_mask_in_weight_files(tmp_path):
    p = save_weights(tmp_path / "m.npz", _always_wait())
    assert load_weights(p).wait_mask == "fits"
    q = save_weights(tmp_path / "n.npz", _always_wait(wait_mask="none"))
    assert "wait_mask" not in np.load(q).files and load_weights(q).wait_mask == "none"  # the paper's files unchanged
    bad = dict(np.load(p))
    bad["wait_mask"] = np.array("often")
    np.savez(tmp_path / "bad.npz", **bad)
    with pytest.raises(ScenarioError, match="wait mask 'often', expected one of none, fits"):
        load_weights(tmp_path / "bad.npz")


@pytest.mark.integration
def test_masked_training_never_takes_a_masked_wait_and_is_deterministic():
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    from fluidopt.rl.dqn import DQNConfig, train

    base = dict(variant="wa", episodes=2, eps_episodes=1, batch_size=32, learn_starts=32, target_sync=50,
                buffer_size=5000, hidden=8, lr=3e-3, seed=2, arch="shared", multi_dispatch=True)
    # epsilon 1 in episode 0: random actions, which without the mask include waits; the masked env raises on a
    # masked wait, so finishing proves none was taken
    a = train(None, DQNConfig(**base, wait_mask="fits"), env=blocked_env())
    b = train(None, DQNConfig(**base, wait_mask="fits"), env=blocked_env())
    assert a.net.wait_mask == "fits" and json.loads(a.net.config)["wait_mask"] == "fits"
    for (Wa, ba), (Wb, bb) in zip(a.net.layers, b.net.layers):
        assert np.array_equal(Wa, Wb) and np.array_equal(ba, bb)
    # instance 1 is empty or has free slots throughout: the head always fits, so the masked agent never waits
    assert (a.curves["wait_fraction"] == 0.0).all()
    c = train(None, DQNConfig(**base), env=blocked_env())
    assert c.net.wait_mask == "none" and "wait_mask" not in json.loads(c.net.config)
    assert c.curves["wait_fraction"].iloc[0] > 0.0  # the unmasked random episode waits
