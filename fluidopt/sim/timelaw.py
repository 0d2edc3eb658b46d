"""The generalised iteration-time law in the tokens-mode kernel (docs/simulator.md section 1.3): the
mathematics, as pure functions, that the kernel calls only when the scenario's GPU carries a
``timemodel`` (:class:`fluidopt.calibration.timemodels.IterationLaw`).

Between two events nothing on a GPU changes but its clock: the decodes' context grows by one token per
decode per iteration, and a chunked prefill moves on by one chunk. So the length of the m-th iteration after
the anchor is linear in m, ``t_itl + l_q * m``, and the kernel's closed form of the time of boundary ``ka + m``
(``t_ta + m * t_itl + l_q * m (m - 1) / 2``, less ``l_last`` at the boundary where a partial last chunk ends)
needs only the three numbers :func:`iteration` derives from the GPU's state at its anchor (the kernel's
``_law_set``, at every rescheduling; moving the anchor by m iterations adds ``l_q * m`` to ``t_itl``).
"""

from __future__ import annotations

__all__ = ["iteration", "law_coefficients", "min_service_time"]


def law_coefficients(law, chunk: int) -> tuple:
    """The flat tuple :func:`iteration` reads: prefill (a, b, c), decode small and large triples, the batch size
    from which the large one holds (large None: never), and the chunk C (tokens)."""
    d = law.decode
    return (law.prefill.a, law.prefill.b, law.prefill.c, tuple(d.small), d.large, int(d.threshold), int(chunk))


def iteration(coef: tuple, nd: int, kv: int, ptok: int, w: int, adv: int, left: int, swap: float):
    """GPU g's law from its state at its anchor: ``(itl, q, last)``, where the m-th iteration from the anchor
    (m = 0, 1, ...) takes ``itl + q m`` seconds and a partial last chunk ``last`` seconds less than a whole one.

    ``coef``: :func:`law_coefficients`; ``nd``: decodes on the GPU; ``kv``: KV tokens resident at the anchor
    (the decodes' context plus the prefill's reservation); ``ptok``: that reservation (prompt + regenerated
    tokens), -1 without a prefill; ``w``: the tokens the prefill computes (the cached prefix is read, not
    computed), -1 for a restore from host memory; ``adv``: 0 while a whole-prompt prefill stalls the decodes;
    ``left``: the prefill's iterations still to run, the one starting at the anchor included; ``swap``:
    seconds per token of a restore (the fleet's ``kv_swap_time_per_token``)."""
    pa, pb, pc, small, large, th, C = coef
    ad, bd, cd = large if (large is not None and nd >= th) else small
    if ptok < 0:  # decodes only: a + b T + c B, T growing by B tokens per iteration
        return ad + bd * kv + cd * nd, bd * nd, 0.0
    dec = bd * (kv - ptok) + cd * nd if nd else 0.0  # the decodes' variable terms (the intercept is paid once)
    if not adv:  # one whole-prompt iteration (or restore) while the decodes stall
        if w < 0:
            sw = swap * ptok
            return (sw if sw > 0 else ad), 0.0, 0.0
        o = ptok - w
        return pa + pb * w + pc * ((o + w) * (o + w) - o * o), 0.0, 0.0
    if w < 0:  # a restore in chunk-sized iterations beside the decodes
        return pa + pb * C + dec, bd * nd, 0.0
    # chunk j (0-based) of C tokens over a cached prefix of s = o + j C tokens pays c ((s + C)^2 - s^2)
    n = -(-w // C)
    o = ptok - w
    s = o + (n - left) * C
    lw = w - (n - 1) * C  # the last chunk's tokens
    sl = o + (n - 1) * C
    last = pb * (C - lw) + pc * ((sl + C) * (sl + C) - (sl + lw) * (sl + lw))
    return pa + pb * C + pc * (2 * s * C + C * C) + dec, 2 * pc * C * C + bd * nd, last


def min_service_time(law, chunk: int, chunked: bool, prompt, output):
    """Seconds each request needs alone on a GPU under ``law``: its prefill (the chunks' sum telescopes to
    ``n a + b P + c P^2`` for n chunks) plus ``output`` decode-only iterations of one request whose context
    grows from P by one token each."""
    import numpy as np

    P = np.asarray(prompt, dtype=float)
    D = np.asarray(output, dtype=float)
    pa, pb, pc = law.prefill.a, law.prefill.b, law.prefill.c
    n = np.ceil(P / chunk) if chunked else 1.0
    ad, bd, cd = law.decode.coefficients(1)
    return n * pa + pb * P + pc * P * P + D * (ad + cd) + bd * (D * P + D * (D - 1) / 2)
