"""Multi-dispatch epochs and the per-instance shared-weights Q-network (docs/rl.md sections 2 and 4)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fluidopt.core.errors import ScenarioError
from fluidopt.rl.core import obs_dim
from fluidopt.rl.mlp import SCORER_IN, WAIT_IN, QNetwork, SharedQNetwork, load_weights, save_weights
from fluidopt.sim.api import simulate
from fluidopt.workloads import TraceWorkload

from .conftest import RL_SCENARIO, blocked_env, tiny_scenario


def _shared(h: int = 8, seed: int = 0, dispatch: str = "multi", m: int = 2) -> SharedQNetwork:
    rng = np.random.default_rng(seed)

    def mlp(n_in):
        dims = [n_in, h, h, 1]
        return tuple((rng.normal(size=(a, b)).astype(np.float32), rng.normal(size=b).astype(np.float32))
                     for a, b in zip(dims[:-1], dims[1:]))

    return SharedQNetwork(mlp(SCORER_IN), mlp(WAIT_IN), m, "wg", "{}", dispatch)


def _python_q(net: SharedQNetwork, obs) -> list[float]:
    """The shared network in plain Python floats, every sum in index order."""
    x = [float(v) for v in np.asarray(obs, dtype=np.float32)]
    m = (len(x) - 3) // 6
    inst = [x[6 * g:6 * g + 6] for g in range(m)]
    mean = []
    for j in range(6):
        s = 0.0
        for g in range(m):
            s += inst[g][j]
        mean.append(s / m)
    ctx = mean + [max(inst[g][j] for g in range(m)) for j in range(6)] + x[6 * m:]

    def mlp(layers, v):
        for k, (W, b) in enumerate(layers):
            W, b = W.astype(float).tolist(), b.astype(float).tolist()
            y = []
            for j in range(len(b)):
                s = 0.0
                for i in range(len(v)):
                    s += v[i] * W[i][j]
                y.append(s + b[j])
            v = [max(t, 0.0) for t in y] if k < len(layers) - 1 else y
        return v[0]

    f = [mlp(net.scorer, inst[g] + ctx) for g in range(m)]
    mf = 0.0
    for v in f:
        mf += v
    return f + [mf / m + mlp(net.wait, ctx)]


@pytest.mark.parametrize("m", [1, 4, 64])
def test_shared_network_shapes_and_exact_forward(m):
    net = _shared(seed=m)
    rng = np.random.default_rng(m)
    for _ in range(3):
        obs = rng.random(obs_dim(m)).astype(np.float32)
        q = net.q(obs)
        assert q.shape == (m + 1,)
        assert q.tolist() == _python_q(net, obs)  # bit for bit: no BLAS, sums in index order


def test_shared_network_is_permutation_equivariant():
    net = _shared(seed=5)
    m = 6
    obs = np.random.default_rng(1).random(obs_dim(m)).astype(np.float32)
    perm = np.array([3, 0, 5, 1, 4, 2])
    blocks = obs[:6 * m].reshape(m, 6)
    obs2 = np.concatenate([blocks[perm].ravel(), obs[6 * m:]])
    q, q2 = net.q(obs), net.q(obs2)
    assert np.allclose(q2[:m], q[:m][perm], rtol=0, atol=1e-12)
    assert q2[m] == pytest.approx(q[m], abs=1e-12)


def test_shared_weights_serve_any_instance_count_and_check_their_shapes(tmp_path):
    p = save_weights(tmp_path / "s.npz", _shared(m=2), command="fluidopt rl train X --arch shared")
    net = load_weights(p, n_instances=4)  # trained on 2 instances, instance-count independent
    assert isinstance(net, SharedQNetwork) and net.n_instances == 2 and net.dispatch == "multi" and net.fits(4)
    x = np.linspace(0, 1, obs_dim(4)).astype(np.float32)
    assert np.array_equal(net.q(x), _shared(m=2).q(x))
    res = simulate(tiny_scenario(gpus=4), "wg-rl", horizon=5.0, service="tokens", seed=1,
                   controller_options={"weights": str(p)})
    assert res.totals["completed"] > 0
    # a flat MLP still serves only its own fleet size
    rng = np.random.default_rng(0)
    dims = [obs_dim(2), 4, 3]
    mlp = QNetwork(tuple((rng.normal(size=(a, b)).astype(np.float32), np.zeros(b, np.float32))
                         for a, b in zip(dims[:-1], dims[1:])), 2, "wg")
    q = save_weights(tmp_path / "m.npz", mlp)
    with pytest.raises(ScenarioError, match="trained for 2 instances, the scenario has 4"):
        load_weights(q, n_instances=4)
    assert load_weights(q).dispatch == "single"
    bad = dict(np.load(p))
    bad["U0"] = np.zeros((9, 8), np.float32)
    np.savez(tmp_path / "bad.npz", **bad)
    with pytest.raises(ScenarioError, match="the wait head maps 9 -> 1, expected 15 -> 1"):
        load_weights(tmp_path / "bad.npz")
    bad = dict(np.load(p))
    bad["dispatch"] = np.array("sometimes")
    np.savez(tmp_path / "bad2.npz", **bad)
    with pytest.raises(ScenarioError, match="dispatch 'sometimes', expected one of single, multi"):
        load_weights(tmp_path / "bad2.npz")


def _burst(n: int = 5):
    """``n`` short requests arriving together just after t = 0."""
    df = pd.DataFrame({"time": [0.001 + 1e-6 * i for i in range(n)], "prompt": [50] * n, "output": [20] * n,
                       "cls": [0] * n})
    return TraceWorkload(df, ("short", "long"), name="burst")


def _const_net(dispatch: str, m: int = 2) -> SharedQNetwork:
    """Scores instance g by its free-capacity entry (x_g[4]); the wait head is -1 below the mean score."""
    W0 = np.zeros((SCORER_IN, 1), np.float32)
    W0[4, 0] = 1.0
    scorer = ((W0, np.zeros(1, np.float32)), (np.ones((1, 1), np.float32), np.zeros(1, np.float32)))
    wait = ((np.zeros((WAIT_IN, 1), np.float32), np.zeros(1, np.float32)),
            (np.ones((1, 1), np.float32), np.array([-1.0], np.float32)))
    return SharedQNetwork(scorer, wait, m, "wg", "{}", dispatch)


def test_multi_dispatch_epoch_semantics_in_the_environment():
    pytest.importorskip("gymnasium")
    from fluidopt.rl.env import RouterEnv

    env = RouterEnv(tiny_scenario(), workload=_burst(5), multi_dispatch=True, variant="baseline")
    obs, _ = env.reset(seed=0)
    t0 = env.eng.now
    q = env.core.router_queue
    assert t0 == pytest.approx(0.02) and env.eng.qlen(q) == 5 and obs[-3] == pytest.approx(5 / 512)
    obs, r, *_ = env.step(0)  # dispatch: the next decision is at the same epoch, for the new head
    assert env.eng.now == t0 and env.last_epochs == 0.0 and env.eng.qlen(q) == 4
    assert r == 0.0  # no time elapsed, nothing completed, no guidance (baseline)
    assert obs[0] == pytest.approx(1 / 8) and obs[-3] == pytest.approx(4 / 512)  # instance 0: one in prompt phase
    obs, *_ = env.step(1)
    assert env.eng.now == t0 and obs[6] == pytest.approx(1 / 8) and env.eng.qlen(q) == 3
    env.step(2)  # wait: the epoch ends, three requests still queued
    assert env.last_epochs == 1.0 and env.eng.now == pytest.approx(t0 + 0.02) and env.eng.qlen(q) == 3
    for a in (0, 1):
        env.step(a)
        assert env.last_epochs == 0.0
    env.step(0)  # the last one: the queue empties and the environment moves on
    assert env.eng.qlen(q) == 0 or env.eng.now > t0 + 0.02
    assert env.last_epochs >= 1.0
    # the paper's MDP: one decision per epoch
    env1 = RouterEnv(tiny_scenario(), workload=_burst(5), variant="baseline")
    env1.reset(seed=0)
    env1.step(0)
    assert env1.last_epochs == 1.0 and env1.eng.now == pytest.approx(t0 + 0.02) and env1.eng.qlen(q) == 4


def test_multi_dispatch_router_empties_the_queue_in_one_tick_and_balances():
    from fluidopt.control.snapshot import ClusterSnapshot
    from fluidopt.rl.policies import RLRouter

    sc = tiny_scenario()
    for dispatch, expect in (("multi", 5), ("single", 1)):
        ctrl = RLRouter(sc, _const_net(dispatch), name="wg-rl")
        snap = ClusterSnapshot(sc.gpus, sc.gpu.batch, sc.class_names, seed=0, service="tokens")
        snap.setup(ctrl)
        for _ in range(5):
            ctrl.on_arrival(snap, snap.add_request(0, 50, 20))
        snap.now = 0.02
        ctrl.on_tick(snap)
        assert ctrl.decisions == expect and ctrl.waits == 0
        assert snap.qlen(ctrl.router_queue) == 5 - expect
        if dispatch == "multi":  # it follows free capacity, which each dispatch lowers: 3 and 2
            assert sorted(snap.instance_requests(g) for g in range(2)) == [2, 3]


def test_shipped_eight_instance_weights_are_shared_and_multi_dispatch():
    from fluidopt.rl.mlp import SHIPPED_8_WAIT_MASK, shipped_weights_path, train_command

    for v in ("baseline", "wa", "wg"):
        p = shipped_weights_path(v, 8)
        assert p.stat().st_size < 200_000
        net = load_weights(p, n_instances=8)
        mask = SHIPPED_8_WAIT_MASK[v]
        assert isinstance(net, SharedQNetwork) and net.dispatch == "multi" and net.wait_mask == mask
        cfg = json.loads(net.config)  # the configuration of the documented training command
        assert (cfg["arch"], cfg["multi_dispatch"], cfg.get("wait_mask", "none"), cfg["episodes"], cfg["train_every"],
                cfg["seed"], cfg["variant"]) == ("shared", True, mask, 30, 4, 0, v)
        assert ("--wait-mask fits" in train_command(v, 8)) == (mask == "fits")
    assert SHIPPED_8_WAIT_MASK == {"baseline": "fits", "wa": "fits", "wg": "none"}
    assert RL_SCENARIO.is_file()


@pytest.mark.integration
def test_shared_training_is_deterministic_and_matches_its_numpy_twin():
    torch = pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    from fluidopt.rl.dqn import DQNConfig, SharedQ, train

    cfg = DQNConfig(variant="baseline", episodes=2, eps_episodes=1, batch_size=32, learn_starts=32, target_sync=50,
                    buffer_size=5000, hidden=8, lr=3e-3, seed=2, arch="shared", multi_dispatch=True)
    a = train(None, cfg, env=blocked_env())
    b = train(None, cfg, env=blocked_env())
    assert isinstance(a.net, SharedQNetwork) and a.net.dispatch == "multi"
    for (Wa, ba), (Wb, bb) in zip(a.net.layers, b.net.layers):
        assert np.array_equal(Wa, Wb) and np.array_equal(ba, bb)
    online = a.state["online"]
    assert isinstance(online, SharedQ)
    x = torch.rand(4, obs_dim(3))
    with torch.no_grad():
        qt = online(x).numpy()
    qn = np.stack([a.net.q(v.numpy()) for v in x])
    assert qt.shape == (4, 4) and np.allclose(qt, qn, atol=1e-5)


def test_lost_revenue_reward_sums_to_revenue_minus_the_arrivals_revenue():
    """objective="lost-revenue": minus the revenue of requests that abandon; over an episode (all its
    requests resolve) it sums to the simulator's revenue minus the revenue of every arrival."""
    pytest.importorskip("gymnasium")
    from fluidopt.core.model import paper_scenario
    from fluidopt.rl.core import RewardConfig, episode_seed, episode_workload
    from fluidopt.rl.env import RouterEnv

    sc = paper_scenario(gpus=2)
    env = RouterEnv(sc, reward=RewardConfig(variant="baseline", objective="lost-revenue"), n_requests=150,
                    multi_dispatch=True)
    env.reset(seed=2)
    total, done, steps = 0.0, False, 0
    while not done:
        _, r, term, trunc, _ = env.step(0 if steps % 3 else 2)
        assert r <= 0.0
        total += r
        steps += 1
        done = term or trunc
    res = env.result()
    assert term and res.totals["abandoned"] > 0
    wl = episode_workload(sc, 150, episode_seed(2, 0))
    cp, cd = sc.class_prices()
    arrivals = sum(cp[c] * p + cd[c] * o for c, p, o in zip(wl.cls.tolist(), wl.prompt.tolist(), wl.output.tolist()))
    revenue = res.cluster["revenue_per_gpu"] * 2 * (res.t_end - res.warmup)
    assert total == pytest.approx(revenue - arrivals, rel=1e-9)
    assert total < 0


