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

from collections import OrderedDict

import numpy as np
import pandas as pd

__all__ = ["PrefixCache", "make_prefix_cache"]


class PrefixCache:
    """The block caches of one run's GPUs (module docstring). ``hashes``: one int array per trace
    row; ``block_size``: tokens per block; ``kvcap``: the GPU's KV capacity in tokens, < 0 unlimited."""

    def __init__(self, hashes, block_size: int, n_gpus: int, n_classes: int, kvcap: int):
        self.h = [list(map(int, x)) for x in hashes]
        self.bs = int(block_size)
        self.lim = int(kvcap)
        self.blocks: list[dict] = [{} for _ in range(n_gpus)]  # block id -> running requests holding it
        self.free: list[OrderedDict] = [OrderedDict() for _ in range(n_gpus)]  # held by none: evicted first-in first
        self.run: dict[int, list] = {}  # request slot -> [gpu, blocks held, cached tokens, start boundary, its block ids]
        self.cached = np.zeros(len(self.h), dtype=np.int64)  # per trace row: cached tokens of its first prefill
        self.by_class = np.zeros((n_classes, 3), dtype=np.int64)  # first prefills, prompt tokens, cached tokens
        self.by_gpu = np.zeros((n_gpus, 3), dtype=np.int64)
        self.evictions = 0

    def grow(self, n_gpus: int) -> None:
        """GPUs added during a run (fleet.add_gpu) start with empty caches."""
        while len(self.blocks) < n_gpus:
            self.blocks.append({})
            self.free.append(OrderedDict())
            self.by_gpu = np.vstack([self.by_gpu, np.zeros((1, 3), dtype=np.int64)])

    # -- the kernel's hot calls (tokens mode only) -------------------------------------------------
    def prefill_start(self, eng, r: int, g: int, ptok: int) -> int:
        """r's prefill of ``ptok`` tokens joins g (anchored at its join boundary, KV not yet reserved):
        hold its cached run; returns the tokens to compute."""
        if len(self.blocks) <= g:
            self.grow(g + 1)
        h = self.h[eng.r_serial[r] - 1]
        blocks = self.blocks[g]
        lim = self.lim
        if lim >= 0:
            self._trim(g, eng.t_kv[g])  # growth since g's last boundary
        k = 0
        for b in h:
            if b not in blocks:
                break
            k += 1
        if lim >= 0:
            self._hold(g, h, k)
        prompt = eng.r_prompt[r]
        cached = min(k * self.bs, prompt)
        if eng.r_ttft[r] != eng.r_ttft[r]:  # NaN: the prefill that gives its TTFT
            self.cached[eng.r_serial[r] - 1] = cached
        self.run[r] = [g, k, cached, eng.t_ka[g], h]
        if lim >= 0:
            self._trim(g, eng.t_kv[g] + ptok)
        return max(1, ptok - cached)

    def prefill_leaves(self, eng, r: int, g: int) -> None:
        """r's prefill leaves g at g's anchor boundary: completed (all its blocks become present) or
        evicted (the blocks of its completed chunks); then it holds none of them."""
        st = self.run.pop(r)
        i = eng.r_serial[r] - 1
        h = self.h[i]
        k = st[1]
        if eng.t_pend[g] <= eng.t_ka[g]:  # completed
            done = len(h)
            if eng.r_ttft[r] != eng.r_ttft[r]:
                c = eng.r_cls[r]
                p = eng.r_prompt[r]
                for row in (self.by_class[c], self.by_gpu[g]):
                    row[0] += 1
                    row[1] += p
                    row[2] += st[2]
        else:
            tok = st[2] + ((eng.t_ka[g] - st[3]) * eng.C if eng.chunked else 0)
            done = len(h) if tok >= eng.r_prompt[r] else min(len(h), tok // self.bs)
        blocks = self.blocks[g]
        if self.lim < 0:
            for j in range(k, done):
                blocks[h[j]] = 0
            return
        free = self.free[g]
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
        self._trim(g, eng.t_kv[g] - eng.r_prompt[r] - eng.r_gen[r])

    def decode_start(self, eng, r: int, g: int, tokens: int) -> None:
        """r's decode, ``tokens`` of KV, joins g (anchored, KV not yet reserved): hold its present run."""
        if self.lim < 0:
            return
        if len(self.blocks) <= g:
            self.grow(g + 1)
        self._trim(g, eng.t_kv[g])
        h = self.h[eng.r_serial[r] - 1]
        blocks = self.blocks[g]
        k = 0
        for b in h:
            if b not in blocks:
                break
            k += 1
        self._hold(g, h, k)
        self.run[r] = [g, k, 0, 0, h]
        self._trim(g, eng.t_kv[g] + tokens)

    def decode_leaves(self, r: int, g: int) -> None:
        """r's decode left g (done, evicted or moved): it holds none of its blocks."""
        if self.lim < 0:
            return
        st = self.run.pop(r, None)
        if st is not None:
            self._release(st[0], st[4], st[1])

    def trim(self, g: int, used: int) -> None:
        """g reached a boundary with ``used`` KV tokens of running requests: make the cached blocks fit."""
        if len(self.blocks) > g and self.free[g]:
            self._trim(g, used)

    # -- internals -----------------------------------------------------------------------------------
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
    def query(self, eng, r: int, g: int) -> int:
        """Leading tokens of request r's prompt cached on GPU g now (0 for a GPU out of range)."""
        if not 0 <= g < len(self.blocks):
            return 0
        h = self.h[eng.r_serial[r] - 1]
        blocks = self.blocks[g]
        k = 0
        for b in h:
            if b not in blocks:
                break
            k += 1
        return min(k * self.bs, eng.r_prompt[r])

    def tables(self, class_names, n_gpus: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Per class and per instance: first prefills, prompt tokens, cached tokens, hit ratio."""
        def frame(a: np.ndarray, index: pd.Index) -> pd.DataFrame:
            df = pd.DataFrame(a, index=index, columns=["prefilled", "prompt_tokens", "cached_prompt_tokens"])
            df["hit_ratio"] = np.where(df.prompt_tokens > 0, df.cached_prompt_tokens / df.prompt_tokens.clip(lower=1),
                                       np.nan)
            return df
        self.grow(n_gpus)
        return (frame(self.by_class, pd.Index(list(class_names), name="class")),
                frame(self.by_gpu[:n_gpus], pd.Index(range(n_gpus), name="instance")))


def make_prefix_cache(workload, n_gpus: int, n_classes: int, kvcap: int, service: str, prefix_cache) -> PrefixCache | None:
    """The run's cache, or None: off (``prefix_cache`` False), no hashes, or markov service."""
    hashes = getattr(workload, "hashes", None)
    if prefix_cache is False or hashes is None or service != "tokens":
        return None
    return PrefixCache(hashes, workload.block_size, n_gpus, n_classes, kvcap)

