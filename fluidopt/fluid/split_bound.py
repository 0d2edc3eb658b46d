"""The single-class closed form of the disaggregated fluid steady state (issue 44, point 2's acceptance):
the fewest prefill and decode instances that carry ``rate`` requests/s of one class, from the time
model, the KV limit and the TTFT and TPOT bounds. The disaggregated LP must equal it on one class.

The fluid view (every quantity a long-run mean; docs/fidelity.md, "The single-class closed form"):

* **Prefill**: an instance runs batches of ``m`` prompts of ``l`` tokens, each batch taking
  ``t_p(m) = a + b m l + c m l^2`` (s). Its throughput is ``m / t_p(m)`` requests/s, increasing in
  ``m``, so ``m`` is the largest whole number with ``m l <= max_tokens`` and ``t_p(m) <= ttft``
  (a batch must end within the TTFT bound). Prefill instances: ``rate * t_p(m) / m``.
* **Decode**: an instance holds ``B`` requests (real, a fluid mean), each needing ``o - 1`` steps
  (the first token comes from the prefill), with mean context ``l + o / 2`` tokens each. A step
  takes ``s(B) = a + b B (l + o/2) + c B`` (the law in force at ``B``). Its throughput is
  ``B / ((o - 1) s(B))``, increasing in ``B`` within each regime of the law, so ``B`` is, in the regime
  where that throughput is highest, the largest with ``s(B) <= tpot`` (the TPOT bound) and
  ``B (l + o/2) <= kv_tokens`` (the mean KV held fits). Decode instances:
  ``rate * (o - 1) * s(B) / B``.

Times in seconds, lengths and KV in tokens, rates in requests/s; instance counts are real (fluid).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fluidopt.calibration.timemodels import IterationLaw
from fluidopt.core.errors import InfeasibleError


@dataclass(frozen=True)
class SplitBound:
    """The closed form's answer. ``prefill_instances`` and ``decode_instances``: real counts;
    ``gpus``: ``prefill_instances * prefill_tp + decode_instances * decode_tp``; ``batch_prompts``:
    prompts per prefill batch; ``decode_batch``: requests per decode step; ``step``: its time (s);
    ``binding``: ``"kv"`` or ``"tpot"``, whichever limits the decode batch."""

    prefill_instances: float
    decode_instances: float
    gpus: float
    batch_prompts: int
    decode_batch: float
    step: float
    binding: str


def _decode_batch(law: IterationLaw, ctx: float, kv_tokens: float, tpot: float) -> tuple[float, str]:
    """The real B with s(B) <= tpot and B ctx <= kv_tokens that decodes the most requests per second,
    B / s(B). Within a regime B / s(B) grows with B, so each regime of the law (small below its threshold,
    large from it) is solved on its own range at its largest feasible B; across regimes the larger B
    need not be the faster one (a large-batch law with a higher fixed cost), so the regime whose
    B / s(B) is larger wins."""
    dec = law.decode
    kv_cap = kv_tokens / ctx if math.isfinite(kv_tokens) else math.inf
    regimes = [(dec.small, 0.0, math.inf if dec.large is None else float(dec.threshold))]
    if dec.large is not None:
        regimes.append((dec.large, float(dec.threshold), math.inf))
    best, why, speed = 0.0, "tpot", 0.0
    for (a, b, c), lo, hi in regimes:
        slope = b * ctx + c
        tp_cap = math.inf if slope <= 0 and tpot >= a else ((tpot - a) / slope if slope > 0 else -math.inf)
        cap = min(kv_cap, tp_cap, hi)
        if cap < max(lo, 0.0) or cap <= 0:
            continue
        if cap == hi and hi < math.inf:
            cap = math.nextafter(hi, 0.0)  # just below the threshold, still the small law
        v = cap / (a + slope * cap)
        if v > speed:
            best, why, speed = cap, ("kv" if kv_cap <= tp_cap else "tpot"), v
    return best, why


def min_instances(rate: float, prompt: float, output: float, prefill: IterationLaw, decode: IterationLaw, *,
                  kv_tokens: float, ttft: float, tpot: float, max_tokens: int = 2048, prefill_tp: int = 1,
                  decode_tp: int = 1) -> SplitBound:
    """The fewest prefill and decode instances for ``rate`` requests/s of ``prompt``-token prompts and
    ``output``-token outputs (the module docstring). ``kv_tokens``: KV capacity of a decode instance
    (tokens); ``ttft``/``tpot``: bounds (s). Raises :class:`InfeasibleError` when no batch meets them."""
    if not (rate >= 0 and prompt >= 1 and output >= 2):
        raise ValueError("min_instances: expected rate >= 0, prompt >= 1 and output >= 2 tokens")
    pf = prefill.prefill
    per = pf.b * prompt + pf.c * prompt * prompt
    m_tok = math.floor(max_tokens / prompt)
    m_ttft = math.floor((ttft - pf.a) / per) if per > 0 else m_tok
    m = min(m_tok, m_ttft)
    if m < 1:
        raise InfeasibleError(f"a prefill batch of one {prompt:g}-token prompt takes {pf.a + per:.4g} s, over the "
                              f"TTFT bound {ttft:g} s (or the prompt exceeds {max_tokens} tokens)")
    t_p = pf.a + m * per
    ctx = prompt + output / 2
    B, why = _decode_batch(decode, ctx, kv_tokens, tpot)
    if B <= 0:
        raise InfeasibleError(f"no decode batch meets TPOT <= {tpot:g} s with {kv_tokens:g} KV tokens")
    a, b, c = decode.decode.coefficients(B)  # type: ignore[arg-type]  # a real (fluid) batch
    step = a + b * B * ctx + c * B
    n_p = rate * t_p / m
    n_d = rate * (output - 1) * step / B
    return SplitBound(n_p, n_d, n_p * prefill_tp + n_d * decode_tp, m, B, step, why)
