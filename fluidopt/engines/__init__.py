"""Engine instances as real serving engines schedule them, driven by an iteration-time law
(:mod:`fluidopt.calibration.timemodels`), one instance at a time: the path validated against measured
runs (docs/fidelity.md). The many-server simulator (:mod:`fluidopt.sim`) times its iterations with the same
laws (``GPUProfile.timemodel``) under its own scheduler, one prefill per GPU at a time.

* ``vllm``: vLLM before chunked prefill (2023-24 releases): prefill-first iterations of whole prompts,
  FCFS, KV blocks of 16 tokens, preemption by recompute;
* ``chunked``: chunked prefill (Sarathi-Serve, vLLM v1): each iteration's token budget mixes every
  decode with prompt chunks;
* ``paper``: the project's model: one prefill chunk of C tokens plus the decodes of the batch.
"""

from __future__ import annotations

import dataclasses

from fluidopt.core.errors import UsageError, did_you_mean
from fluidopt.engines.stepper import EngineConfig, Replay, replay

ENGINES = ("vllm", "chunked", "paper")

# vLLM 0.2's defaults for OPT (max_model_len 2048): max_num_batched_tokens = max(2048, max_model_len),
# max_num_seqs = 256, block_size = 16, gpu watermark 1%; Sarathi-Serve's and vLLM's chunk budget 512;
# the paper's C = 256.
_DEFAULTS = {
    "vllm": dict(mode="prefill-first", max_num_batched_tokens=2048, max_num_seqs=256, max_model_len=2048),
    "chunked": dict(mode="mixed", max_num_batched_tokens=512, max_num_seqs=256, budget_counts_decodes=True),
    "paper": dict(mode="mixed", max_num_batched_tokens=256, max_num_seqs=256, budget_counts_decodes=False,
                  prefills_per_iteration=1),
}


def engine_config(name: str, *, kv_tokens: int | None = None, **overrides) -> EngineConfig:
    """The settings of engine ``name`` with a KV cache of ``kv_tokens`` tokens (None: unlimited) and any
    :class:`EngineConfig` field overridden. An unknown name raises :class:`UsageError` ("did you mean")."""
    if name not in _DEFAULTS:
        raise UsageError(f"--engine {name!r}: no such engine{did_you_mean(name, ENGINES)}; expected one of "
                         f"{', '.join(ENGINES)}")
    kw = dict(_DEFAULTS[name])
    kw.update(overrides)
    bs = kw.get("block_size", 16)
    kw["kv_blocks"] = None if kv_tokens is None else int(kv_tokens) // bs
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    bad = sorted(set(kw) - fields)
    if bad:
        raise UsageError(f"engine {name!r}: unknown setting {bad[0]!r}; expected {', '.join(sorted(fields))}")
    return EngineConfig(**kw)


__all__ = ["ENGINES", "EngineConfig", "Replay", "engine_config", "replay"]
