"""The engine's side of a rejected action (ActionError): the facts of its state, handed to the checks of
:mod:`fluidopt.control.action_errors`, which hold the conditions and the texts for every Context (the
snapshot of a real router says the same words). Cold code, kept out of the event kernel; the kernel
calls these only once its fast checks have failed."""

from __future__ import annotations

from fluidopt.control import action_errors as _ae
from fluidopt.control.action_errors import GONE, PHASE_NAMES
from fluidopt.core.errors import ActionError

__all__ = ["GONE", "PHASE_NAMES", "check_gpu", "check_req", "decode_error", "enqueue_error", "kv_error",
           "kv_overflow_error", "prefill_error"]


def check_gpu(eng, what: str, g: object) -> None:
    """ActionError unless g is a GPU id."""
    _ae.check_gpu(what, g, eng.n)


def check_req(eng, what: str, r: object) -> None:
    """ActionError unless r is a request in the system."""
    _ae.check_request(what, r, eng._now, lambda r: 0 <= r < len(eng.r_phase) and eng.r_phase[r] != GONE)


def prefill_error(eng, r: object, g: object) -> None:
    """Raise the ActionError that explains why ``start_prefill(r, g)`` is impossible."""
    w = _ae.action("start_prefill", r, g, eng._now)
    check_req(eng, w, r)
    check_gpu(eng, w, g)
    _ae.check_prefill(w, r, g, phase=eng.r_phase[r], prefill_allowed=bool(eng.g_pok[g]), pool=eng.g_pool[g],  # type: ignore[index]
                      running=eng.g_pre[g], used=eng.g_cnt[g], batch=eng.B)  # type: ignore[index]
    raise ActionError(f"{w}: refused")  # unreachable: the engine's fast check is the conjunction of the above


def decode_error(eng, r: object, g: object) -> None:
    """Raise the ActionError that explains why ``start_decode(r, g)`` is impossible."""
    w = _ae.action("start_decode", r, g, eng._now)
    check_req(eng, w, r)
    check_gpu(eng, w, g)
    _ae.check_decode(w, r, g, phase=eng.r_phase[r], used=eng.g_cnt[g], batch=eng.B,  # type: ignore[index]
                     decodes=eng.g_ndec[g], max_decodes=eng.g_maxd[g])  # type: ignore[index]
    raise ActionError(f"{w}: refused")  # unreachable, as above


def enqueue_error(eng, r: object, q: object) -> None:
    """Raise the ActionError that explains why ``enqueue(r, q)`` is impossible."""
    w = _ae.action("enqueue", r, q, eng._now, key="q")
    check_req(eng, w, r)
    _ae.check_queue(w, q, len(eng.q_tot))
    _ae.check_enqueue(w, r, eng.r_phase[r])  # type: ignore[index]
    raise ActionError(f"{w}: refused")  # unreachable, as above


def kv_error(eng, g: int, t: float, tokens: int, r: int, prefill: bool) -> None:
    """Raise the ActionError for work whose KV cache does not fit on GPU g."""
    raise _ae.kv_refused(r, g, t, eng.kvcap - eng.t_kv[g], tokens, prefill)


def kv_overflow_error(g: int, t: float, guard: int) -> None:
    """Raise the ActionError for a GPU whose KV cache still overflows after many preemptions."""
    raise _ae.kv_overflow(g, t, guard)
