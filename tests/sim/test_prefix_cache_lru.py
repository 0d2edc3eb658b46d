"""The prefix cache's structure with a KV capacity (docs/prefix-cache.md, "Speed"): the typed node pool
behind an open-addressing index, in Python and compiled, and the dict fallback, each against a model of
the rules written here from docs/simulator.md section 1.2, call by call; and the compiled core's tie to
the compiled cache (the kernel calls it at C level, so the two are built and run together)."""

from __future__ import annotations

import importlib
import importlib.util
import random
import warnings
from pathlib import Path

import pytest

import fluidopt.sim.prefix_cache as PC
from fluidopt.core.errors import UsageError
from fluidopt.sim import backend as core

ROOT = Path(__file__).resolve().parents[2]
COMPILED, WHY = core.compiled_status()
needs_core = pytest.mark.skipif(not COMPILED, reason=f"compiled core not usable: {WHY}")
BS, LIM, GPUS = 4, 24, 3  # 4-token blocks, 6 blocks of KV per GPU


class Model:
    """The rules, in the plainest terms: per GPU, the cached blocks' holder counts and the unheld blocks
    in release order (oldest first); room for the unheld is the capacity less the running requests' KV."""

    def __init__(self, chains):
        self.chains = chains
        self.hold = [{} for _ in range(GPUS)]
        self.order = [[] for _ in range(GPUS)]
        self.running = {}  # s -> (gpu, blocks held, cached tokens, prompt)
        self.evictions = 0

    def trim(self, g, kv):
        while self.order[g] and len(self.order[g]) * BS > LIM - kv:
            del self.hold[g][self.order[g].pop(0)]
            self.evictions += 1

    def run(self, s, g):
        k = 0
        for b in self.chains[s - 1]:
            if b not in self.hold[g]:
                break
            k += 1
        return k

    def take(self, s, g):
        k = self.run(s, g)
        for b in self.chains[s - 1][:k]:
            if self.hold[g][b] == 0:
                self.order[g].remove(b)
            self.hold[g][b] += 1
        return k

    def release(self, g, b):
        self.hold[g][b] -= 1
        if self.hold[g][b] == 0:
            self.order[g].append(b)

    def start(self, s, g, ptok, prompt, kv):
        self.trim(g, kv)
        k = self.take(s, g)
        cached = min(k * BS, prompt)
        self.running[s] = (g, k, cached, prompt)
        self.trim(g, kv + ptok)
        return max(1, ptok - cached)

    def leave(self, s, g, remaining):
        _, k, cached, prompt = self.running.pop(s)
        chain = self.chains[s - 1]
        # a whole-prompt prefill: all its blocks when it completes, none computed when evicted
        done = len(chain) if remaining <= 0 or cached >= prompt else min(len(chain), cached // BS)
        for j in range(max(k, done) - 1, -1, -1):  # deepest first
            b = chain[j]
            if j < k:
                self.release(g, b)
            elif b not in self.hold[g]:
                self.hold[g][b] = 0
                self.order[g].append(b)
            elif self.hold[g][b] == 0:
                self.order[g].remove(b)
                self.order[g].append(b)

    def decode_start(self, s, g, kv, tokens):
        self.trim(g, kv)
        self.running[s] = (g, self.take(s, g), 0, 0)
        self.trim(g, kv + tokens)

    def decode_leaves(self, s):
        g, k, _, _ = self.running.pop(s)
        for b in reversed(self.chains[s - 1][:k]):
            self.release(g, b)


def _chains(rng, n):
    """n chained block-id lists: each extends a prefix of an earlier one (shared system prompts, turns)."""
    chains, fresh = [], 0
    for _ in range(n):
        base = rng.choice(chains)[:rng.randint(0, 6)] if chains and rng.random() < 0.8 else []
        more = rng.randint(1 if not base else 0, 6)
        chains.append(base + list(range(fresh, fresh + more)))
        fresh += more
    return chains


def _drive(caches, seed):
    """Random calls as the kernel makes them (prefill, then maybe a decode elsewhere), compared call by
    call with the model: the tokens to compute, the evictions and every request's cached prefix."""
    rng = random.Random(seed)
    chains = _chains(rng, 120)
    model = Model(chains)
    prompt = {s: max(1, BS * len(c) - rng.randint(0, BS - 1)) for s, c in enumerate(chains, 1)}
    waiting, prefilling, decoding = list(range(1, len(chains) + 1)), {}, {}
    for step in range(600):
        kind = rng.random()
        g, kv = rng.randrange(GPUS), rng.randint(0, LIM)
        if kind < 0.35 and waiting:
            s = waiting.pop(rng.randrange(len(waiting)))
            ptok = prompt[s] + rng.choice([0, 0, 3])  # (a re-prefill after a preemption carries its output)
            want = model.start(s, g, ptok, prompt[s], kv)
            assert [c.start(s, g, ptok, prompt[s], kv) for c in caches] == [want] * len(caches)
            prefilling[s] = g
        elif kind < 0.6 and prefilling:
            s = rng.choice(sorted(prefilling))
            g = prefilling.pop(s)
            remaining = 0 if rng.random() < 0.8 else 1
            model.leave(s, g, remaining)
            for c in caches:
                c.leave(s, g, remaining, 0)
            if remaining:
                waiting.append(s)
            elif rng.random() < 0.8:
                model.decode_start(s, g, kv, prompt[s])
                for c in caches:
                    c.decode_start(s, g, kv, prompt[s])
                decoding[s] = g
        elif kind < 0.75 and decoding:
            s = rng.choice(sorted(decoding))
            g = decoding.pop(s)
            model.decode_leaves(s)
            for c in caches:
                c.decode_leaves(s, g)
            if rng.random() < 0.2:
                waiting.append(s)  # preempted: it comes back and looks its prefix up again
        else:
            model.trim(g, kv)
            for c in caches:
                c.trim(g, kv)
        assert [c.evictions for c in caches] == [model.evictions] * len(caches)
        some = sorted(prompt) if step % 100 == 99 else rng.sample(sorted(prompt), 6)
        want = [[min(model.run(s, h) * BS, prompt[s]) for h in range(GPUS)] for s in some]
        for c in caches:
            assert [[c.query(s, prompt[s], h) for h in range(GPUS)] for s in some] == want
    return model


def _cache(cls, chains_seed):
    import numpy as np

    chains = _chains(random.Random(chains_seed), 120)
    return cls([np.asarray(c, dtype=np.int64) for c in chains], BS, GPUS, 1, LIM, 10, False)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_typed_pool_and_the_dicts_follow_the_rules_call_by_call(monkeypatch, seed):
    # the pool starts at 4 nodes per GPU's capacity and no slack, so it doubles several times mid-run
    # (the held nodes keep their numbers), and backward-shift deletions run on every eviction
    monkeypatch.setattr(PC, "_SLACK", 0)
    typed = _cache(PC.PrefixCache, seed)
    assert typed.lru and len(typed.nd) == 4 * 32  # 3 GPUs x 6 blocks -> 32 nodes
    monkeypatch.setattr(PC, "_LRU_BYTES", 0)
    dicts = _cache(PC.PrefixCache, seed)
    assert not dicts.lru
    caches = [typed, dicts]
    cls, _ = PC.compiled_class()
    if cls is not None:
        mod = importlib.import_module(cls.__module__)
        monkeypatch.setattr(mod, "_SLACK", 0)
        caches.append(_cache(cls, seed))
        assert caches[-1].lru and len(caches[-1].nd) == 4 * 32
    model = _drive(caches, seed)
    assert model.evictions > 50
    assert len(typed.nd) > 4 * 32, "the pool never grew"
    if cls is not None:
        assert len(caches[-1].nd) == len(typed.nd)


@needs_core
def test_the_compiled_core_holds_only_the_compiled_cache():
    # engine.pxd types the core's cache as the compiled class: its calls are C calls, and the Python
    # class cannot be put in its place
    from fluidopt.sim.api import make_engine
    from tests.sim.test_prefix_cache import _scenario, _workload

    eng = make_engine(_scenario(kv=100.0), "round-robin", horizon=10.0, service="tokens",
                      workload=_workload([(0, 40, 2, [1, 2, 3, 4])]), progress=False, backend="compiled")
    assert type(eng._pch) is PC.compiled_class()[0]
    with pytest.raises(TypeError):
        eng._pc = _cache(PC.PrefixCache, 1)


@needs_core
def test_a_stale_compiled_cache_is_never_run(monkeypatch):
    """A compiled cache built from another prefix_cache.py: the compiled core (which calls it at C level)
    is not run either; "auto" falls back to the Python engine with a warning, "compiled" refuses."""
    from fluidopt.sim import _c_prefix_cache  # type: ignore[attr-defined]
    from fluidopt.sim.api import simulate
    from tests.sim.test_prefix_cache import _scenario

    monkeypatch.delenv("FLUIDOPT_ENGINE", raising=False)
    monkeypatch.setattr(_c_prefix_cache, "SOURCE_SHA256", "0" * 64)
    PC.compiled_class.cache_clear()
    core.compiled_status.cache_clear()
    core._warn_once.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            res = simulate(_scenario(), "round-robin", horizon=2.0, progress=False)
        assert res.meta["engine"] == "python"
        assert any("prefix_cache.py or prefix_cache.pxd" in str(x.message) for x in w)
        with pytest.raises(UsageError, match="reinstall"):
            simulate(_scenario(), "round-robin", horizon=2.0, progress=False, backend="compiled")
    finally:
        monkeypatch.undo()
        PC.compiled_class.cache_clear()
        core.compiled_status.cache_clear()
    assert core.compiled_status()[0]


def test_the_cores_build_key_follows_the_prefix_caches_types():
    # the core is compiled against prefix_cache.pxd (the class's layout and methods): editing it must
    # rebuild the core, and the core records which one it was built with
    spec = importlib.util.spec_from_file_location("fluidopt_setup_py", ROOT / "setup.py")
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)
    a = setup_py.core_source(b"x = 1\n", b"cdef int x", b"cdef class PrefixCache: pass")
    b = setup_py.core_source(b"x = 1\n", b"cdef int x", b"cdef class PrefixCache:\n    cdef int y")
    assert a != b and a.startswith("x = 1\n")
    keys = {setup_py.build_key("fluidopt.sim._cengine", t, b"cdef int x", "r") for t in (a, b)}
    assert len(keys) == 2


def test_block_ids_read_alike_from_arrays_views_and_lists():
    # a trace's rows (int64 arrays) are joined as bytes; strided views, other dtypes and lists go through
    # numpy's concatenation: the same ids either way
    import numpy as np

    rows = [[5, 7, 9], [5, 7], [], [11]]
    forms = [[np.asarray(r, dtype=np.int64) for r in rows], rows, [np.asarray(r, dtype=np.int32) for r in rows],
             [np.repeat(np.asarray(r, dtype=np.int64), 2)[::2] for r in rows]]
    got = [(list(c.ids), list(c.off)) for c in (PC.PrefixCache(f, 4, 1, 1, -1, 4, False) for f in forms)]
    assert got == [([5, 7, 9, 5, 7, 11], [0, 3, 5, 5, 6])] * 4
