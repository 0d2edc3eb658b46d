"""The many-server kernel on a measured run: one GPU replays the run's own arrivals and lengths under an
iteration-time law, as the per-instance engines of :mod:`fluidopt.engines` do, so that the simulator a planner
runs meets the same real engine (docs/fidelity.md, "The many-server simulator on the same runs";
``fluidopt validate --many-server``).

The kernel keeps its own scheduler (docs/simulator.md sections 1.1 and 1.3): one prefill per GPU at a time,
whole prompts prefill first (``--engine vllm``) or one chunk of C tokens beside the decodes (``--engine
paper``); the per-instance ``chunked`` scheduler, whose token budget the decodes share, has no kernel
counterpart. A real engine's prefill iteration emits the first token, the kernel's none: each request decodes
its output less the first token (at least one), and its first token is its prefill's completion (so its
decodes' context counts its prompt and the tokens they made, one token less than the engine's: ``b_d`` per
step). A one-token request's finish is then its first token (the kernel still runs its one decode step, a slot
for an iteration).
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from fluidopt.calibration.timemodels import IterationLaw
from fluidopt.core.errors import UsageError
from fluidopt.engines.stepper import EngineConfig, Replay, checked_requests

__all__ = ["replay_on_kernel"]


def replay_on_kernel(law: IterationLaw, cfg: EngineConfig, arrival, prompt, output, *,
                     backend: str = "auto") -> Replay:
    """Replay requests (arrival s, prompt and output tokens) on one GPU of the many-server kernel with ``law`` as
    its ``timemodel``: round robin over one instance, ``cfg.max_num_seqs`` slots, ``cfg``'s KV blocks as its KV
    capacity with vLLM's watermark, prompts beyond ``cfg.max_model_len`` rejected (NaN times, as the engine);
    ``cfg.mode`` ``prefill-first`` runs whole prompts, ``mixed`` without decodes in the budget runs chunks of
    ``cfg.max_num_batched_tokens``. The outcome in the per-instance engines' :class:`Replay`."""
    from fluidopt.control.instance import RoundRobin
    from fluidopt.core.model import GPUProfile, RequestClass, Scenario
    from fluidopt.sim.api import simulate
    from fluidopt.workloads import TraceWorkload

    if cfg.mode == "mixed" and cfg.budget_counts_decodes:
        raise UsageError("--many-server: the kernel runs one prefill chunk beside the decodes (--engine paper) or "
                         "whole prompts (--engine vllm); a token budget the decodes share (--engine chunked) has no "
                         "kernel counterpart")
    arr, P, O = checked_requests(arrival, prompt, output)
    P, O = np.asarray(P, dtype=np.int64), np.asarray(O, dtype=np.int64)
    chunked = cfg.mode == "mixed"
    limit = cfg.max_model_len or np.inf
    keep = np.flatnonzero(P <= limit)
    first = np.full(len(arr), np.nan)
    finish = np.full(len(arr), np.nan)
    pre = np.zeros(len(arr), dtype=np.int64)
    if keep.size:
        chunk = cfg.max_num_batched_tokens if chunked else int(max(P[keep].max(), 1))
        kv = None if cfg.kv_blocks is None else float(cfg.kv_blocks * cfg.block_size)
        # (alpha, beta, tau_solo: placeholders from the law; the kernel times every iteration with the law)
        gpu = GPUProfile(alpha=law.prefill.a, beta=law.prefill.b, tau_solo=max(law.decode.small[0], 1e-9),
                         chunk=chunk, batch=cfg.max_num_seqs, kv_capacity=kv, timemodel=law)
        sc = Scenario(gpu=gpu, gpus=1, classes=(RequestClass("measured", prompt=float(P[keep].mean()),
                                                             decode=float(O[keep].mean()), rate=1.0),),
                      prefill_price=0.0, decode_price=0.0, name="measured")
        frame = pd.DataFrame({"time": arr[keep], "prompt": P[keep], "output": np.maximum(O[keep] - 1, 1), "cls": 0})
        with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the trace ends long before the horizon: intended
            path = Path(d) / "records.csv"
            simulate(sc, RoundRobin(chunked=chunked, kv_watermark=cfg.watermark),
                     horizon=float(arr[keep][-1]) + 1e6, service="tokens", workload=TraceWorkload(frame, ("measured",)),
                     records=path, progress=False, batches=2, backend=backend)
            rec = pd.read_csv(path).sort_values("id")
        done = rec.outcome.to_numpy() == "completed"
        t0 = rec.arrival.to_numpy() + rec.ttft.to_numpy()
        first[keep] = np.where(done, t0, np.nan)
        finish[keep] = np.where(done, np.where(O[keep] > 1, rec.end.to_numpy(), t0), np.nan)
        pre[keep] = rec.preemptions.to_numpy()
    return Replay(arrival=arr, first_token=first, finish=finish, preemptions=pre, output=O, iterations=0,
                  prefill_iterations=0)
