"""The texts of rejected actions (ActionError): which request, which GPU, when, and why. Cold code,
kept out of the event kernel; the kernel calls these only once its fast checks have failed."""

from __future__ import annotations

from fluidopt.control.protocol import DECODE, PREFILL, WAIT_DECODE, WAIT_PREFILL
from fluidopt.errors import ActionError

__all__ = ["PHASE_NAMES", "decode_error", "prefill_error"]

GONE = 4  # the phase of a freed request slot (engine._GONE)
PHASE_NAMES = {WAIT_PREFILL: "waiting for a prefill", PREFILL: "in prefill", WAIT_DECODE: "waiting for a decode",
               DECODE: "decoding", GONE: "not in the system"}


def prefill_error(eng, r: object, g: object) -> None:
    """Raise the ActionError that explains why ``start_prefill(r, g)`` is impossible."""
    w = f"start_prefill(r={r!r}, g={g!r}) at t={eng._now:.9g}"
    eng._check_req(w, r)
    eng._check_gpu(w, g)
    ph = eng.r_phase[r]  # type: ignore[index]
    if ph != WAIT_PREFILL:
        raise ActionError(f"{w}: request {r} is {PHASE_NAMES[ph]}, not waiting for a prefill")
    if not eng.g_pok[g]:  # type: ignore[index]
        raise ActionError(f"{w}: GPU {g} does not take prefills (pool {eng.g_pool[g]}, set in setup)")  # type: ignore[index]
    if eng.g_pre[g] >= 0:  # type: ignore[index]
        raise ActionError(f"{w}: GPU {g} already runs a prefill (request {eng.g_pre[g]})")  # type: ignore[index]
    raise ActionError(f"{w}: GPU {g} has no free slot ({eng.g_cnt[g]} of B={eng.B} in use)")  # type: ignore[index]



def decode_error(eng, r: object, g: object) -> None:
    """Raise the ActionError that explains why ``start_decode(r, g)`` is impossible."""
    w = f"start_decode(r={r!r}, g={g!r}) at t={eng._now:.9g}"
    eng._check_req(w, r)
    eng._check_gpu(w, g)
    ph = eng.r_phase[r]  # type: ignore[index]
    if ph != WAIT_DECODE:
        raise ActionError(f"{w}: request {r} is {PHASE_NAMES[ph]}, not waiting for a decode")
    if eng.g_cnt[g] >= eng.B:  # type: ignore[index]
        raise ActionError(f"{w}: GPU {g} has no free slot ({eng.g_cnt[g]} of B={eng.B} in use)")  # type: ignore[index]
    raise ActionError(
        f"{w}: GPU {g} already runs {eng.g_ndec[g]} decodes, its cap (max_decodes={eng.g_maxd[g]}, set in setup)"  # type: ignore[index]
    )

