"""LiteLLM's router with a fluidopt controller: the pick holds a gated request until a slot frees, and a
short accelerated loop (two stand-ins, LiteLLM, 50 requests) completes, with the simulator's prediction
beside it and no process left behind (after the end, SIGTERM and Ctrl-C)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from fluidopt.serving.litellm_router import ControllerRouting, deployments_for, prompt_words
from fluidopt.serving.loop import alive_children, plan_of

from .conftest import ROOT

pytestmark = pytest.mark.waits  # real-time loops against stand-in engines


def _write_trace(p, *, seed: int, n: int, output_below: int):
    """``n`` requests at 10 per s, prompts 50..799 tokens, outputs 5..output_below-1, as the replayer's CSV."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.1, n))
    rows = ["time,prompt_tokens,output_tokens"] + [f"{a:.4f},{b},{c}" for a, b, c in
                                                   zip(t, rng.integers(50, 800, n), rng.integers(5, output_below, n))]
    p.write_text("\n".join(rows) + "\n")
    return p


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """50 requests at 10 per s, prompts 50..800 tokens, outputs 5..100 tokens."""
    return _write_trace(tmp_path_factory.mktemp("loop") / "t.csv", seed=0, n=50, output_below=100)


@pytest.fixture(scope="module")
def short_trace(tmp_path_factory):
    """50 requests at 10 per s, prompts 50..800 tokens, outputs 5..30 tokens: LiteLLM's per-token work
    (about a millisecond a streamed chunk here) stays well under a core at speed 2."""
    return _write_trace(tmp_path_factory.mktemp("short") / "t.csv", seed=1, n=50, output_below=31)


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory):
    """400 requests at 10 per s (40 s of trace, 80 s at speed 0.5): a loop that no signal test outlasts."""
    return _write_trace(tmp_path_factory.mktemp("long") / "t.csv", seed=2, n=400, output_below=31)


def test_a_gate_holds_the_request_inside_the_pick():
    """gi-wsp on one engine of one slot: the second request waits in the pick until the first ends."""
    from fluidopt.calibration.profiles import load_profile
    from fluidopt.control.registry import make_controller
    from fluidopt.core.model import RequestClass, Scenario

    sc = Scenario(gpu=load_profile("qwen-8b-a100"), gpus=1, classes=(RequestClass("all", 100, 10, 1.0),),
                  prefill_price=1, decode_price=1)
    dep = deployments_for(["http://127.0.0.1:9"])
    strat = ControllerRouting(make_controller("gi-wsp", sc), dep, batch=1, mean_output=10, scrape_interval=0)

    async def main():
        h1, h2 = {}, {}
        d1 = await strat.async_get_available_deployment("m", input="a b c", request_kwargs={"metadata": {"fluidopt": h1}})
        assert d1 is dep[0] and h1["g"] == 0
        second = asyncio.ensure_future(strat.async_get_available_deployment(
            "m", input="d e", request_kwargs={"metadata": {"fluidopt": h2}}))
        await asyncio.sleep(0.05)
        assert not second.done()  # held: the only slot is busy
        strat.first_token(h1["r"])
        await asyncio.sleep(0.05)
        assert not second.done()  # the slot now decodes request 1
        strat.finished(h1["r"])
        assert await asyncio.wait_for(second, 1) is dep[0]
        assert strat.sent == [2] and strat.in_flight == [1]
        strat.first_token(h2["r"])
        strat.finished(h2["r"])
        assert strat.in_flight == [0] and strat.snap.requests() == []

    asyncio.run(main())


@pytest.mark.parametrize("seed", range(5))
def test_a_down_engine_keeps_the_snapshot_consistent(seed):
    """fi-wsp on two engines of 2 slots, engine 0 down: picks the controller makes for it go to engine 1
    (the snapshot moves them), concurrent requests all get through, and the snapshot ends empty, with
    nothing held in a pick (a held request with no event left to release it was a hang)."""
    import random

    from fluidopt.calibration.profiles import load_profile
    from fluidopt.control.registry import make_controller
    from fluidopt.core.model import RequestClass, Scenario

    sc = Scenario(gpu=load_profile("qwen-8b-a100"), gpus=2, classes=(RequestClass("all", 100, 10, 1.0),),
                  prefill_price=1, decode_price=1)
    dep = deployments_for(["http://127.0.0.1:9", "http://127.0.0.1:10"])
    strat = ControllerRouting(make_controller("fi-wsp", sc), dep, batch=2, mean_output=10, scrape_interval=0)
    strat.snap.rng.seed(seed)
    strat.down_until[0] = time.monotonic() + 60
    rng = random.Random(seed)

    async def one(i):
        h = {}
        await asyncio.sleep(rng.random() * 0.05)
        d = await strat.async_get_available_deployment("m", input="w " * 10, request_kwargs={"metadata": {"fluidopt": h}})
        assert d is dep[1]
        await asyncio.sleep(rng.random() * 0.02)
        strat.first_token(h["r"])
        await asyncio.sleep(rng.random() * 0.02)
        strat.finished(h["r"])

    async def main():
        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(12))), 5)

    asyncio.run(main())
    assert strat.sent == [0, 12] and strat.in_flight == [0, 0]
    assert strat.snap.requests() == [] and not strat._waiting


