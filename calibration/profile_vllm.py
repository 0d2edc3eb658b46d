"""Measure iteration times of a serving engine, for ``fluidopt calibrate``.

The measuring loop is engine-agnostic: :func:`profile_iterations` takes a callable
``step(chunk_tokens, decodes) -> seconds`` that runs ONE engine iteration with a prefill chunk of
``chunk_tokens`` tokens (0: decode-only) next to ``decodes`` running decode streams, and returns its
wall time. It randomises the order of the measurements (seeded) so that slow drift (thermal
throttling, growing contexts) does not masquerade as a chunk-size effect, discards warm-up
iterations, and returns the raw-measurement table documented in README.md.

:class:`VLLMStepper` is such a callable for vLLM (needs ``pip install vllm`` and a GPU; written
against the ``LLMEngine`` API of vLLM 0.11 and NOT exercised by fluidopt's tests, which drive the
loop with :class:`FakeEngine`). The library never imports this module.

Usage::

    python -m fluidopt.profiles.profile_vllm --model Qwen/Qwen3-8B --batch 16 \\
        --chunks 32,64,128,256,512,1024 --repeats 20 --solo-repeats 40 --out a100-qwen8b.csv
    python -m fluidopt.profiles.profile_vllm --fake 0.0174,6.2e-5,0.022 --out dry-run.csv  # no GPU
    fluidopt calibrate a100-qwen8b.csv --plot fit.png
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

StepFn = Callable[[int, int], float]


def measurement_plan(
    chunks: Sequence[int],
    *,
    decodes: int,
    repeats: int,
    solo_repeats: int = 0,
    solo_decodes: int | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """The (chunk_tokens, decodes, mode) of every measurement, in a seeded random order.

    ``repeats`` mixed iterations per chunk size with ``decodes`` decode streams, plus
    ``solo_repeats`` decode-only iterations with ``solo_decodes`` streams (default ``decodes + 1``:
    a solo GPU uses the slot a prefill would take).
    """
    chunks = [int(c) for c in chunks]
    if not chunks or any(c <= 0 for c in chunks):
        raise ValueError(f"chunks: expected positive chunk sizes (tokens), got {chunks!r}")
    if repeats < 1:
        raise ValueError(f"repeats: expected an integer >= 1, got {repeats!r}")
    if decodes < 0 or solo_repeats < 0:
        raise ValueError("decodes and solo_repeats must be >= 0")
    solo_decodes = decodes + 1 if solo_decodes is None else solo_decodes
    rows = [(c, decodes, "mixed") for c in chunks for _ in range(repeats)]
    rows += [(0, solo_decodes, "solo") for _ in range(solo_repeats)]
    order = np.random.default_rng(seed).permutation(len(rows))
    plan = pd.DataFrame([rows[i] for i in order], columns=["chunk_tokens", "decodes", "mode"])
    plan["mode"] = plan["mode"].astype(object)
    return plan


def profile_iterations(
    step: StepFn,
    chunks: Sequence[int],
    *,
    decodes: int = 15,
    repeats: int = 10,
    solo_repeats: int = 20,
    solo_decodes: int | None = None,
    warmup: int = 3,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """Run the measurement plan against ``step`` and return the raw table.

    ``warmup`` iterations (at the largest chunk, so that kernels for it are compiled/captured)
    run first and are discarded. Columns: chunk_tokens, iteration_seconds, decodes, mode, in
    measurement order. A step that returns a non-positive or non-finite time raises ValueError.
    """
    plan = measurement_plan(
        chunks, decodes=decodes, repeats=repeats, solo_repeats=solo_repeats, solo_decodes=solo_decodes, seed=seed
    )
    for _ in range(warmup):
        step(max(int(c) for c in chunks), decodes)
    times = np.empty(len(plan))
    for k, (c, d) in enumerate(zip(plan["chunk_tokens"], plan["decodes"])):
        t = float(step(int(c), int(d)))
        if not math.isfinite(t) or t <= 0:
            raise ValueError(f"step({int(c)}, {int(d)}) returned {t!r}; expected a positive time in seconds")
        times[k] = t
        if progress is not None:
            progress(k + 1, len(plan))
    out = plan.assign(iteration_seconds=times)
    return out[["chunk_tokens", "iteration_seconds", "decodes", "mode"]]


class FakeEngine:
    """A stand-in engine: ``step`` returns the law's time with multiplicative Gaussian noise.

    Mixed: ``(alpha + beta * chunk + kv_time_per_token * context) * (1 + rel_noise * Z)``;
    decode-only: ``tau_solo * (...)``. Deterministic in ``seed``. ``calls`` counts steps (so tests
    can see warm-up iterations).
    """

    def __init__(
        self, alpha: float, beta: float, tau_solo: float, *, rel_noise: float = 0.01, seed: int = 0,
        kv_time_per_token: float = 0.0, context_per_decode: float = 0.0,
    ) -> None:
        self.alpha, self.beta, self.tau_solo = alpha, beta, tau_solo
        self.rel_noise = rel_noise
        self.kv_time_per_token = kv_time_per_token
        self.context_per_decode = context_per_decode
        self._rng = np.random.default_rng(seed)
        self.calls = 0

    def __call__(self, chunk_tokens: int, decodes: int) -> float:
        self.calls += 1
        base = self.tau_solo if chunk_tokens == 0 else self.alpha + self.beta * chunk_tokens
        base += self.kv_time_per_token * self.context_per_decode * decodes
        return float(base * (1.0 + self.rel_noise * self._rng.standard_normal()))


class VLLMStepper:  # pragma: no cover - needs vllm and a GPU
    """``step(chunk_tokens, decodes)`` against a local vLLM ``LLMEngine`` (untested here).

    Keeps ``decodes`` long-running decode requests alive (``ignore_eos``), then times one
    ``engine.step()`` after adding a prompt of exactly ``chunk_tokens`` random tokens with
    ``max_tokens = 1``. The token budget ``max_num_batched_tokens`` is set to the largest chunk plus
    the batch size, so the whole chunk is prefilled in that single step. Decoders whose context
    passes ``max_context`` tokens are replaced, to keep the decode cost from drifting.
    Caveat: vLLM does not report the composition of a step; check with its logs that a timed
    step held the chunk and the decodes you asked for.
    """

    def __init__(
        self, model: str, *, batch: int = 16, max_chunk: int = 1024, max_context: int = 2048,
        seed: int = 0, **engine_kwargs: Any,
    ) -> None:
        from vllm import EngineArgs, LLMEngine, SamplingParams

        args = EngineArgs(
            model=model,
            enable_chunked_prefill=True,
            enable_prefix_caching=False,  # a cached prefix would shrink the measured chunk
            max_num_seqs=batch,
            max_num_batched_tokens=max_chunk + batch,
            seed=seed,
            **engine_kwargs,
        )
        self.engine = LLMEngine.from_engine_args(args)
        self._sp = SamplingParams
        self.max_context = max_context
        self._rng = np.random.default_rng(seed)
        self._vocab = 1000  # token ids drawn from [100, 100 + vocab): ordinary tokens in any tokenizer
        self._decoders: dict[str, int] = {}  # request id -> steps since it started decoding
        self._next = 0

    def _tokens(self, n: int) -> dict[str, list[int]]:
        return {"prompt_token_ids": [int(t) for t in 100 + self._rng.integers(0, self._vocab, n)]}

    def _rid(self, kind: str) -> str:
        self._next += 1
        return f"{kind}-{self._next}"

    def _set_decoders(self, n: int) -> None:
        stale = [r for r, k in self._decoders.items() if k + 8 >= self.max_context]
        if stale:
            self.engine.abort_request(stale)
            for r in stale:
                del self._decoders[r]
        extra = list(self._decoders)[n:]
        if extra:
            self.engine.abort_request(extra)
            for r in extra:
                del self._decoders[r]
        new = []
        while len(self._decoders) + len(new) < n:
            rid = self._rid("decode")
            sp = self._sp(max_tokens=10**6, ignore_eos=True, temperature=0.0)
            self.engine.add_request(rid, self._tokens(8), sp)
            new.append(rid)
        while new:  # run the short prompts through prefill so they are decoding when we time
            for out in self.engine.step():
                if out.request_id in new and out.outputs and len(out.outputs[0].token_ids) >= 1:
                    new.remove(out.request_id)
                    self._decoders[out.request_id] = 0

    def __call__(self, chunk_tokens: int, decodes: int) -> float:
        self._set_decoders(decodes)
        rid = None
        if chunk_tokens > 0:
            rid = self._rid("prefill")
            self.engine.add_request(rid, self._tokens(chunk_tokens), self._sp(max_tokens=1, temperature=0.0))
        t0 = time.perf_counter()
        self.engine.step()  # returns after the GPU work of the iteration is done (outputs are on CPU)
        dt = time.perf_counter() - t0
        for r in self._decoders:
            self._decoders[r] += 1
        if rid is not None:
            while self.engine.has_unfinished_requests() and any(
                o.request_id == rid and not o.finished for o in self.engine.step()
            ):
                pass
        return dt


def main(argv: Sequence[str] | None = None) -> int:
    from fluidopt.calibration import fit_iteration_time, write_measurements

    p = argparse.ArgumentParser(prog="profile_vllm", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", help="model to load in vLLM (needs vllm and a GPU)")
    g.add_argument("--fake", metavar="ALPHA,BETA,TAU_SOLO", help="dry run against FakeEngine with this law")
    p.add_argument("--chunks", default="32,64,128,192,256,384,512,768,1024", help="comma-separated chunk sizes")
    p.add_argument("--batch", type=int, default=16, help="B, requests per GPU (mixed rows run B-1 decodes)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--solo-repeats", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="CSV file to write")
    a = p.parse_args(argv)
    chunks = [int(c) for c in a.chunks.split(",") if c.strip()]
    if a.fake:
        alpha, beta, tau_solo = (float(v) for v in a.fake.split(","))
        step: StepFn = FakeEngine(alpha, beta, tau_solo, seed=a.seed)
        what = f"FakeEngine(alpha={alpha}, beta={beta}, tau_solo={tau_solo}) - SYNTHETIC"
    else:
        step = VLLMStepper(a.model, batch=a.batch, max_chunk=max(chunks), seed=a.seed)
        import vllm

        what = f"vLLM {vllm.__version__}, model {a.model}"
    df = profile_iterations(
        step, chunks, decodes=a.batch - 1, repeats=a.repeats, solo_repeats=a.solo_repeats,
        solo_decodes=a.batch, warmup=a.warmup, seed=a.seed,
    )
    comment = (
        f"Measured by fluidopt.profiles.profile_vllm on {time.strftime('%Y-%m-%d %H:%M')}: {what}\n"
        f"batch B = {a.batch}; mixed rows run B-1 = {a.batch - 1} decodes, solo rows B; seed {a.seed}"
    )
    write_measurements(df, a.out, comment=comment)
    print(fit_iteration_time(a.out).summary())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
