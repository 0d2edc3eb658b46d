"""The simulator's prefix (KV) cache: one block cache per instance, read and written by the kernel's
few hot calls (docs/simulator.md section 1.2, "The prefix cache").

A run has a cache when its workload carries block hashes (``TraceWorkload.hashes``, chained ids of
``block_size`` tokens each: equal ids mean an equal prefix up to that block), the service is
``tokens`` and ``simulate(..., prefix_cache=...)`` is not False. Request r's blocks are those of trace
row ``r_serial[r] - 1`` (a record's id is its arrival number, and a trace arrives in row order).

The rules, in tokens (KV capacity K = ``gpu.kv_capacity``; unlimited when None):

* a request's cached prefix on GPU g is the longest run of its leading blocks present on g; its
  prefill computes only the rest, ``max(1, P' - cached)`` tokens (P' = prompt + tokens generated
  before a preemption; one token is always computed, as vLLM recomputes the last one to produce the
  first output), while its KV reservation stays the whole P' (section 1.1);
* a block is present from the boundary where the prefill iteration that computes it completes: in
  practice when the request's prefill completes, since a GPU runs one prefill at a time; a prefill
  evicted part-way leaves the blocks of its completed chunks;
* a running request holds its blocks on its GPU: the cached run from its prefill start, all of them
  from its prefill's completion, and the present run again from a decode start; held blocks are part
  of the request's own KV reservation;
* a block no running request holds stays cached and takes ``block_size`` tokens of the room that the
  running requests leave, ``K - KV``: when KV grows (a prefill or decode starts, decodes grow; checked
  at each of g's boundaries, where KV peaks), the least recently released blocks are evicted first,
  a request's own blocks deepest first, so a prefix is evicted from its tail. Cached blocks never
  delay or preempt a running request: they give way.

The cached tokens of a request are those of the prefill whose completion gives its TTFT (its first),
``min(k * block_size, prompt)`` for k cached blocks; totals, per class and per instance count every
first prefill of the run (warm-up included, like the run's totals).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import itertools
from array import array
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["PrefixCache", "make_prefix_cache"]

_DENSE_BYTES = 1 << 26  # the most memory a never-evicting cache keeps as bytes per (GPU, block) before sets
_LRU_BYTES = 1 << 28  # the most memory a cache with a KV capacity keeps as typed slots before dicts


class PrefixCache:
    """The block caches of one run's GPUs (module docstring). ``hashes``: one int array per trace row;
    ``block_size``: tokens per block; ``kvcap``: the GPU's KV capacity in tokens, < 0 unlimited;
    ``chunk``, ``chunked``: the GPUs' prefill chunk and style (which blocks an evicted prefill computed).

    The kernel calls :meth:`start` and :meth:`leave` for every prefill, and with a KV capacity
    (``eng._pch``, the same object) :meth:`decode_start`, :meth:`decode_leaves` and :meth:`trim`; it
    passes scalars (a request by its arrival number ``s`` = trace row + 1), never itself, since reading
    the compiled core's arrays from Python costs a buffer object per read. Without a KV capacity a
    GPU's cache is one byte per block (``present``; a set beyond ``_DENSE_BYTES``): nothing is held
    or evicted; with one, a dict of holder counts and an LRU of the unheld blocks. setup.py compiles
    this file with prefix_cache.pxd into ``fluidopt.sim._c_prefix_cache``, which the compiled core
    uses while its digest matches (:func:`compiled_class`); the numbers are the same.
    """

    def __init__(self, hashes, block_size: int, n_gpus: int, n_classes: int, kvcap: int, chunk: int,
                 chunked: bool):
        # every request's block ids in one typed array, request s's at ids[off[s - 1]:off[s]], renumbered
        # 0 .. U - 1 (equal ids stay equal, so the chains are kept): ids that already are small
        # non-negative integers (Mooncake's) as they are, others through np.unique
        n = len(hashes)
        self.off = [0, *itertools.accumulate(len(x) for x in hashes)]
        total = self.off[-1]
        allids = np.concatenate(hashes).astype(np.int64, copy=False) if n and total else np.zeros(0, np.int64)
        if total and allids.min() >= 0 and allids.max() < max(4 * total, 1 << 16):
            self.U = int(allids.max()) + 1
        else:
            uniq, allids = np.unique(allids, return_inverse=True)
            self.U = len(uniq)
        ids = array("q", allids.astype(np.int64, copy=False).tobytes())
        self.ids = ids
        # with a KV capacity and up to _LRU_BYTES, typed per (GPU, block) slots x = g * U + id: holders[x]
        # (-1: not cached) and the links of each GPU's LRU list of unheld blocks (oldest at head[g])
        self.lru = kvcap >= 0 and 12 * n_gpus * self.U <= _LRU_BYTES
        m = n_gpus * self.U if self.lru else 0
        self.holders, self.prv, self.nxt = array("i", [-1]) * m, array("i", [-1]) * m, array("i", [-1]) * m
        self.head, self.tail, self.nfree = array("q", [-1]) * n_gpus, array("q", [-1]) * n_gpus, array("q", [0]) * n_gpus
        self.flat = ids.tolist() if kvcap >= 0 and not self.lru else []  # the dict path walks Python ints
        self.bs = int(block_size)
        self.lim = int(kvcap)
        self.C, self.chunked = int(chunk), bool(chunked)
        # without a KV capacity and up to _DENSE_BYTES, one byte per (GPU, block): 1 when present
        self.dense = kvcap < 0 and n_gpus * self.U <= _DENSE_BYTES
        self.present = bytearray(n_gpus * self.U if self.dense else 0)
        self.blocks: list = [set() if kvcap < 0 else {} for _ in range(n_gpus)]  # dict: id -> holders
        self.free: list[OrderedDict] = [OrderedDict() for _ in range(n_gpus)]  # unheld, evicted first-in first
        self.run: dict[int, tuple] = {}  # s -> (gpu, blocks held, cached tokens, prompt, tokens computed)
        # per trace row, of its first prefill (the one that gives its TTFT): cached tokens (-1: none
        # completed yet), its GPU, class and prompt; the tables are counted from them at the end
        self.cached = [-1] * n
        self.gpu_of, self.cls_of, self.prompt_of = [0] * n, [0] * n, [0] * n
        self.n_classes = n_classes
        self.evictions = 0

    def grow(self, n_gpus: int) -> None:
        """GPUs added during a run (fleet.add_gpu) start with empty caches."""
        if self.dense and len(self.present) < n_gpus * self.U:
            p = bytearray(n_gpus * self.U)  # (a new array: the compiled class holds a view of the old one)
            p[:len(self.present)] = self.present
            self.present = p
        if self.lru and len(self.head) < n_gpus:
            more = (n_gpus - len(self.head)) * self.U
            self.holders = array("i", self.holders) + array("i", [-1]) * more
            self.prv = array("i", self.prv) + array("i", [-1]) * more
            self.nxt = array("i", self.nxt) + array("i", [-1]) * more
            more = n_gpus - len(self.head)
            self.head = array("q", self.head) + array("q", [-1]) * more
            self.tail = array("q", self.tail) + array("q", [-1]) * more
            self.nfree = array("q", self.nfree) + array("q", [0]) * more
        while len(self.blocks) < n_gpus:
            self.blocks.append(set() if self.lim < 0 else {})
            self.free.append(OrderedDict())

    # -- the kernel's hot calls (tokens mode only) -------------------------------------------------
    def start(self, s: int, g: int, ptok: int, prompt: int, kv: int) -> int:
        """Request s's prefill of ``ptok`` tokens (``prompt`` its prompt) joins GPU g, whose running
        requests hold ``kv`` tokens there: hold its cached run; returns the tokens to compute."""
        if g >= len(self.blocks):
            self.grow(g + 1)
        lim = self.lim
        if lim < 0:
            k = self._closed_run(s, g)
        elif self.lru:
            self._lru_trim(g, kv)  # growth since g's last boundary
            k = self._lru_run(s, g)
            self._lru_hold(s, g, k)
        else:
            if self.free[g]:
                self._trim(g, kv)
            h = self._ids(s)
            k = self._run(self.blocks[g], h)
            self._hold(g, h, k)
        cached = min(k * self.bs, prompt)
        work = max(1, ptok - cached)
        self.run[s] = (g, k, cached, prompt, work)
        if lim >= 0:
            if self.lru:
                self._lru_trim(g, kv + ptok)
            elif self.free[g]:
                self._trim(g, kv + ptok)
        return work

    def leave(self, s: int, g: int, remaining: int, c: int) -> None:
        """Request s's prefill (class c) leaves g with ``remaining`` iterations to go (<= 0: completed,
        all its blocks become present; else evicted, the blocks of its completed chunks); it then
        holds none of them."""
        st = self.run.pop(s)
        o = self.off[s - 1]
        n_ids = self.off[s] - o
        ids = self.ids
        k, cached, prompt = st[1], st[2], st[3]
        if remaining <= 0:
            done = n_ids
            i = s - 1
            if self.cached[i] < 0:  # its first prefill: the one that gives its TTFT
                self.cached[i] = cached
                self.gpu_of[i] = g
                self.cls_of[i] = c
                self.prompt_of[i] = prompt
        else:
            chunks = -(-st[4] // self.C) if self.chunked else 1
            tok = cached + (chunks - remaining) * self.C if self.chunked else cached
            done = n_ids if tok >= prompt else min(n_ids, tok // self.bs)
        if self.lim < 0:
            if self.dense:
                pres = self.present
                base = g * self.U
                for j in range(o + k, o + done):
                    pres[base + ids[j]] = 1
            else:
                blocks = self.blocks[g]
                for j in range(o + k, o + done):
                    blocks.add(ids[j])
            return
        if self.lru:
            hold = self.holders
            base = g * self.U
            for j in range(max(k, done) - 1, -1, -1):  # deepest first: the first block is the most recent
                x = base + ids[o + j]
                if j < k:
                    hold[x] -= 1
                    if hold[x] == 0:
                        self._link(g, x)
                elif hold[x] < 0:
                    hold[x] = 0
                    self._link(g, x)
                elif hold[x] == 0:
                    self._unlink(g, x)
                    self._link(g, x)
            return
        h = self._ids(s)
        blocks, free = self.blocks[g], self.free[g]
        for j in range(max(k, done) - 1, -1, -1):  # deepest first: the first block is the most recent
            b = h[j]
            if j < k:
                n = blocks[b] - 1
                blocks[b] = n
            else:
                n = blocks.get(b)
                if n is None:
                    blocks[b] = n = 0
            if n == 0:
                free[b] = None
                free.move_to_end(b)

    def decode_start(self, s: int, g: int, kv: int, tokens: int) -> None:
        """Request s's decode, ``tokens`` of KV, joins g, whose running requests hold ``kv``: hold its
        present run (with a KV capacity only)."""
        if g >= len(self.blocks):
            self.grow(g + 1)
        if self.lru:
            self._lru_trim(g, kv)
            k = self._lru_run(s, g)
            self._lru_hold(s, g, k)
            self.run[s] = (g, k, 0, 0, 0)
            self._lru_trim(g, kv + tokens)
            return
        if self.free[g]:
            self._trim(g, kv)
        h = self._ids(s)
        k = self._run(self.blocks[g], h)
        self._hold(g, h, k)
        self.run[s] = (g, k, 0, 0, 0)
        if self.free[g]:
            self._trim(g, kv + tokens)

    def decode_leaves(self, s: int, g: int) -> None:
        """Request s's decode left g (done, evicted or moved): it holds none of its blocks."""
        st = self.run.pop(s, None)
        if st is not None and st[1]:
            if self.lru:
                self._lru_release(s, st[0], st[1])
            else:
                self._release(st[0], self._ids(s), st[1])

    def trim(self, g: int, kv: int) -> None:
        """g reached a boundary where its running requests hold ``kv`` tokens: the unheld blocks give way."""
        if self.lru:
            if g < len(self.head):
                self._lru_trim(g, kv)
        elif g < len(self.free) and self.free[g]:
            self._trim(g, kv)

    # -- internals -----------------------------------------------------------------------------------
    def _link(self, g: int, x: int) -> None:
        """Unheld slot x becomes g's most recently released block (the tail of its LRU list)."""
        t = self.tail[g]
        self.prv[x] = t
        self.nxt[x] = -1
        if t >= 0:
            self.nxt[t] = x
        else:
            self.head[g] = x
        self.tail[g] = x
        self.nfree[g] += 1

    def _unlink(self, g: int, x: int) -> None:
        p = self.prv[x]
        q = self.nxt[x]
        if p >= 0:
            self.nxt[p] = q
        else:
            self.head[g] = q
        if q >= 0:
            self.prv[q] = p
        else:
            self.tail[g] = p
        self.nfree[g] -= 1

    def _lru_run(self, s: int, g: int) -> int:
        ids, hold = self.ids, self.holders
        base = g * self.U
        o = self.off[s - 1]
        e = self.off[s]
        j = o
        while j < e and hold[base + ids[j]] >= 0:
            j += 1
        return j - o

    def _lru_hold(self, s: int, g: int, k: int) -> None:
        ids, hold = self.ids, self.holders
        base = g * self.U
        o = self.off[s - 1]
        for j in range(o, o + k):
            x = base + ids[j]
            if hold[x] == 0:
                self._unlink(g, x)
            hold[x] += 1

    def _lru_release(self, s: int, g: int, k: int) -> None:
        ids, hold = self.ids, self.holders
        base = g * self.U
        o = self.off[s - 1]
        for j in range(o + k - 1, o - 1, -1):
            x = base + ids[j]
            hold[x] -= 1
            if hold[x] == 0:
                self._link(g, x)

    def _lru_trim(self, g: int, used: int) -> None:
        room = self.lim - used
        while self.nfree[g] > 0 and self.nfree[g] * self.bs > room:
            x = self.head[g]
            self._unlink(g, x)
            self.holders[x] = -1
            self.evictions += 1

    def _ids(self, s: int) -> list:
        return self.flat[self.off[s - 1]:self.off[s]]

    def _closed_run(self, s: int, g: int) -> int:
        """Request s's cached run on g in a cache that never evicts: it only gains whole leading runs of
        chained ids, so the ids of a chain present on g are a prefix of it, and a binary search finds
        the run (about 5 probes instead of a request's ~24 blocks)."""
        o = self.off[s - 1]
        lo, hi = 0, self.off[s] - o
        ids = self.ids
        if self.dense:
            pres = self.present
            base = g * self.U
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if pres[base + ids[o + mid - 1]]:
                    lo = mid
                else:
                    hi = mid - 1
        else:
            blocks = self.blocks[g]
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if ids[o + mid - 1] in blocks:
                    lo = mid
                else:
                    hi = mid - 1
        return lo

    def _run(self, blocks, h: list) -> int:
        """The number of leading ids of h present in blocks."""
        k = 0
        for b in h:
            if b not in blocks:
                break
            k += 1
        return k

    def _hold(self, g: int, h: list, k: int) -> None:
        blocks, free = self.blocks[g], self.free[g]
        for j in range(k):
            b = h[j]
            n = blocks[b]
            if n == 0:
                del free[b]
            blocks[b] = n + 1

    def _release(self, g: int, h: list, k: int) -> None:
        blocks, free = self.blocks[g], self.free[g]
        for j in range(k - 1, -1, -1):
            b = h[j]
            n = blocks[b] - 1
            blocks[b] = n
            if n == 0:
                free[b] = None
                free.move_to_end(b)

    def _trim(self, g: int, used: int) -> None:
        free = self.free[g]
        room = self.lim - used
        bs = self.bs
        blocks = self.blocks[g]
        while free and len(free) * bs > room:
            b, _ = free.popitem(last=False)
            del blocks[b]
            self.evictions += 1

    # -- reads -----------------------------------------------------------------------------------------
    def query(self, s: int, prompt: int, g: int) -> int:
        """Leading tokens of request s's prompt cached on GPU g now (0 for a GPU out of range)."""
        if not 0 <= g < len(self.blocks):
            return 0
        if self.lim < 0:
            k = self._closed_run(s, g)
        else:
            k = self._lru_run(s, g) if self.lru else self._run(self.blocks[g], self._ids(s))
        return min(k * self.bs, prompt)

    def cached_of(self, ids: np.ndarray) -> np.ndarray:
        """Cached tokens of the first prefill of the requests with these record ids (0 if none)."""
        a = np.asarray(self.cached, dtype=np.int64)[np.asarray(ids, dtype=np.int64) - 1]
        return np.maximum(a, 0)

    def tables(self, class_names, n_gpus: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Per class and per instance: first prefills, prompt tokens, cached tokens, hit ratio."""
        cached = np.asarray(self.cached, dtype=np.int64)
        done = cached >= 0

        def frame(key: list, size: int, index: pd.Index) -> pd.DataFrame:
            kk = np.asarray(key, dtype=np.int64)[done]
            a = np.stack([np.bincount(kk, minlength=size),
                          np.bincount(kk, np.asarray(self.prompt_of, dtype=np.float64)[done], minlength=size),
                          np.bincount(kk, cached[done].astype(np.float64), minlength=size)], axis=1)
            df = pd.DataFrame(np.rint(a).astype(np.int64)[:size], index=index,
                              columns=["prefilled", "prompt_tokens", "cached_prompt_tokens"])
            df["hit_ratio"] = np.where(df.prompt_tokens > 0, df.cached_prompt_tokens / df.prompt_tokens.clip(lower=1),
                                       np.nan)
            return df
        self.grow(n_gpus)
        return (frame(self.cls_of, self.n_classes, pd.Index(list(class_names), name="class")),
                frame(self.gpu_of, n_gpus, pd.Index(range(n_gpus), name="instance")))


@functools.cache
def compiled_class() -> tuple[type | None, str]:
    """(the compiled PrefixCache, why) when ``fluidopt.sim._c_prefix_cache`` is built from this file and
    prefix_cache.pxd as they are on disk (setup.py records their SHA-256 in it), else (None, why)."""
    here = Path(__file__)
    try:
        mod = importlib.import_module("fluidopt.sim._c_prefix_cache")
    except ImportError as exc:
        return None, f"not compiled ({exc})"
    try:
        digest = hashlib.sha256(here.read_bytes() + b"\0" + here.with_suffix(".pxd").read_bytes()).hexdigest()
    except OSError:
        digest = getattr(mod, "SOURCE_SHA256", None)  # an installed package without its sources
    if digest != getattr(mod, "SOURCE_SHA256", None):
        return None, "built from another version of prefix_cache.py or prefix_cache.pxd"
    return mod.PrefixCache, "compiled from the current sources"


def make_prefix_cache(workload, n_gpus: int, n_classes: int, kvcap: int, service: str, prefix_cache, chunk: int,
                      chunked: bool, typed: bool = False) -> PrefixCache | None:
    """The run's cache, or None: off (``prefix_cache`` False), no hashes, or markov service. ``typed`` (the
    compiled core): the compiled class when it is built from the current sources (same numbers)."""
    hashes = getattr(workload, "hashes", None)
    if prefix_cache is True and (hashes is None or service != "tokens"):
        from fluidopt.core.errors import ScenarioError

        why = "the workload carries no block hashes" if hashes is None else f"service={service!r} has no token model"
        raise ScenarioError(f"simulate: prefix_cache=True: {why} (a prefix cache needs both; None turns it on when "
                            "they are there)")
    if prefix_cache is False or hashes is None or service != "tokens":
        return None
    cls = (compiled_class()[0] if typed else None) or PrefixCache
    return cls(hashes, workload.block_size, n_gpus, n_classes, kvcap, chunk, chunked)
