"""One serving loop on loopback: N stand-in engines (child processes), a router and the replayer, torn
down at the end, on Ctrl-C and on SIGTERM; then the simulator's prediction for the same trace, fleet
and policy.

Engines: each is ``fluidopt serve-engine --port 0`` (a child that also dies with this process: Linux's
parent-death signal). The router runs in this process, in a thread: LiteLLM's ``Router`` behind
:func:`fluidopt.serving.litellm_router.build_front`. The replayer runs in the main thread.

Which simulator run is "the same policy": ``litellm:POLICY`` is POLICY itself; LiteLLM's
``simple-shuffle`` is ``random`` and ``least-busy`` is ``least-requests`` (fewest requests in flight).
The stand-ins run the engine the simulator gives that policy: the paper's engine (one chunk of C tokens
plus decodes) for the paper's controllers, vLLM's prefill-first instances for the instance routers
(their ``-chunked`` variants: chunked prefill); ``--engine chunked`` or ``paper`` with a baseline
router (LiteLLM's or SGLang's) picks the twin's ``-chunked`` variant (with ``paper``, the simulator's
own GPU: one chunk of C plus the decodes, B slots).

Prefix cache: the stand-ins run theirs (on unless ``prefix_cache=False``) with the trace's block size
when the trace has block hashes (the replayer sends one text chunk per hash id), and the simulator runs
its own on the same hashes; both hit ratios are reported (``measured.hit_ratio``, ``simulated.hit_ratio``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np

import fluidopt.core.interrupt as interrupt
from fluidopt.core.errors import UsageError

BUILTIN_TWINS = {"simple-shuffle": "random", "least-busy": "least-requests"}
# SGLang's router policies and the simulator's nearest policy (cache_aware: the simulator's model of
# SGLang's cache-aware router, `sglang`, docs/prefix-cache.md; with no shared prefix it sends every request
# to the least loaded instance)
SGLANG_TWINS = {"round_robin": "round-robin", "random": "random", "power_of_two": "power-of-two",
                "cache_aware": "sglang"}


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_engines(n: int, args: list[str], timeout: float = 60.0) -> tuple[list[subprocess.Popen], list[str]]:
    """Start ``n`` stand-ins on free loopback ports; (processes, base URLs). On failure, none is left."""
    procs: list[subprocess.Popen] = []
    urls: list[str] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-m", "fluidopt", "serve-engine", "--port", "0", *args],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          preexec_fn=_die_with_parent if sys.platform == "linux" else None))
        deadline = time.monotonic() + timeout
        for p in procs:
            while True:
                line = p.stdout.readline()
                m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
                if m:
                    urls.append(f"http://127.0.0.1:{m.group(1)}")
                    break
                if p.poll() is not None or time.monotonic() > deadline:
                    err = (p.stderr.read() or "").strip().splitlines()
                    raise UsageError(f"a stand-in engine did not start: {err[-1] if err else 'no output'}")
    except BaseException:
        stop_all(procs)
        raise
    return procs, urls


def stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each child, wait 5 s, then SIGKILL: nothing is left running."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
        for f in (p.stdout, p.stderr):
            if f is not None:
                f.close()


def start_sglang(urls: list[str], policy: str, timeout: float = 60.0) -> tuple[subprocess.Popen, str]:
    """SGLang's router (``python -m sglang_router.launch_router``) on a free loopback port over ``urls``;
    (process, base URL) once its /health answers."""
    import socket

    import httpx

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port",
                             str(port), "--worker-urls", *urls, "--policy", policy, "--log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_all([proc])
    raise UsageError("SGLang's router did not start")


class _Front:
    """The router's HTTP front served by uvicorn in a thread (no signal handlers there: the main thread's
    own handling stops the loop)."""

    def __init__(self, app) -> None:
        import uvicorn

        from fluidopt.serving.engine_server import bind

        self.sock = bind(0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        # lifespan on: the front makes LiteLLM's shared HTTP client on its own loop (litellm_router.build_front)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])),
                                       name="fluidopt-router", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.server.started:
            self.close()
            raise UsageError("the router's front did not start")

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def plan_of(router: str, engine: str | None) -> tuple[str, str | None, str]:
    """(router kind, the simulator's policy or None, the stand-ins' engine) for ``--router``."""
    from fluidopt.control.registry import available

    kind, _, name = router.partition(":")
    if kind not in ("litellm", "litellm-builtin", "sglang") or not name:
        raise UsageError(f"--router {router!r}: expected litellm:POLICY, litellm-builtin:STRATEGY or sglang:POLICY")
    pols = available()
    if kind == "sglang":
        if name not in SGLANG_TWINS:
            raise UsageError(f"--router {router!r}: expected sglang:POLICY with POLICY one of {', '.join(SGLANG_TWINS)}")
        import importlib.util

        if importlib.util.find_spec("sglang_router") is None:
            raise UsageError(f"--router {router!r}: SGLang's router is not installed (pip install sglang-router)")
        sim = SGLANG_TWINS[name]
        if engine in ("chunked", "paper") and f"{sim}-chunked" in pols:
            sim = f"{sim}-chunked"
        return kind, sim, engine or ("chunked" if sim.endswith("-chunked") else "vllm")
    if kind == "litellm":
        if name not in pols:
            from fluidopt.core.errors import did_you_mean

            raise UsageError(f"--router {router!r}: no policy {name!r}{did_you_mean(name, pols)} (fluidopt simulate "
                             "--list-policies lists them)")
        sim = name
    else:
        if name not in BUILTIN_TWINS:
            raise UsageError(f"--router {router!r}: expected litellm-builtin:STRATEGY with STRATEGY one of "
                             f"{', '.join(BUILTIN_TWINS)}")
        sim = BUILTIN_TWINS[name]
        if engine in ("chunked", "paper") and f"{sim}-chunked" in pols:
            sim = f"{sim}-chunked"
    desc = pols.get(sim, "")
    # the instance routers' descriptions say which instances they route to ("... instances ...")
    auto = ("chunked" if sim.endswith("-chunked") else "vllm") if re.search(r"\binstances\b", desc) else "paper"
    return kind, sim, engine or auto


def _scenario(frame, gpus: int, profile: str):
    from fluidopt.calibration.profiles import load_profile
    from fluidopt.core.model import RequestClass, Scenario

    span = float(frame["time"].max() - frame["time"].min()) if len(frame) > 1 else 1.0
    rate = len(frame) / span if span > 0 else float(len(frame))
    cls = RequestClass("all", float(frame["prompt"].mean()), float(frame["output"].mean()), rate)
    return Scenario(gpu=load_profile(profile), gpus=gpus, classes=(cls,), prefill_price=1.0, decode_price=1.0,
                    name="loop")


def fluid_load(frame, gpus: int, profile: str) -> float:
    """The trace's load on ``gpus`` GPUs of ``profile``: its request rate over the fleet's fluid capacity
    (:func:`fluidopt.fluid.disaggregated.colocated_capacity`, requests per s per GPU, for one class with
    the trace's mean prompt and output lengths). 1.0: the fluid LP serves it with nothing to spare."""
    from fluidopt.fluid.disaggregated import colocated_capacity

    sc = _scenario(frame, gpus, profile)
    return sc.classes[0].rate / (gpus * colocated_capacity(sc))


def poisson_slice(path, *, load: float, gpus: int, requests: int, prompt: tuple[int, int], output: tuple[int, int],
                  profile: str = "qwen-8b-a100", seed: int = 0) -> float:
    """Write a generic-CSV trace of ``requests`` Poisson arrivals whose fluid load on ``gpus`` GPUs of
    ``profile`` is ``load`` (prompt and output lengths uniform on the inclusive ranges, drawn with
    ``seed``); the arrival rate (requests per s). The rate is set from the drawn lengths' means, then
    the times are scaled, so :func:`fluid_load` of the written slice is ``load`` up to rounding."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0, requests)
    frame = pd.DataFrame({"time": np.concatenate([[0.0], np.cumsum(gaps[1:])]),
                          "prompt": rng.integers(prompt[0], prompt[1] + 1, requests),
                          "output": rng.integers(output[0], output[1] + 1, requests)})
    # the realised rate is n / span; scale the span so that the rate is load x capacity
    frame["time"] *= fluid_load(frame, gpus, profile) / load
    pd.DataFrame({"time": frame["time"].round(6), "prompt_tokens": frame["prompt"],
                  "output_tokens": frame["output"]}).to_csv(path, index=False)
    return float(len(frame) / frame["time"].max())


def simulate_trace(frame, scenario, policy: str, engine: str, prefix_cache: bool = True) -> dict:
    """The simulator on the same requests, fleet and policy: requests, failed, ttft_mean_s, e2e_mean_s;
    with block hashes in ``frame`` and ``prefix_cache``, its prefix cache on them and ``hit_ratio``
    (cached over prompt tokens of the completed requests).

    A request of O output tokens is simulated with O - 1 decode tokens. The stand-in (like vLLM) emits
    the first token at the end of the prefill and then decodes O - 1 more; the simulator's prefill emits
    none and a decode of D tokens takes D iterations after it (docs/simulator.md, "Decodes"). With D = O - 1
    the simulator's TTFT (the prefill's end) is the stand-in's first token and its end the last one;
    with D = O every simulated E2E was one decode iteration (22 ms on qwen-8b-a100) longer."""
    import pandas as pd

    from fluidopt.sim.api import simulate
    from fluidopt.workloads.traces import replay

    hashed = "hashes" in frame.columns
    with tempfile.TemporaryDirectory() as d:
        if hashed:  # Mooncake's JSON lines (times in ms), so that the workload keeps the block hashes
            path = Path(d) / "slice.jsonl"
            with open(path, "w") as f:
                for t, p, o, h in zip(frame["time"], frame["prompt"], frame["output"], frame["hashes"]):
                    f.write(json.dumps({"timestamp": float(t) * 1000.0, "input_length": int(p),
                                        "output_length": int(o) - 1, "hash_ids": [int(x) for x in h]}) + "\n")
        else:
            path = Path(d) / "slice.csv"
            pd.DataFrame({"time": frame["time"].to_numpy(), "prompt_tokens": frame["prompt"].to_numpy(),
                          "output_tokens": frame["output"].to_numpy() - 1}).to_csv(path, index=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sc, work = replay(path, scenario)
            res = simulate(sc, policy, workload=work, service="tokens", horizon=work.duration + 1e-6,
                           drain=1e5, progress=False, records=Path(d) / "records.csv",
                           prefix_cache=None if prefix_cache else False)
        interrupt.raise_if_cut(res)
        rec = pd.read_csv(Path(d) / "records.csv")
    done = rec[rec["outcome"] == "completed"]
    hit = None
    if hashed and prefix_cache and "cached_prompt" in done.columns and len(done):
        hit = float(done["cached_prompt"].sum() / done["prompt"].sum())
    ttft = done["ttft"].to_numpy(float)
    e2e = (done["end"] - done["arrival"]).to_numpy(float)
    return {"requests": int(len(rec)), "failed": int(len(rec) - len(done)), "policy": policy, "engine": engine,
            "ttft_mean_s": float(ttft.mean()) if len(done) else None,
            "ttft_p99_s": float(np.percentile(ttft, 99)) if len(done) else None,
            "e2e_mean_s": float(e2e.mean()) if len(done) else None,
            "e2e_p99_s": float(np.percentile(e2e, 99)) if len(done) else None, "hit_ratio": hit}


def _warm_up(url: str, engine_urls: list[str] = ()) -> None:
    """One request to each engine and one through the router before the clock starts: LiteLLM's first
    call imports and builds its clients (about a second here), and a stand-in's first request takes
    about 0.25 s longer than the next ones (measured: TTFT 0.66 s, then 0.40 s for the same prompt); either
    would otherwise land on a measured request."""
    import httpx

    for u in [*engine_urls, url]:
        try:
            httpx.post(u + "/v1/completions", json={"prompt": "warm", "max_tokens": 1, "stream": True},
                       timeout=60).read()
        except httpx.HTTPError:
            pass  # a router or engine that cannot answer shows in the measured requests


def engine_schedule(urls: list[str]) -> dict:
    """The stand-ins' own account of whether they kept the time model's schedule, summed over ``urls``:
    iterations, model seconds busy, and wall seconds they ran behind schedule (``lag_s``; x speed it is
    model time the loop added that the simulator has not). Engines that do not answer are left out."""
    import httpx

    keys = {"iterations": "fluidopt:iterations_total", "model_busy_s": "fluidopt:model_busy_seconds_total",
            "lag_s": "fluidopt:schedule_lag_seconds_total",
            # the prefix cache (absent when off): first prefills' prompt and cached tokens, the simulator's count
            "prompt_tokens": "fluidopt:prefix_cache_prompt_tokens_total",
            "cached_tokens": "fluidopt:prefix_cache_cached_tokens_total"}
    out = dict.fromkeys(keys, 0.0) | {"engines": 0}
    for u in urls:
        try:
            text = httpx.get(u + "/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        out["engines"] += 1
        for k, name in keys.items():
            m = re.search(re.escape(name) + r"\{[^}]*\} (\S+)", text)
            out[k] += float(m.group(1)) if m else 0.0
    return out


def run_loop(trace, *, engines: int, router: str, speed: float = 1.0, requests: int | None = None,
             engine: str | None = None, profile: str | None = None, timeout: float = 600.0,
             progress: bool = True, simulate: bool = True, prefix_cache: bool = True) -> dict:
    """Start everything, replay, tear down; ``{"measured": ..., "simulated": ..., ...}`` (latencies in model
    s). ``prefix_cache``: the stand-ins' and the simulator's (module docstring)."""
    from fluidopt.serving.engine_server import DEFAULT_PROFILE, law_and_config
    from fluidopt.serving.replayer import read_trace, replay_async, summarize

    if isinstance(engines, bool) or not isinstance(engines, int) or engines < 1:
        raise UsageError(f"--engines {engines}: expected a positive number of engines")
    if not (speed > 0 and math.isfinite(speed)):
        raise UsageError(f"--speed {speed}: expected a positive number")
    kind, sim_policy, eng = plan_of(router, engine)
    profile = profile or DEFAULT_PROFILE
    law_and_config(eng, profile=profile)  # bad --engine / --profile: one line before anything starts
    frame = read_trace(trace, requests)
    scenario = _scenario(frame, engines, profile)
    procs: list[subprocess.Popen] = []
    front = strategy = None
    try:
        # the cache's blocks are the trace's when it has block hashes (one replayer text chunk per hash id)
        block = int(frame.attrs.get("block_size", 16)) if "hashes" in frame.columns else 16
        cache = ["--prefix-block-size", str(block)] if prefix_cache else ["--no-enable-prefix-caching"]
        procs, urls = start_engines(engines, ["--engine", eng, "--profile", profile, "--speed", repr(float(speed)),
                                              *cache])
        if kind == "sglang":
            proc, url = start_sglang(urls, router.partition(":")[2])
            procs.append(proc)
        else:
            from fluidopt.serving.litellm_router import build_front, make_router

            rt, strategy = make_router(urls, router, scenario=scenario, batch=scenario.gpu.batch,
                                       mean_output=float(scenario.classes[0].decode),
                                       block_size=block if prefix_cache else None)
            front = _Front(build_front(rt, strategy))
            url = front.url
        _warm_up(url, urls)
        recs, wall = asyncio.run(replay_async(frame, url, speed=speed, timeout=timeout, progress=progress))
        schedule = engine_schedule(urls)
    finally:
        if front is not None:
            front.close()
        stop_all(procs)
    measured = summarize(recs, wall, speed)
    # the engines' first prefills (the warm-up requests' one word each included): cached over prompt tokens
    measured["hit_ratio"] = (schedule["cached_tokens"] / schedule["prompt_tokens"]
                             if prefix_cache and schedule["prompt_tokens"] else None)
    out = {"router": router, "engines": engines, "engine": eng, "profile": profile, "speed": speed,
           "measured": measured, "engine_schedule": schedule}
    if strategy is not None:
        out["router_stats"] = {"sent": strategy.sent, "failures": strategy.failures, "off_book": strategy.off_book,
                               "redirected": strategy.redirected}
    if simulate and sim_policy is not None:
        out["simulated"] = simulate_trace(frame, scenario, sim_policy, eng, prefix_cache)
    return out


def alive_children() -> list[int]:
    """Pids of this process's live children (for the tests' no-orphan checks)."""
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []
