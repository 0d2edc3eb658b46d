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
from array import array
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PrefixCache", "make_prefix_cache"]

_DENSE_BYTES = 1 << 26  # the most memory a never-evicting cache keeps as bytes per (GPU, block) before sets
_LRU_BYTES = 1 << 28  # the most memory a cache with a KV capacity starts its typed table with, before dicts
_HASH = 0x45D9F3B  # the index's multiplier: a key's low 32 bits (_LOW) times this stay below 2**59 (C integers)
_LOW = 0xFFFFFFFF
_SLACK = 64  # nodes per GPU the pool starts with beyond its capacity's blocks (for held blocks)


class PrefixCache:
    """The block caches of one run's GPUs (module docstring). ``hashes``: one int array per trace row;
    ``block_size``: tokens per block; ``kvcap``: the GPU's KV capacity in tokens, < 0 unlimited;
    ``chunk``, ``chunked``: the GPUs' prefill chunk and style (which blocks an evicted prefill computed).

    The kernel calls :meth:`start` and :meth:`leave` for every prefill, and with a KV capacity
    (``eng._pch``, the same object) :meth:`decode_start`, :meth:`decode_leaves` and :meth:`trim`; it
    passes scalars (a request by its arrival number ``s`` = trace row + 1), never itself. In the compiled
    core these are C calls (engine.pxd types the cache as the compiled class). Without a KV capacity a
    GPU's cache is one byte per block (``present``; a set beyond ``_DENSE_BYTES``): nothing is held or
    evicted. With one, the cached (GPU, block) pairs are nodes of a typed pool, found through an
    open-addressing index (linear probing) and linked into an LRU list per GPU of the unheld ones: its
    size follows the blocks cached at a time (about K / block_size per GPU), not the trace's blocks, so
    it stays in the CPU's caches and costs nothing to set up (a dict and an ``OrderedDict`` per GPU
    beyond ``_LRU_BYTES``: the same numbers). setup.py compiles this file with prefix_cache.pxd into
    ``fluidopt.sim._c_prefix_cache``, which the compiled core uses (:func:`compiled_class`).
    """

    def __init__(self, hashes, block_size: int, n_gpus: int, n_classes: int, kvcap: int, chunk: int,
                 chunked: bool):
        # every request's block ids in one typed array, request s's at ids[off[s - 1]:off[s]], renumbered
        # 0 .. U - 1 (equal ids stay equal, so the chains are kept): ids that already are small
        # non-negative integers (Mooncake's) as they are, others through np.unique
        n = len(hashes)
        off = np.zeros(n + 1, np.int64)
        np.cumsum(np.fromiter(map(len, hashes), np.int64, n), out=off[1:])
        self.off = array("q", off.tobytes())
        total = int(off[n])
        if not (n and total):
            allids = np.zeros(0, np.int64)
        elif set(map(type, hashes)) == {np.ndarray} and {x.dtype for x in hashes} == {np.dtype(np.int64)}:
            try:  # (a trace's rows, joined as bytes: a fifth of np.concatenate's time)
                allids = np.frombuffer(b"".join(hashes), np.int64)
            except (TypeError, BufferError):  # a strided view among them
                allids = np.concatenate(hashes)
        else:
            allids = np.concatenate(hashes).astype(np.int64, copy=False)
        if total and allids.min() >= 0 and allids.max() < max(4 * total, 1 << 16):
            self.U = int(allids.max()) + 1
        else:
            uniq, allids = np.unique(allids, return_inverse=True)
            self.U = len(uniq)
        ids = array("q", allids.astype(np.int64, copy=False).tobytes())
        self.ids = ids
        self.bs = int(block_size)
        self.lim = int(kvcap)
        self.C, self.chunked = int(chunk), bool(chunked)
        # with a KV capacity: a pool of nodes, one per cached (GPU, block) pair, each four ints in ``nd`` (at
        # 4 x: its slot in the index, its holders, and the links of g's LRU list of unheld blocks, oldest at
        # head[g]; free nodes are chained by the last from fnode), and an open-addressing index ``tab``
        # (linear probing; at 2 i the node in slot i, -1 if empty, at 2 i + 1 its key g * U + id), twice
        # the pool so at most half full. A node's fields share a cache line, as do a slot's node and key.
        # The pool starts with room for the blocks that fit every GPU's capacity and doubles when full.
        nodes = 4
        while nodes < min(n_gpus * (max(self.lim, 0) // max(self.bs, 1) + _SLACK), n_gpus * self.U):
            nodes *= 2
        self.lru = kvcap >= 0 and 48 * nodes + 4 * total <= _LRU_BYTES
        m = nodes if self.lru else 0
        nd = array("i", [-1, 0, -1, 0]) * m
        for x in range(m):
            nd[4 * x + 3] = x + 1
        if m:
            nd[4 * m - 1] = -1
        self.nd = nd
        self.fnode = 0 if m else -1
        self.tab = array("q", [-1, -1]) * (2 * m)
        self.mask = 2 * m - 1
        self.hnode = array("i", [0]) * (total if self.lru else 0)  # the node of each block a request holds
        self.head, self.tail, self.nfree = array("q", [-1]) * n_gpus, array("q", [-1]) * n_gpus, array("q", [0]) * n_gpus
        self.flat = ids.tolist() if kvcap >= 0 and not self.lru else []  # the dict path walks Python ints
        # without a KV capacity and up to _DENSE_BYTES, one byte per (GPU, block): 1 when present
        self.dense = kvcap < 0 and n_gpus * self.U <= _DENSE_BYTES
        self.present = bytearray(n_gpus * self.U if self.dense else 0)
        self.blocks: list = [set() if kvcap < 0 else {} for _ in range(n_gpus)]  # dict: id -> holders
        self.free: list[OrderedDict] = [OrderedDict() for _ in range(n_gpus)]  # unheld, evicted first-in first
        # per request (index s - 1), while it runs on a GPU: that GPU, its blocks there (the cached run of a
        # prefill, held with a KV capacity; -1: not running), its prefill's cached tokens and tokens computed
        self.rg, self.rk = array("q", [0]) * n, array("q", [-1]) * n
        self.rc, self.rw = array("q", [0]) * n, array("q", [0]) * n
        # per trace row, of its first prefill (the one that gives its TTFT): cached tokens (-1: none
        # completed yet), its GPU, class and prompt; the tables are counted from them at the end
        self.cached = array("q", [-1]) * n
        self.gpu_of, self.cls_of, self.prompt_of = array("q", [0]) * n, array("q", [0]) * n, array("q", [0]) * n
        self.n_classes = n_classes
        self.evictions = 0

    def grow(self, n_gpus: int) -> None:
        """GPUs added during a run (fleet.add_gpu) start with empty caches."""
        if self.dense and len(self.present) < n_gpus * self.U:
            p = bytearray(n_gpus * self.U)  # (a new array: the compiled class holds a view of the old one)
            p[:len(self.present)] = self.present
            self.present = p
        if len(self.head) < n_gpus:  # (the node pool is shared: a new GPU's keys are new)
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
        if g >= len(self.head):
            self.grow(g + 1)
        lim = self.lim
        if lim < 0:
            k = self._closed_run(s, g)
        elif self.lru:
            self._lru_trim(g, kv)  # growth since g's last boundary
            k = self._lru_take(s, g)
        else:
            if self.free[g]:
                self._trim(g, kv)
            h = self._ids(s)
            k = self._run(self.blocks[g], h)
            self._hold(g, h, k)
        cached = min(k * self.bs, prompt)
        work = max(1, ptok - cached)
        i = s - 1
        self.rg[i] = g
        self.rk[i] = k
        self.rc[i] = cached
        self.rw[i] = work
        self.prompt_of[i] = prompt
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
        i = s - 1
        k, cached, prompt = self.rk[i], self.rc[i], self.prompt_of[i]
        self.rk[i] = -1
        o = self.off[i]
        n_ids = self.off[s] - o
        ids = self.ids
        if remaining <= 0:
            done = n_ids
            if self.cached[i] < 0:  # its first prefill: the one that gives its TTFT
                self.cached[i] = cached
                self.gpu_of[i] = g
                self.cls_of[i] = c
        else:
            chunks = -(-self.rw[i] // self.C) if self.chunked else 1
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
        if self.lru:  # (self's arrays directly, as in the per-block methods below)
            base = g * self.U
            for j in range(max(k, done) - 1, -1, -1):  # deepest first: the first block is the most recent
                if j < k:
                    x = self.hnode[o + j]
                    self.nd[4 * x + 1] -= 1
                    if self.nd[4 * x + 1] == 0:
                        self._link(g, x)
                    continue
                x = self._find(base + self.ids[o + j])
                if x < 0:
                    x = self._insert(base + self.ids[o + j])
                    self._link(g, x)
                elif self.nd[4 * x + 1] == 0:
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
        if g >= len(self.head):
            self.grow(g + 1)
        i = s - 1
        self.rg[i] = g
        if self.lru:
            self._lru_trim(g, kv)
            self.rk[i] = self._lru_take(s, g)
            self._lru_trim(g, kv + tokens)
            return
        if self.free[g]:
            self._trim(g, kv)
        h = self._ids(s)
        k = self._run(self.blocks[g], h)
        self._hold(g, h, k)
        self.rk[i] = k
        if self.free[g]:
            self._trim(g, kv + tokens)

    def decode_leaves(self, s: int, g: int) -> None:
        """Request s's decode left g (done, evicted or moved): it holds none of its blocks."""
        i = s - 1
        k = self.rk[i]
        self.rk[i] = -1
        if k > 0:
            if self.lru:
                self._lru_release(s, self.rg[i], k)
            else:
                self._release(self.rg[i], self._ids(s), k)

    def trim(self, g: int, kv: int) -> None:
        """g reached a boundary where its running requests hold ``kv`` tokens: the unheld blocks give way."""
        if self.lru:
            if g < len(self.head):
                self._lru_trim(g, kv)
        elif g < len(self.free) and self.free[g]:
            self._trim(g, kv)

    # -- internals: the typed LRU ------------------------------------------------------------------
    # (the typed LRU's methods index self's arrays directly: in the compiled class a local view of one costs
    # two atomic reference-count updates, more than a lookup; they run per block or per request)
    def _find(self, key: int) -> int:
        """The node of key (g * U + block id), or -1 when that block is not cached on g."""
        mask = self.mask
        i = ((key & _LOW) * _HASH >> 16) & mask
        x = self.tab[2 * i]
        while x >= 0 and self.tab[2 * i + 1] != key:
            i = (i + 1) & mask
            x = self.tab[2 * i]
        return x

    def _insert(self, key: int) -> int:
        """A new node for key (not cached yet), with no holders and in no list."""
        if self.fnode < 0:
            self._grow_pool()
        x = self.fnode
        self.fnode = self.nd[4 * x + 3]
        self.nd[4 * x + 1] = 0
        mask = self.mask
        i = ((key & _LOW) * _HASH >> 16) & mask
        while self.tab[2 * i] >= 0:
            i = (i + 1) & mask
        self.tab[2 * i] = x
        self.tab[2 * i + 1] = key
        self.nd[4 * x] = i
        return x

    def _delete(self, x: int) -> None:
        """Node x leaves the index and the pool (backward-shift deletion: no tombstones, so a probe stops
        at the first empty slot; the nodes shifted learn their new slots)."""
        mask = self.mask
        i = self.nd[4 * x]
        j = i
        while True:
            j = (j + 1) & mask
            y = self.tab[2 * j]
            if y < 0:
                break
            h = ((self.tab[2 * j + 1] & _LOW) * _HASH >> 16) & mask
            if (h - i - 1) & mask >= (j - i) & mask:  # y's home is not in (i, j]: it moves into the hole
                self.tab[2 * i] = y
                self.tab[2 * i + 1] = self.tab[2 * j + 1]
                self.nd[4 * y] = i
                i = j
        self.tab[2 * i] = -1
        self.nd[4 * x + 3] = self.fnode
        self.fnode = x

    def _grow_pool(self) -> None:
        """Twice the nodes (their numbers, and so the lists and the requests' held nodes, stay) and a new
        index twice that."""
        old = len(self.nd) // 4
        nd = array("i", self.nd) + array("i", [-1, 0, -1, 0]) * old
        for x in range(old, 2 * old):
            nd[4 * x + 3] = x + 1
        nd[8 * old - 1] = -1
        self.fnode = old
        was = self.tab
        tab = array("q", [-1, -1]) * (4 * old)
        mask = 4 * old - 1
        for j in range(2 * old):  # every node is in use (the pool was full)
            x = was[2 * j]
            if x >= 0:
                key = was[2 * j + 1]
                i = ((key & _LOW) * _HASH >> 16) & mask
                while tab[2 * i] >= 0:
                    i = (i + 1) & mask
                tab[2 * i] = x
                tab[2 * i + 1] = key
                nd[4 * x] = i
        self.nd = nd
        self.tab = tab
        self.mask = mask

    def _link(self, g: int, x: int) -> None:
        """Unheld node x becomes g's most recently released block (the tail of its LRU list)."""
        t = self.tail[g]
        self.nd[4 * x + 2] = t
        self.nd[4 * x + 3] = -1
        if t >= 0:
            self.nd[4 * t + 3] = x
        else:
            self.head[g] = x
        self.tail[g] = x
        self.nfree[g] += 1

    def _unlink(self, g: int, x: int) -> None:
        p = self.nd[4 * x + 2]
        q = self.nd[4 * x + 3]
        if p >= 0:
            self.nd[4 * p + 3] = q
        else:
            self.head[g] = q
        if q >= 0:
            self.nd[4 * q + 2] = p
        else:
            self.tail[g] = p
        self.nfree[g] -= 1

    def _lru_run(self, s: int, g: int) -> int:
        """The number of request s's leading blocks cached on g (a read: nothing is held)."""
        ids = self.ids
        base = g * self.U
        o = self.off[s - 1]
        e = self.off[s]
        j = o
        while j < e and self._find(base + ids[j]) >= 0:
            j += 1
        return j - o

    def _lru_take(self, s: int, g: int) -> int:
        """Request s holds its cached run on g (its nodes in hnode); returns its length in blocks."""
        base = g * self.U
        o = self.off[s - 1]
        e = self.off[s]
        j = o
        while j < e:
            x = self._find(base + self.ids[j])
            if x < 0:
                break
            if self.nd[4 * x + 1] == 0:
                self._unlink(g, x)
            self.nd[4 * x + 1] += 1
            self.hnode[j] = x
            j += 1
        return j - o

    def _lru_release(self, s: int, g: int, k: int) -> None:
        o = self.off[s - 1]
        for j in range(o + k - 1, o - 1, -1):
            x = self.hnode[j]
            self.nd[4 * x + 1] -= 1
            if self.nd[4 * x + 1] == 0:
                self._link(g, x)

    def _lru_trim(self, g: int, used: int) -> None:
        room = self.lim - used
        while self.nfree[g] > 0 and self.nfree[g] * self.bs > room:
            x = self.head[g]
            self._unlink(g, x)
            self._delete(x)
            self.evictions += 1

    # -- internals: without a KV capacity, and the dicts -------------------------------------------
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
        # pandas only here: the stand-in engine imports this module and never builds the tables (about half
        # of its start-up was pandas' import)
        import pandas as pd

        cached = np.asarray(self.cached, dtype=np.int64)
        done = cached >= 0

        def frame(key, size: int, index: pd.Index) -> pd.DataFrame:
            kk = np.asarray(key, dtype=np.int64)[done]
            a = np.stack([np.bincount(kk, minlength=size),
                          np.bincount(kk, np.asarray(self.prompt_of, dtype=np.float64)[done], minlength=size),
                          np.bincount(kk, cached[done].astype(np.float64), minlength=size)], axis=1)
            a = np.rint(a).astype(np.int64)[:size]
            hit = np.full(size, np.nan)
            some = a[:, 1] > 0
            hit[some] = a[some, 2] / a[some, 1]
            # (one frame from numpy columns: pandas' column arithmetic cost more than the rest of the run's end)
            return pd.DataFrame({"prefilled": a[:, 0], "prompt_tokens": a[:, 1], "cached_prompt_tokens": a[:, 2],
                                 "hit_ratio": hit}, index=index)
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
    compiled core, which calls the cache at C level): the compiled class, built from the current sources
    (fluidopt.sim.backend runs the core only then; same numbers as the Python class)."""
    hashes = getattr(workload, "hashes", None)
    if prefix_cache is True and (hashes is None or service != "tokens"):
        from fluidopt.core.errors import ScenarioError

        why = "the workload carries no block hashes" if hashes is None else f"service={service!r} has no token model"
        raise ScenarioError(f"simulate: prefix_cache=True: {why} (a prefix cache needs both; None turns it on when "
                            "they are there)")
    if prefix_cache is False or hashes is None or service != "tokens":
        return None
    cls = PrefixCache
    if typed:
        cls, why = compiled_class()
        if cls is None:  # (only an engine built by hand: simulate and make_engine check first)
            raise RuntimeError(f"the compiled core needs fluidopt.sim._c_prefix_cache, which is {why}")
    return cls(hashes, workload.block_size, n_gpus, n_classes, kvcap, chunk, chunked)
