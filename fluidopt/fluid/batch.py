"""One GPU's decode batch under the iteration-time law: the mean resident context of a decode, the
largest batch that meets an inter-token-latency target, and the fluid throughput of a batch.

Closed forms shared by the multi-period fleet plan (:mod:`fluidopt.fluid.multiperiod`), the saturated
throughputs (:mod:`fluidopt.fluid.saturation`) and the orchestrators.
"""

from __future__ import annotations

import math

from fluidopt.core.model import GPUProfile, RequestClass

__all__ = ["batch_throughput", "largest_batch", "mean_context"]


def mean_context(c: RequestClass) -> float:
    """Mean resident KV context of a decoding request of class c (tokens): prompt + output / 2."""
    return c.prompt + c.decode / 2.0


def largest_batch(gpu: GPUProfile, itl: float | None, context: float) -> int:
    """The local autoscaler's rule: the largest decode batch b in 1..B-1 (one slot stays for the
    prefill) whose mixed iteration, tau_mix + kv_time_per_token * b * context seconds, meets the ITL
    target ``itl`` (seconds per token; None: B-1). At least 1, even when no batch meets the target."""
    bmax = max(1, gpu.batch - 1)
    if itl is None or gpu.kv_time_per_token <= 0 or context <= 0:
        return bmax
    b = int(math.floor((itl - gpu.tau_mix) / (gpu.kv_time_per_token * context)))
    return max(1, min(bmax, b))


def batch_throughput(gpu: GPUProfile, b: int, prompt: float, output: float) -> float:
    """Completions per second of one GPU keeping ``b`` decodes of a class with mean ``prompt`` and
    ``output`` tokens busy (a fluid estimate). Each completion needs ceil(P/C) mixed iterations of
    prefill; b/D decodes complete per iteration; the share of mixed iterations is f = min(1, b/D *
    ceil(P/C)); the mean iteration is f tau_mix + (1-f) tau_solo + the KV time of b contexts of
    P + D/2 tokens; prefill-bound (one prefill at a time) when f reaches 1."""
    chunks = math.ceil(prompt / gpu.chunk)
    per_iter = b / max(output, 1.0)
    f = per_iter * chunks
    kv = gpu.kv_time_per_token * b * (prompt + output / 2.0)
    if f >= 1.0:
        return 1.0 / (chunks * (gpu.tau_mix + kv))
    tau = f * gpu.tau_mix + (1.0 - f) * gpu.tau_solo + kv
    return per_iter / tau
