"""Builders the tests share: hand-sized scenarios, hand-written trace replays, the CLI in a subprocess
or in this process.

Import them in a test module (``from builders import hand_scenario``; pytest puts tests/ on the path)
or use the factory fixtures of the same job in tests/conftest.py (``make_scenario``, ``replay``,
``cli``, ``cli_here``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["ROOT", "grid01_scenario", "hand_scenario", "random_fleet", "replay_trace", "run_cli",
           "run_cli_here"]



def hand_scenario(n: int = 1, batch: int = 4, *, alpha: float = 0.01, beta: float = 0.001, tau_solo: float = 0.005,
                  chunk: int = 10, kv: float | None = None, kap: float = 0.0, classes: Sequence[str] = ("a",),
                  prompt: float = 20.0, decode: float | Sequence[float] = 5.0, lengths: str | None = None,
                  patience: float = 0.0, rate: float = 1.0):
    """A small scenario with round numbers for hand-computed timelines (times in seconds, tokens).

    Defaults: tau_mix = alpha + beta * chunk = 0.02 s, tau_solo = 0.005 s, C = 10, one class "a"
    with P = 20, D = 5. ``decode`` may give one mean per class; ``lengths=None`` keeps the model's
    default distribution (traces replace it anyway).
    """
    from fluidopt.core.model import GPUProfile, RequestClass, Scenario

    gpu = GPUProfile(alpha=alpha, beta=beta, tau_solo=tau_solo, chunk=chunk, batch=batch, kv_capacity=kv,
                     kv_time_per_token=kap)
    decodes = list(decode) if isinstance(decode, (list, tuple)) else [decode] * len(classes)
    extra = {} if lengths is None else {"lengths": lengths}
    cl = tuple(RequestClass(nm, prompt=prompt, decode=d, rate=rate, patience=patience, **extra)
               for nm, d in zip(classes, decodes))
    return Scenario(gpu=gpu, gpus=n, classes=cl, prefill_price=1.0, decode_price=1.0)


def replay_trace(scenario, controller, rows, *, horizon: float = 5.0, records: Path | None = None, **kw):
    """Replay ``rows`` = [(arrival s, prompt tokens, output tokens, class index), ...] in tokens service
    with every invariant checked; returns (result, records by id or None)."""
    import pandas as pd

    from fluidopt.sim.api import simulate
    from fluidopt.workloads import TraceWarning, TraceWorkload

    wl = TraceWorkload(pd.DataFrame(rows, columns=["time", "prompt", "output", "cls"]), scenario.class_names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)  # "the trace ends before the horizon": intended
        res = simulate(scenario, controller, horizon=horizon, service="tokens", workload=wl, batches=2, check=True,
                       records=records, **kw)
    rec = None if records is None else pd.read_csv(records).sort_values("id").reset_index(drop=True)
    return res, rec


def run_cli(*argv: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m fluidopt ARGV`` in a subprocess (Agg backend); the completed process."""
    env = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "fluidopt", *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout, check=False)


def process_state() -> dict:
    """What a command run in this process could leave changed for the next test on the same worker.

    Signal handlers (the CLI installs its own for SIGINT / SIGTERM), warnings filters and hook, the
    environment, the working folder, sys.path, logging (handlers, levels, ``logging.disable``), thread and
    exception hooks, live threads and child processes, the interruption contract's pending signal, the
    global random generators, numpy's error settings, matplotlib's open figures and rcParams, and policies
    registered from outside fluidopt (``--import``). Compared before and after by :func:`run_cli_here`."""
    import logging
    import multiprocessing
    import random
    import signal
    import threading

    import numpy as np

    state = {
        "signals": {s.name: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM,
                                                          signal.SIGPIPE, signal.SIGCHLD, signal.SIGHUP)},
        "warnings.filters": list(warnings.filters), "warnings.showwarning": warnings.showwarning,
        "environ": dict(os.environ), "cwd": os.getcwd(), "sys.path": list(sys.path),
        "sys.stdout": sys.stdout, "sys.stderr": sys.stderr, "sys.excepthook": sys.excepthook,
        "threading.excepthook": threading.excepthook,
        "logging": (logging.root.level, list(logging.root.handlers), logging.root.manager.disable,
                    {name: (lg.level, list(lg.handlers), lg.disabled)
                     for name, lg in logging.root.manager.loggerDict.items() if isinstance(lg, logging.Logger)}),
        "threads": sorted(t.name for t in threading.enumerate()),
        "children": sorted(p.pid for p in multiprocessing.active_children()),
        "random": random.getstate(), "np.random": np.random.get_state()[1].tobytes(), "np.seterr": np.geterr(),
        "modules": set(sys.modules),
    }
    if "fluidopt.core.interrupt" in sys.modules:
        state["interrupt.pending"] = sys.modules["fluidopt.core.interrupt"].pending()
    if "fluidopt.control.registration" in sys.modules:  # fluidopt's own policies register lazily: not a leak
        reg = sys.modules["fluidopt.control.registration"]._REGISTRY
        state["foreign policies"] = sorted(k for k, e in reg.items()
                                           if not getattr(e.factory, "__module__", "").startswith("fluidopt."))
    if "matplotlib" in sys.modules:
        mpl = sys.modules["matplotlib"]
        # the backend resolves on first use ("auto" -> Agg): compare the settings, not that resolution
        state["matplotlib.rcParams"] = {k: repr(v) for k, v in mpl.rcParams.items() if k != "backend"}
        if "matplotlib.pyplot" in sys.modules:
            state["pyplot figures"] = sys.modules["matplotlib.pyplot"].get_fignums()
    return state