def test_max_wait_guard_dispatches_a_head_kept_waiting():
    from fluidopt.control.snapshot import ClusterSnapshot
    from fluidopt.rl.policies import RLRouter

    sc = tiny_scenario()
    net = _const_net("multi")
    scorer, wait = net.scorer, net.wait
    always_wait = SharedQNetwork(scorer, wait[:1] + ((wait[1][0], np.array([1.0], np.float32)),), 2, "wg", "{}", "multi")
    for max_wait, expect_sent in ((0, 0), (3, 1)):
        ctrl = RLRouter(sc, always_wait, name="wg-rl", max_wait=max_wait)
        snap = ClusterSnapshot(sc.gpus, sc.gpu.batch, sc.class_names, seed=0, service="tokens")
        snap.setup(ctrl)
        for _ in range(2):
            ctrl.on_arrival(snap, snap.add_request(0, 50, 20))
        for k in range(4):
            snap.now = 0.02 * (k + 1)
            ctrl.on_tick(snap)
        # without the guard it waits for ever; with max_wait=3 the 4th tick sends the head, and the next
        # head (its wait count restarted) is decided by the network again: it waits
        assert sum(ctrl.sent) == expect_sent and ctrl.forced == expect_sent
    with pytest.raises(ScenarioError, match="max_wait: expected an integer >= 0"):
        RLRouter(sc, always_wait, name="wg-rl", max_wait=-1)
