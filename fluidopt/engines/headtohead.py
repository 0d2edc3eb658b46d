"""WAIT, Nested WAIT, vLLM-style and Sarathi-style batching on one instance, with paired confidence
intervals (common random numbers: every policy replays the same arrivals and lengths per seed).

* :func:`vidur_law`: an :class:`~fluidopt.calibration.timemodels.IterationLaw` composed from Vidur's
  operator profiles (:func:`fluidopt.calibration.vidur.iteration_time`): prefill ``a + b l + c l^2``
  fitted on single prompts of 32..4096 tokens, decode ``a + b T + c B`` on 1..256 decodes of
  64..4096 context tokens each, least squares on relative error;
* :func:`head_to_head`: throughput (completions per second between the warm-up and the last arrival,
  so in overload it is the service rate), mean end-to-end latency and mean TTFT (s) of each policy
  at each rate, and the paired difference of each policy against ``vllm`` with a Student t interval.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.core.errors import ScenarioError

__all__ = ["POLICIES", "Cell", "head_to_head", "run_policy", "vidur_law"]

POLICIES = ("vllm", "sarathi", "wait", "nested-wait")


def vidur_law(data_dir, gpu: str = "a100", model: str = "meta-llama/Llama-2-7b-hf", tp: int = 1):
    """(law, KV capacity in tokens, worst relative error of the fit on its own grid)."""
    from fluidopt.calibration import vidur

    t = vidur.read_operator_table(data_dir, gpu, model, tp)
    lp = np.arange(32, 4097, 32, dtype=float)
    yp = vidur.iteration_time(t, lp, 0.0)
    Xp = np.column_stack([np.ones_like(lp), lp, lp * lp]) / yp[:, None]
    cp = np.linalg.lstsq(Xp, np.ones_like(lp), rcond=None)[0]
    B, ctx = np.meshgrid(np.arange(1, 257, 5, dtype=float), np.arange(64, 4097, 128, dtype=float))
    B, ctx = B.ravel(), ctx.ravel()
    yd = vidur.iteration_time(t, 0.0, B, ctx)
    Xd = np.column_stack([np.ones_like(B), B * ctx, B]) / yd[:, None]
    cd = np.linalg.lstsq(Xd, np.ones_like(B), rcond=None)[0]
    cp, cd = np.maximum(cp, 0.0), np.maximum(cd, 0.0)
    law = IterationLaw(PrefillLaw(*map(float, cp)), DecodeLaw(tuple(map(float, cd))), name=f"{gpu}-{model}-tp{tp}")
    err = max(float(np.max(np.abs(Xp @ cp - 1))), float(np.max(np.abs(Xd @ cd - 1))))
    return law, float(vidur.kv_capacity(t)), err


def run_policy(policy: str, law: IterationLaw, kv: float, arr, p, o, *, wait_params: dict):
    """The per-request :class:`~fluidopt.engines.stepper.Replay` of one policy. ``wait_params``:
    ``total_limit`` (requests), the request types' ``outputs`` (tokens) and ``rates`` (requests/s)
    that WAIT and Nested WAIT split it by, and ``batch_cap``: vLLM-style's and Sarathi-style's
    ``max_num_seqs`` (default ``total_limit``: the authors ran them at the batch size their Nested
    WAIT reached, results_analysis/test31 to test33)."""
    from fluidopt.engines import engine_config, replay
    from fluidopt.engines.wait import nested_wait_policy, replay_wait, wait_policy

    w = wait_params
    cap = int(w.get("batch_cap") or w["total_limit"])
    if policy == "vllm":
        return replay(law, engine_config("vllm", kv_tokens=int(kv), max_model_len=None, max_num_seqs=cap,
                                         max_num_batched_tokens=max(2048, int(np.max(p)))), arr, p, o)
    if policy == "sarathi":
        return replay(law, engine_config("chunked", kv_tokens=int(kv), max_num_seqs=cap), arr, p, o)
    if policy in ("wait", "nested-wait"):
        make = wait_policy if policy == "wait" else nested_wait_policy
        pol = make(w["total_limit"], w["outputs"], w["rates"], memory=kv, buffer=w.get("buffer", 0.0))
        return replay_wait(law, pol, arr, p, o).replay
    raise ScenarioError(f"policy {policy!r}: expected one of {', '.join(POLICIES)}")


@dataclass(frozen=True)
class Cell:
    """One policy at one rate over the seeds: per-seed metrics and the paired difference to vLLM-style
    (mean and 95% half-width, same units)."""

    policy: str
    rate: float
    throughput: np.ndarray  # requests/s per seed
    tokens: np.ndarray  # output tokens/s per seed (requests finished in the window)
    preemptions: np.ndarray  # per request, per seed (vLLM-style only; 0 for the others)
    e2e: np.ndarray  # mean s per seed
    ttft: np.ndarray  # mean s per seed
    diff_throughput: tuple[float, float]
    diff_e2e: tuple[float, float]


def _paired(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    from scipy.stats import t

    d = x - y
    if d.size < 2:
        return float(d.mean()), float("nan")
    return float(d.mean()), float(t.ppf(0.975, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size))


def head_to_head(law: IterationLaw, kv: float, rates, sample, *, seeds=range(5), requests: int = 4000,
                 warmup: float = 0.2, wait_params: dict, policies=POLICIES) -> list[Cell]:
    """Every policy at every rate (requests/s) for each seed; ``sample(n, seed) -> (prompt, output)``."""
    cells = []
    for rate in rates:
        res = {pol: ([], [], [], [], []) for pol in policies}
        for seed in seeds:
            rng = np.random.default_rng(seed)
            arr = np.cumsum(rng.exponential(1.0 / rate, requests))
            p, o = sample(requests, seed)
            horizon = float(arr[-1])
            start = warmup * horizon
            win = (arr >= start)
            for pol in policies:
                r = run_policy(pol, law, kv, arr, p, o, wait_params=wait_params)
                fin = r.finish
                ok = (fin > start) & (fin <= horizon)
                res[pol][0].append(np.count_nonzero(ok) / (horizon - start))
                res[pol][3].append(float(o[ok].sum()) / (horizon - start))
                res[pol][4].append(float(np.mean(r.preemptions)))
                res[pol][1].append(float(np.nanmean(r.e2e[win])))
                res[pol][2].append(float(np.nanmean(r.ttft[win])))
        base = np.asarray(res["vllm"][0]) if "vllm" in res else None
        base_e = np.asarray(res["vllm"][1]) if "vllm" in res else None
        for pol in policies:
            th, e2, tt, tok, pre = (np.asarray(v) for v in res[pol])
            dth = _paired(th, base) if base is not None else (float("nan"),) * 2
            de = _paired(e2, base_e) if base_e is not None else (float("nan"),) * 2
            cells.append(Cell(pol, float(rate), th, tok, pre, e2, tt, dth, de))
    return cells