# What a library sets in the whole process when it is first imported: the import's doing, not the command's
# (joblib: os.environ.setdefault("KMP_INIT_AT_FORK", "FALSE"), an Intel OpenMP workaround; scipy.sparse:
# an 'ignore' filter for numpy's np.matrix warning). module -> (environment variables, filter messages)
IMPORT_EFFECTS = {"joblib": (("KMP_INIT_AT_FORK",), ()),
                  "scipy.sparse": ((), ("the matrix subclass is not the recommended way",))}


def _import_effects(before: dict, after: dict) -> tuple[set, list]:
    """The environment variables and warnings filters that the modules first imported between two
    snapshots set on import: those of IMPORT_EFFECTS, and a filter for a library's own warning category
    (e.g. scipy.special's 'always' for SpecialFunctionWarning); never a filter for fluidopt's categories."""
    new = after.get("modules", set()) - before.get("modules", set())
    env = {v for mod, (names, _) in IMPORT_EFFECTS.items() if mod in new for v in names}
    messages = {m for mod, (_, ms) in IMPORT_EFFECTS.items() if mod in new for m in ms}
    filters = [f for f in after.get("warnings.filters", []) if f not in before.get("warnings.filters", [])
               and ((getattr(f[2], "__module__", "") in new and not f[2].__module__.startswith("fluidopt"))
                    or getattr(f[1], "pattern", None) in messages)]
    return env, filters


def state_changes(before: dict, after: dict) -> list[str]:
    """What differs between two :func:`process_state` snapshots, one line each. What only an import
    brought (new modules, a library's new loggers, its import-time settings: ``_import_effects``,
    matplotlib or fluidopt's registry loaded for the first time) is not a change: a later test finds it
    as a later import would leave it."""
    env, filters = _import_effects(before, after)
    after = dict(after)
    if "environ" in after:
        after["environ"] = {k: v for k, v in after["environ"].items() if k not in env or k in before["environ"]}
    if "warnings.filters" in after:
        after["warnings.filters"] = [f for f in after["warnings.filters"] if f not in filters]
    out = []
    for k in sorted(before.keys() | after.keys()):
        if k == "modules":
            continue
        if k not in before:
            if k == "foreign policies" and after[k]:
                out.append(f"{k}: [] -> {after[k]!r}")
            continue
        b, a = before[k], after.get(k)
        if k == "logging":
            b = b[:3] + ({n: v for n, v in b[3].items()},)
            a = a[:3] + ({n: v for n, v in a[3].items() if n in b[3]},)
        if b == a:
            continue
        if isinstance(b, dict) and isinstance(a, dict):
            keys = sorted(x for x in b.keys() | a.keys() if b.get(x) != a.get(x))
            out.append(f"{k}: " + ", ".join(f"{x}: {b.get(x)!r} -> {a.get(x)!r}" for x in keys))
        else:
            out.append(f"{k}: {b!r} -> {a!r}")
    return out


@contextlib.contextmanager
def command_process(cwd: Path):
    """Inside: the working folder ``cwd`` and ``MPLBACKEND=Agg``, as :func:`run_cli` gives a command's process;
    both restored after (before a caller compares :func:`process_state`)."""
    here, old_backend = os.getcwd(), os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "Agg"
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)
        if old_backend is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = old_backend


