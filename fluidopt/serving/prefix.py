"""The stand-in engine's prefix cache: the simulator's own cache (:class:`fluidopt.sim.prefix_cache.PrefixCache`,
docs/simulator.md section 1.2) fed one request at a time, and the block ids a request's text gives.

Block ids. A prompt is cut into blocks of ``block_size`` words (the stand-in's tokens; a list of token
ids: ``block_size`` ids), the last one partial, and block j's id is a chained hash of blocks 0..j
(BLAKE2b of the parent's digest and the block's words), so equal ids mean an equal prefix up to that
block, as vLLM hashes its KV blocks and as the simulator's trace ids are chained. The replayer sends a
trace's block hash id h as the words ``h<h>.0 .. h<h>.<block_size - 1>``; with the engine's block size
equal to the trace's, two requests share a block id exactly when they share the trace's id (on the
Mooncake conversation trace no id occurs with two different fills of a partial last block), so the
engine sees the trace's reuse block for block. The ids are the same in every process (no salted
``hash()``).

The cache rules are the simulator's, unchanged: this module only registers each request's ids as it
arrives (the simulator's cache is built with the whole trace's ids) and maps the engine's calls
(:class:`fluidopt.engines.live.PrefixCacheHooks`) onto the simulator's, for one instance (GPU 0) and
one class. It uses the simulator cache's dict / set paths, which take any integer ids.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from fluidopt.sim.prefix_cache import PrefixCache

DEFAULT_BLOCK_SIZE = 16  # vLLM's KV block size (tokens); the loop passes a trace's own (Mooncake: 512)


def block_ids(units: Sequence[str], block_size: int) -> list[int]:
    """Chained ids of the blocks of ``block_size`` units (words or token ids as text), the last partial."""
    out: list[int] = []
    parent = b""
    for i in range(0, len(units), block_size):
        d = hashlib.blake2b(parent + "\x1f".join(units[i:i + block_size]).encode(), digest_size=8).digest()
        out.append(int.from_bytes(d, "little", signed=True))
        parent = d
    return out


class LivePrefixCache(PrefixCache):
    """One instance's cache with the simulator's rules. ``block_size``: tokens per block; ``kv_tokens``:
    the instance's KV capacity in tokens (None: unlimited, nothing is evicted)."""

    def __init__(self, block_size: int, kv_tokens: int | None) -> None:
        if block_size < 1:
            raise ValueError(f"prefix-cache block size {block_size}: expected a positive number of tokens")
        kvcap = -1 if kv_tokens is None else int(kv_tokens)
        # chunk / chunked only say which blocks a prefill evicted part-way computed; the live engine never
        # evicts a prefill, so any values do
        super().__init__([], block_size, 1, 1, kvcap, 1, False)
        # the ids arrive with the requests, so the typed per-(GPU, block) tables that need every id up
        # front are off: the dict (with a capacity) and set (without) paths take any int
        self.lru = self.dense = False
        self.flat = []
        self.ids = array("q")

    def add(self, blocks: Sequence[int]) -> int:
        """Register the next request's block ids; its serial (1, 2, ...)."""
        self.ids.extend(blocks)
        if self.lim >= 0:
            self.flat.extend(blocks)
        self.off.append(len(self.ids))
        # the simulator's per-request arrays (index s - 1), each one entry longer: running GPU, blocks held
        # (-1: not running), cached tokens and tokens computed of its prefill; its first prefill's cached
        # tokens (-1: none completed), GPU, class and prompt
        for a, v in ((self.rg, 0), (self.rk, -1), (self.rc, 0), (self.rw, 0), (self.cached, -1),
                     (self.gpu_of, 0), (self.cls_of, 0), (self.prompt_of, 0)):
            a.append(v)
        return len(self.off) - 1

    def lookup(self, s: int, ptok: int, prompt: int, kv: int) -> tuple[int, int]:
        work = self.start(s, 0, ptok, prompt, kv)
        return work, self.rc[s - 1]

    def done(self, s: int) -> None:
        self.leave(s, 0, 0, 0)

    def hold(self, s: int, kv: int, tokens: int) -> None:
        if self.lim >= 0:  # the simulator holds a decode's blocks only with a capacity (nothing is evicted else)
            self.decode_start(s, 0, kv, tokens)

    def release(self, s: int) -> None:
        if self.lim >= 0:
            self.decode_leaves(s, 0)

    def trim(self, kv: int) -> None:  # type: ignore[override]  # one instance: the engine's call has no GPU
        if self.lim >= 0:
            super().trim(0, kv)

    def blocks_cached(self) -> int:
        """Blocks present now (held or not)."""
        return len(self.blocks[0])