def test_prompt_words_counts_as_the_stand_in():
    assert prompt_words([{"role": "user", "content": "a b  c"}]) == 3
    assert prompt_words(None, None, {"prompt": "x y"}) == 2
    assert prompt_words(None, [1, 2, 3, 4]) == 4


def test_router_names():
    assert plan_of("litellm:fi-wsp", None) == ("litellm", "fi-wsp", "paper")
    assert plan_of("litellm:round-robin-chunked", None) == ("litellm", "round-robin-chunked", "chunked")
    assert plan_of("litellm-builtin:least-busy", None) == ("litellm-builtin", "least-requests", "vllm")
    from fluidopt.core.errors import UsageError

    for bad, msg in (("litellm:fi-wps", "did you mean"), ("litellm-builtin:nope", "STRATEGY one of"),
                     ("haproxy:x", "expected litellm:POLICY"), ("sglang:least_load", "POLICY one of")):
        with pytest.raises(UsageError, match=msg):
            plan_of(bad, None)


@pytest.mark.integration
def test_short_loop_with_litellm_and_a_fluidopt_controller(short_trace, capsys, monkeypatch):
    """The whole loop, and the cause of its former stall gone: LiteLLM builds no HTTP client per call (each
    one's finalizer closed the front's sockets from whichever thread collected it, the replayer's among
    them); every call goes through the front's one client, and the global setting is restored after."""
    litellm = pytest.importorskip("litellm")
    from litellm.llms.openai import common_utils

    from fluidopt.cli import main

    per_call = []
    real_init = common_utils.OpenAIAsyncHTTPClient.__init__

    def counting_init(self, *a, **kw):
        per_call.append(1)
        real_init(self, *a, **kw)

    monkeypatch.setattr(common_utils.OpenAIAsyncHTTPClient, "__init__", counting_init)
    before = litellm.aclient_session
    assert main(["loop", str(short_trace), "--engines", "2", "--router", "litellm:fi-wsp", "--speed", "2",
                 "--json"]) == 0
    assert per_call == [] and litellm.aclient_session is before
    out = json.loads(capsys.readouterr().out)
    m, s = out["measured"], out["simulated"]
    for d in (m, s):
        assert {"requests", "failed", "ttft_mean_s", "e2e_mean_s"} <= set(d)
    assert m["requests"] == 50 and m["failed"] == 0 and m["total_output_tokens"] == \
        sum(int(x.split(",")[2]) for x in short_trace.read_text().splitlines()[1:])
    assert s["requests"] == 50 and s["failed"] == 0
    assert sum(out["router_stats"]["sent"]) == 51 and min(out["router_stats"]["sent"]) > 0  # 50 + the warm-up
    # the stand-ins follow the time model: a request cannot beat it (TTFT >= one prefill iteration)
    assert m["ttft_mean_s"] >= 0.0174 and m["tpot_mean_s"] >= 0.022
    assert alive_children() == []


