"""Shipped weights and the registered RL routers (numpy only): loading, errors, running in simulate."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fluidopt.core.errors import ScenarioError
from fluidopt.rl.core import STATE_LAYOUT, obs_dim
from fluidopt.rl.mlp import QNetwork, load_weights, save_weights, shipped_weights_path
from fluidopt.scenario import load_scenario
from fluidopt.sim.api import simulate

from .conftest import RL_SCENARIO, tiny_scenario


def _net(m: int, h: int = 8, seed: int = 0) -> QNetwork:
    rng = np.random.default_rng(seed)
    dims = [obs_dim(m), h, h, m + 1]
    return QNetwork(tuple((rng.normal(size=(a, b)).astype(np.float32), rng.normal(size=b).astype(np.float32))
                          for a, b in zip(dims[:-1], dims[1:])), m, "wg")


def test_numpy_forward_matches_a_hand_computation(tmp_path):
    net = _net(2)
    x = np.linspace(0, 1, obs_dim(2)).astype(np.float32)
    (W0, b0), (W1, b1), (W2, b2) = net.layers
    expect = np.maximum(np.maximum(x @ W0 + b0, 0) @ W1 + b1, 0) @ W2 + b2
    assert np.allclose(net.q(x), expect)
    p = save_weights(tmp_path / "w.npz", net, command="fluidopt rl train X")
    back = load_weights(p, n_instances=2)
    assert np.array_equal(back.q(x), net.q(x)) and back.n_instances == 2 and back.variant == "wg"


def _python_forward(net: QNetwork, obs) -> list[float]:
    """The network in plain Python floats: each unit's products summed in index order."""
    x = [float(v) for v in np.asarray(obs, dtype=np.float32)]
    for k, (W, b) in enumerate(net.layers):
        W, b = W.astype(float).tolist(), b.astype(float).tolist()
        y = []
        for j in range(len(b)):
            s = 0.0
            for i in range(len(x)):
                s += x[i] * W[i][j]
            y.append(s + b[j])
        x = [max(v, 0.0) for v in y] if k < len(net.layers) - 1 else y
    return x


def test_forward_is_exact_in_index_order_so_every_machine_routes_alike():
    """Q-values equal the plain Python loop bit for bit: they depend on no BLAS kernel (whose
    summation order varies with the CPU), so routing decisions reproduce on any machine."""
    net = _net(4, h=64, seed=3)
    rng = np.random.default_rng(7)
    for _ in range(10):
        obs = rng.random(obs_dim(4)).astype(np.float32)
        assert net.q(obs).tolist() == _python_forward(net, obs)


@pytest.mark.parametrize("variant", ["baseline", "wa", "wg"])
def test_shipped_weights_load_and_are_small(variant):
    p = shipped_weights_path(variant, 4)
    assert p.is_file(), f"missing shipped weights {p}"
    assert p.stat().st_size < 200_000
    net = load_weights(p, n_instances=4)
    assert net.layers[0][0].shape == (27, 64) and net.layers[-1][0].shape == (64, 5)


def test_weight_errors_are_one_line(tmp_path):
    with pytest.raises(ScenarioError, match=r"no such file; train them with: fluidopt rl train"):
        load_weights(tmp_path / "none.npz", hint="fluidopt rl train S --out none.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ScenarioError, match="bad.npz: not a readable weight file"):
        load_weights(bad)
    p = save_weights(tmp_path / "w2.npz", _net(2))
    with pytest.raises(ScenarioError, match="trained for 2 instances, the scenario has 4"):
        load_weights(p, n_instances=4)
    other = tmp_path / "layout.npz"
    np.savez(other, layout=np.array("other-layout"), n_instances=np.array(2))
    with pytest.raises(ScenarioError, match="state layout 'other-layout'"):
        load_weights(other)
    W = np.zeros((5, 3), np.float32)
    np.savez(tmp_path / "shape.npz", layout=np.array(STATE_LAYOUT), n_instances=np.array(2), W0=W, b0=np.zeros(3, np.float32))
    with pytest.raises(ScenarioError, match="maps 5 -> 3, expected 15 -> 3"):
        load_weights(tmp_path / "shape.npz")


def test_registered_policy_runs_in_simulate_and_rejects_bad_setups(tmp_path):
    sc = load_scenario(RL_SCENARIO)
    res = simulate(sc, "wg-rl", horizon=20.0, service="tokens", seed=3)
    assert res.cluster["e2e_mean"] > 0 and res.totals["completed"] > 200
    with pytest.raises(ScenarioError, match="wg-rl-2.npz: no such file; train them with"):
        simulate(tiny_scenario(), "wg-rl", horizon=5.0, service="tokens")
    p = save_weights(tmp_path / "two.npz", _net(2))
    res2 = simulate(tiny_scenario(), "baseline-rl", horizon=5.0, service="tokens", controller_options={"weights": str(p)})
    assert res2.policy == "baseline-rl"


# A real ``python -m fluidopt simulate`` on purpose: the command's entry point (docs/testing.md, "Fifth round")
@pytest.mark.integration
def test_cli_errors_exit_2_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fluidopt", "simulate", str(RL_SCENARIO), "--policy", "wa-rl",
                        "--service", "tokens", "--horizon", "5", "--option", f"weights={tmp_path / 'x.npz'}"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "x.npz: no such file" in r.stderr


# an import hook that makes torch and gymnasium look uninstalled
_BLOCK = ("import sys\n"
          "class _Block:\n"
          "    def find_spec(self, name, path=None, target=None):\n"
          "        if name.split('.')[0] in ('torch', 'gymnasium'):\n"
          "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
          "sys.meta_path.insert(0, _Block())\n")


@pytest.mark.integration
def test_routers_run_without_torch_or_gymnasium():
    code = _BLOCK + (
        "from fluidopt.sim.api import simulate; "
        f"r = simulate({str(RL_SCENARIO)!r}, 'wg-rl', horizon=10.0, service='tokens', seed=1); "
        "assert 'torch' not in sys.modules; "
        "print(r.totals['completed'])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) > 100


@pytest.mark.integration
def test_train_without_the_extra_is_one_line_exit_2(tmp_path):
    code = _BLOCK + (
        "from fluidopt.cli import main; "
        f"sys.exit(main(['rl', 'train', {str(RL_SCENARIO)!r}, '--out', {str(tmp_path / 'w.npz')!r}]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == ("fluidopt rl: error: RL training needs the rl extra (torch, gymnasium), "
                                "missing 'gymnasium': pip install -e \".[rl]\"")


@pytest.mark.integration
def test_training_numbers_are_checked_before_the_extra_is_needed(tmp_path):
    # a bad count is named even where torch is missing, so where it is present no import of it is paid first
    code = _BLOCK + (
        "from fluidopt.cli import main; "
        f"a = main(['rl', 'train', {str(RL_SCENARIO)!r}, '--gamma', '0', '--out', {str(tmp_path / 'w.npz')!r}]); "
        f"b = main(['rl', 'imitate', {str(RL_SCENARIO)!r}, '--epochs', '0', '--out', {str(tmp_path / 'w.npz')!r}]); "
        "print(a, b, 'torch' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.split() == ["2", "2", "False"], r.stderr
    assert r.stderr.splitlines() == ["fluidopt rl: error: --gamma: expected a number in (0, 1], got 0.0",
                                     "fluidopt rl: error: --epochs: expected an integer >= 1, got 0"]
    assert not (tmp_path / "w.npz").exists()


@pytest.mark.integration
def test_a_real_router_drives_wg_rl_through_a_cluster_snapshot():
    """The real-router path: a ClusterSnapshot, arrivals, and on_tick every 0.02 s from the router's timer."""
    from fluidopt.control.registry import make_controller
    from fluidopt.control.snapshot import ClusterSnapshot

    sc = load_scenario(RL_SCENARIO)
    ctrl = make_controller("wg-rl", sc)
    snap = ClusterSnapshot(sc.gpus, sc.gpu.batch, sc.class_names, seed=0, service="tokens")
    snap.setup(ctrl)
    sent = []
    for k in range(12):
        snap.now = 0.02 * k
        r = snap.add_request(k % 5, 50 + 10 * k, 100)
        ctrl.on_arrival(snap, r)
        assert snap.req_queue(r) == ctrl.router_queue  # held for the agent
        for _ in range(3):  # the router's timer: a few ticks, one decision each while requests wait
            snap.now += 0.005
            ctrl.on_tick(snap)
        sent += [(kind, g) for kind, _, g in snap.outbox]
        snap.outbox.clear()
    dispatched = ctrl.decisions - ctrl.waits
    assert ctrl.decisions >= 12 and dispatched > 0
    assert snap.qlen(ctrl.router_queue) == 12 - dispatched
    assert sum(snap.instance_requests(g) for g in range(4)) == dispatched
    assert any(kind == "prefill" for kind, _ in sent)
