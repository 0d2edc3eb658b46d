"""The routing examples run, at tiny size: a user-registered controller, and a real router (no simulator).

Each example is imported once (it registers a controller at import time) and driven through its
``main(argv)`` and helpers; one subprocess per example checks that it also runs as a script.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pandas as pd
import pytest
from builders import ROOT, load_example

from fluidopt.control.protocol import Context
from fluidopt.control.registry import available, make_controller
from fluidopt.sim.api import simulate


@pytest.fixture(scope="module")
def custom():
    return load_example("custom_controller")


@pytest.fixture(scope="module")
def router():
    return load_example("real_router")


# -- custom_controller.py -----------------------------------------------------------------------------
@pytest.mark.integration
def test_custom_controller_is_registered_and_simulates(custom, tmp_path):
    assert "class-affinity" in available()
    sc = custom.five_task_scenario(gpus=8, rate_per_gpu=2.0)
    ctrl = make_controller("class-affinity", sc, spread=1)
    assert isinstance(ctrl, custom.ClassAffinity) and ctrl.spread == 1
    rec = tmp_path / "records.csv"
    res = simulate(sc, ctrl, horizon=20.0, seed=2, service="tokens", records=rec, check=True, batches=2)
    assert res.policy == "class-affinity" and res.totals["completed"] > 0
    df = pd.read_csv(rec)
    started = df[df["prefill_gpu"] >= 0]
    # spread = 1: class i is served by instance i only
    home = started["class"].map({name: i for i, name in enumerate(sc.class_names)})
    assert len(started) > 100 and (started["prefill_gpu"] == home).all()
    decoded = started["decode_gpu"] >= 0
    assert decoded.sum() > 100 and (started["decode_gpu"][decoded] == home[decoded]).all()


@pytest.mark.integration
def test_custom_controller_main(custom, capsys):
    assert custom.main(["--gpus", "3", "--horizon", "15", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    for policy in ("round-robin", "least-requests", "class-affinity"):
        assert policy in out
    table = custom.compare(gpus=3, horizon=15.0, warmup=3.0, seeds=1)
    assert list(table.index) == ["round-robin", "least-requests", "class-affinity"]
    assert (table["e2e_mean_s"] > 0).all() and (table["throughput"] > 0).all()


# -- real_router.py -----------------------------------------------------------------------------------
def test_real_router_serves_everything_within_the_plan(router, capsys):
    s = router.run(gpus=4, requests=30, time_scale=0.002, seed=3, quiet=False)
    out = capsys.readouterr().out
    assert "-> prefill on GPU" in out and "-> decode  on GPU" in out
    assert s["completed"] == s["requests"] == 30
    assert s["decisions"] == 60  # one prefill and one decode per request
    # Gate-and-Route's static partition (paper x* at 0.4 per GPU and class: n sum x* = 0.69 -> M = 1):
    # prefills only on the mixed GPU, whose decode cap keeps a slot for them; decodes on solo GPUs first
    assert s["mixed_gpus"] == [0]
    assert s["prefills_per_gpu"][0] == 30 and sum(s["prefills_per_gpu"][1:]) == 0
    assert s["max_decodes_per_gpu"] == [15, 16, 16, 16]
    assert all(p <= c for p, c in zip(s["peak_decodes_per_gpu"], s["max_decodes_per_gpu"]))
    assert sum(s["decodes_per_gpu"]) == 30


def test_real_router_snapshot_speaks_the_protocol(router):
    st = router.ClusterSnapshot(3, 4, ("a", "b"), clock=lambda: 1.5)
    assert isinstance(st, Context) and st.now == 1.5
    assert len(st.idle_prefill(0)) == 3 and st.gpu_kv_free(0) == math.inf


@pytest.mark.integration
def test_examples_run_as_scripts():
    for args in (["custom_controller.py", "--gpus", "2", "--horizon", "10", "--seeds", "1"],
                 ["real_router.py", "--gpus", "2", "--requests", "6", "--time-scale", "0.001", "--quiet"]):
        p = subprocess.run([sys.executable, str(ROOT / "examples" / args[0]), *args[1:]], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr
    assert "served 6 of 6 requests" in p.stdout