@pytest.mark.slow
@pytest.mark.integration
def test_loop_at_70_percent_load_follows_the_simulator(tmp_path, capsys):
    """LiteLLM + fi-wsp over two paper stand-ins, a slice at 70% of the fleet's fluid capacity (40
    requests, prompts 3,000-6,000 tokens, outputs 10-30): measured mean TTFT and E2E within 10% of the
    simulator's for the same slice, fleet and policy, the stand-ins on schedule. Prefill-heavy and at
    speed 0.5, so that the router's wall-clock work per request (tens of ms on a shared 2-core machine)
    stays a few percent of a TTFT of about 0.8 s (docs/serving.md, "The loop against the simulator")."""
    pytest.importorskip("litellm")
    from fluidopt.cli import main
    from fluidopt.serving.loop import fluid_load, poisson_slice
    from fluidopt.serving.replayer import read_trace

    path = tmp_path / "slice.csv"
    poisson_slice(path, load=0.7, gpus=2, requests=40, prompt=(3000, 6000), output=(10, 30), seed=0)
    assert fluid_load(read_trace(path), 2, "qwen-8b-a100") == pytest.approx(0.7, rel=1e-3)
    assert main(["loop", str(path), "--engines", "2", "--router", "litellm:fi-wsp", "--speed", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    m, s = out["measured"], out["simulated"]
    assert m["failed"] == 0 and s["failed"] == 0 and out["engine"] == "paper"
    assert out["engine_schedule"]["lag_s"] * 0.5 < 0.01 * out["engine_schedule"]["model_busy_s"]
    for key in ("ttft_mean_s", "e2e_mean_s"):
        assert m[key] == pytest.approx(s[key], rel=0.10), key


@pytest.mark.integration
@pytest.mark.parametrize("policy", ["round_robin", "cache_aware"])
def test_sglang_router_as_the_baseline(trace, policy, capsys):
    """SGLang's router (a Rust binary) over two stand-ins: every request served, the simulator beside it."""
    pytest.importorskip("sglang_router")
    from fluidopt.cli import main

    assert main(["loop", str(trace), "--engines", "2", "--router", f"sglang:{policy}", "--speed", "5",
                 "--requests", "30", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured"]["requests"] == 30 and out["measured"]["failed"] == 0
    assert out["engine"] == "vllm" and out["simulated"]["requests"] == 30
    assert alive_children() == []


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_no_process_left_after_a_signal(long_trace, sig):
    # (the 50-request trace ended before the signal once LiteLLM's calls stopped building a client each)
    pytest.importorskip("litellm")
    proc = subprocess.Popen([sys.executable, "-m", "fluidopt", "loop", str(long_trace), "--engines", "2", "--router",
                             "litellm-builtin:simple-shuffle", "--speed", "0.5", "--no-simulate", "--json"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a process started in the background inherits Ctrl-C ignored; a user's terminal does not
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    kids: list[int] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and len(kids) < 2:
            try:
                with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                pass
            time.sleep(0.2)
        assert len(kids) == 2, "the loop did not start its engines"
        time.sleep(3)  # the router and the replayer are running
        proc.send_signal(sig)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig
    time.sleep(0.5)
    for k in kids:
        assert not os.path.exists(f"/proc/{k}") or open(f"/proc/{k}/stat").read().split()[2] == "Z", k


@pytest.mark.integration
def test_an_engine_killed_mid_run(trace):
    """Engine 1 dies after 1.5 s: every request is recorded (its failures with a reason), nothing hangs,
    and the router sends nothing to engine 1 later than 2 s after its first failure."""
    pytest.importorskip("litellm")
    from fluidopt.serving.litellm_router import build_front, make_router
    from fluidopt.serving.loop import _Front, _scenario, start_engines, stop_all
    from fluidopt.serving.replayer import read_trace, replay_async

    frame = read_trace(trace)
    procs, urls = start_engines(2, ["--engine", "paper", "--speed", "2"])
    front = None
    try:
        sc = _scenario(frame, 2, "qwen-8b-a100")
        rt, strat = make_router(urls, "litellm:fi-wsp", scenario=sc, batch=sc.gpu.batch, mean_output=50.0)
        strat.scrape_interval = 0.2
        front = _Front(build_front(rt, strat))

        async def main():
            run = asyncio.ensure_future(replay_async(frame, front.url, speed=2, timeout=30, progress=False))
            await asyncio.sleep(1.5)
            procs[1].kill()
            return await asyncio.wait_for(run, 60)

        recs, _ = asyncio.run(main())
    finally:
        if front is not None:
            front.close()
        stop_all(procs)
    assert len(recs) == 50
    failed = [r for r in recs if not r.ok]
    assert failed and all(r.error for r in failed)
    assert strat.failed_at, "the router saw no failure"
    assert sum(r.ok for r in recs) >= 25  # engine 0 kept serving
    first = min(t for t, g in strat.failed_at if g == 1)
    late = [t - first for t, g in strat.picks if g == 1 and t > first + 2.0]
    assert not late, f"picks of the dead engine {late} s after its first failure"