def run_cli_here(capfd, *argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``fluidopt ARGV`` in this process (``fluidopt.cli.main``), its result shaped as :func:`run_cli`'s.

    For tests whose subject is what a command says and writes (messages, exit codes, files), not the process
    (signals, start-up, orphans): they save the 1-3 CPU-s of a ``python -m fluidopt`` start. The output is
    read at the file-descriptor level (``capfd``: worker processes' too); the exit status is ``main``'s
    return value, or SystemExit's code (``--help``, ``--version``). Runs in ``cwd`` (the repository, as
    :func:`run_cli`) with ``MPLBACKEND=Agg``, and fails the test when the command left any of
    :func:`process_state` changed: a later test on the same xdist worker must find the process as it was."""
    from fluidopt.cli import main

    with command_process(cwd):
        before = process_state()
        capfd.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        out, err = capfd.readouterr()
        after = process_state()
    changed = state_changes(before, after)
    assert not changed, f"fluidopt {' '.join(map(str, argv))} left the process changed: " + "; ".join(changed)
    return subprocess.CompletedProcess(["fluidopt", *map(str, argv)], code, out, err)


def random_fleet(draw, max_gpus: int = 6):
    """Inside a ``hypothesis.strategies.composite``: a random small fleet and service for invariant tests.

    1-``max_gpus`` GPUs, batch 2-8, markov or tokens (tokens sometimes with a KV cache), 1-3 classes loaded
    0.05-1.5 requests per GPU per second with patience, a near-zero decode price sometimes so that the
    LP leaves a class out (x* = 0). Returns (scenario, service); the draws come in a fixed order, so
    derandomized tests see the same examples whichever test asks.
    """
    from hypothesis import strategies as st

    from fluidopt.core.model import GPUProfile, RequestClass, Scenario

    n = draw(st.integers(1, max_gpus))
    B = draw(st.integers(2, 8))
    service = draw(st.sampled_from(("markov", "tokens")))
    kv = None
    if service == "tokens" and draw(st.booleans()):
        kv = float(draw(st.integers(800, 6000)))
    gpu = GPUProfile.from_gamma(
        alpha=draw(st.floats(0.005, 0.03)), beta=draw(st.floats(1e-6, 2e-4)), gamma=draw(st.floats(10.0, 60.0)),
        chunk=draw(st.sampled_from((32, 128, 256))), batch=B, kv_capacity=kv,
    )
    k = draw(st.integers(1, 3))
    classes = tuple(RequestClass(
        f"c{i}", prompt=draw(st.floats(20.0, 2000.0)), decode=draw(st.floats(5.0, 800.0)),
        rate=n * draw(st.floats(0.05, 1.5)), patience=draw(st.floats(0.05, 1.0)),
        decode_price=draw(st.sampled_from((None, 1e-4))),
    ) for i in range(k))
    s = Scenario(gpu=gpu, gpus=n, classes=classes, prefill_price=draw(st.floats(0.0, 0.3)),
                 decode_price=draw(st.floats(0.01, 0.3)), name="random")
    return s, service


def load_example(name: str):
    """Import ``examples/<name>.py`` as a module (once per name: it may register controllers)."""
    import importlib.util

    key = f"fluidopt_example_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod
    spec.loader.exec_module(mod)
    return mod


def grid01_scenario(n: int = 20, name: str = "grid-01"):
    """Random grid instance 01 (docs/results.md section 5) on ``n`` GPUs: gamma tau = 11 (a mixed
    iteration is 11x slower than a solo one), class 1 rationed, class 2 not admitted (x_2* = 0), so the
    plan rations every class it admits and BP-GR's elastic mechanism is on."""
    from fluidopt.core.model import GPUProfile, RequestClass, Scenario

    gpu = GPUProfile(alpha=0.016491513836777848, beta=0.0008588640020112191, tau_solo=0.021370258211973255,
                     chunk=256, batch=16, name="draw1")
    classes = (RequestClass("class1", prompt=1980.4382516050239, decode=2307.6498718214425,
                            rate=0.37878842408058794 * n, patience=0.1),
               RequestClass("class2", prompt=2512.506723451596, decode=1455.465527120289,
                            rate=0.3347031133284405 * n, patience=0.1))
    return Scenario(gpu=gpu, gpus=n, classes=classes, prefill_price=0.1, decode_price=0.2, name=name)


def semantics_scenario(n: int = 300):
    """The markov-against-tokens instance (tests/sim/test_sim_differential.py) on ``n`` GPUs: chunk C = 1, so a
    prefill of P tokens takes P mixed iterations, geometric lengths, both classes abandoning at rate 1/0.5."""
    from fluidopt.core.model import GPUProfile, RequestClass, Scenario

    gpu = GPUProfile(alpha=0.01, beta=0.0005, tau_solo=0.008, chunk=1, batch=3)
    cl = (RequestClass("short", prompt=100, decode=400, rate=0.2 * n, patience=0.5),
          RequestClass("long", prompt=300, decode=200, rate=0.2 * n, patience=0.5))
    return Scenario(gpu=gpu, gpus=n, classes=cl, prefill_price=0.1, decode_price=0.2)


def round_robin_cached_tokens(path, n: int, block: int = 512) -> tuple[int, int, int]:
    """(cached prompt tokens, requests, prompt tokens) of a Mooncake-format JSONL trace. Cached tokens when request i (in arrival order) goes to
    instance i mod n and nothing is evicted, counted from the file alone (no fluidopt code): a request's
    cached prefix is the longest run of its leading block ids that an earlier request on its instance
    carried, min(run * block, input_length) tokens. Independent of the simulator's and of
    fluidopt.workloads.prefix's counts, which tests compare with it."""
    import json
    from pathlib import Path

    raw = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    raw.sort(key=lambda r: r["timestamp"])  # stable, as the reader sorts
    seen: list[set] = [set() for _ in range(n)]
    want = 0
    for i, r in enumerate(raw):
        s = seen[i % n]
        run = 0
        while run < len(r["hash_ids"]) and r["hash_ids"][run] in s:
            run += 1
        want += min(run * block, r["input_length"])
        s.update(r["hash_ids"])
    return want, len(raw), sum(r["input_length"] for r in raw)
