"""The generalised iteration-time law in the tokens-mode kernel (docs/simulator.md section 1.3): cold code
bound to the kernel as ``Engine._law_refresh`` and called only when the scenario's GPU carries a
``timemodel`` (:class:`fluidopt.calibration.timemodels.IterationLaw`).

Between two events nothing on a GPU changes but its clock: the decodes' context grows by one token per
decode per iteration, and a chunked prefill moves on by one chunk. So the length of the m-th iteration after
the anchor is linear in m, ``t_itl + l_q * m``, and the kernel's closed form of the time of boundary ``ka + m``
(``t_ta + m * t_itl + l_q * m (m - 1) / 2``, less ``l_last`` at the boundary where a partial last chunk ends)
needs only the three numbers :func:`refresh` sets from the GPU's state at its anchor.
"""

from __future__ import annotations

__all__ = ["law_coefficients", "refresh", "min_service_time"]


def law_coefficients(law, chunk: int) -> tuple:
    """The flat tuple the kernel's refresh reads: prefill (a, b, c), decode small and large triples, the
    batch size from which the large one holds (large None: never), and the chunk C (tokens)."""
    d = law.decode
    large = d.large if d.large is not None else None
    return (law.prefill.a, law.prefill.b, law.prefill.c, tuple(d.small), large, int(d.threshold), int(chunk))


def refresh(eng, g: int) -> None:
    """Set GPU g's iteration law from its state at its anchor: ``t_itl[g]``, the first iteration's seconds;
    ``l_q[g]``, how many seconds each later iteration adds; ``l_last[g]``, what a partial last chunk saves."""
    pa, pb, pc, small, large, th, C = eng._lawc
    nd = eng.g_ndec[g]
    ad, bd, cd = large if (large is not None and nd >= th) else small
    kv = eng.t_kv[g]
    r = eng.g_pre[g]
    last = 0.0
    if r < 0:  # decodes only: a + b T + c B, T growing by B tokens per iteration
        itl = ad + bd * kv + cd * nd
        q = bd * nd
    else:
        ptok = eng.r_prompt[r] + eng.r_gen[r]  # the prefill's KV reservation, in kv beside the decodes' context
        dec = bd * (kv - ptok) + cd * nd if nd else 0.0  # the decodes' variable terms (the intercept is paid once)
        w = eng.l_w[g]  # tokens the prefill computes (the cached prefix is read, not computed); -1: a restore
        if not eng.t_adv[g]:  # one whole-prompt iteration (or restore) while the decodes stall
            if w < 0:
                sw = eng._swap * ptok
                itl = sw if sw > 0 else ad
            else:
                o = ptok - w
                itl = pa + pb * w + pc * ((o + w) * (o + w) - o * o)
            q = 0.0
        elif w < 0:  # a restore from host memory in chunk-sized iterations beside the decodes
            itl = pa + pb * C + dec
            q = bd * nd
        else:  # chunk j (0-based) of C tokens over a cached prefix of s = o + j C tokens: c ((s + C)^2 - s^2)
            n = -(-w // C)
            o = ptok - w
            s = o + (n - (eng.t_pend[g] - eng.t_ka[g])) * C
            itl = pa + pb * C + pc * (2 * s * C + C * C) + dec
            q = 2 * pc * C * C + bd * nd
            lw = w - (n - 1) * C  # the last chunk's tokens
            sl = o + (n - 1) * C
            last = pb * (C - lw) + pc * ((sl + C) * (sl + C) - (sl + lw) * (sl + lw))
    eng.t_itl[g] = itl
    eng.l_q[g] = q
    eng.l_last[g] = last


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
