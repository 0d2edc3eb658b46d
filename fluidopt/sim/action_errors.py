"""The texts of rejected actions (ActionError): which request, which GPU, when, and why. Cold code,
kept out of the event kernel; the kernel calls these only once its fast checks have failed."""

from __future__ import annotations

from fluidopt.control.protocol import DECODE, PREFILL, WAIT_DECODE, WAIT_PREFILL
from fluidopt.errors import ActionError

__all__ = ["PHASE_NAMES", "check_gpu", "check_req", "decode_error", "enqueue_error", "kv_error", "kv_overflow_error",
           "prefill_error"]

GONE = 4  # the phase of a freed request slot (engine._GONE)
PHASE_NAMES = {WAIT_PREFILL: "waiting for a prefill", PREFILL: "in prefill", WAIT_DECODE: "waiting for a decode",
               DECODE: "decoding", GONE: "not in the system"}


def check_gpu(eng, what: str, g: object) -> None:
    """ActionError unless g is a GPU id."""
    if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < eng.n:
        raise ActionError(f"{what}: GPU {g!r} does not exist (expected an integer in 0..{eng.n - 1})")


def check_req(eng, what: str, r: object) -> None:
    """ActionError unless r is a request in the system."""
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < len(eng.r_phase) or eng.r_phase[r] == GONE:
        raise ActionError(f"{what}: request {r!r} is not in the system at t={eng._now:.9g}")


def prefill_error(eng, r: object, g: object) -> None:
    """Raise the ActionError that explains why ``start_prefill(r, g)`` is impossible."""
    w = f"start_prefill(r={r!r}, g={g!r}) at t={eng._now:.9g}"
    check_req(eng, w, r)
    check_gpu(eng, w, g)
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
    check_req(eng, w, r)
    check_gpu(eng, w, g)
    ph = eng.r_phase[r]  # type: ignore[index]
    if ph != WAIT_DECODE:
        raise ActionError(f"{w}: request {r} is {PHASE_NAMES[ph]}, not waiting for a decode")
    if eng.g_cnt[g] >= eng.B:  # type: ignore[index]
        raise ActionError(f"{w}: GPU {g} has no free slot ({eng.g_cnt[g]} of B={eng.B} in use)")  # type: ignore[index]
    raise ActionError(
        f"{w}: GPU {g} already runs {eng.g_ndec[g]} decodes, its cap (max_decodes={eng.g_maxd[g]}, set in setup)"  # type: ignore[index]
    )



def enqueue_error(eng, r: object, q: object) -> None:
    """Raise the ActionError that explains why ``enqueue(r, q)`` is impossible."""
    w = f"enqueue(r={r!r}, q={q!r}) at t={eng._now:.9g}"
    check_req(eng, w, r)
    n = len(eng.q_tot)
    if isinstance(q, bool) or not isinstance(q, int) or not 0 <= q < n:
        raise ActionError(f"{w}: queue {q!r} does not exist (expected 0..{n - 1})")
    raise ActionError(f"{w}: request {r} is {PHASE_NAMES[eng.r_phase[r]]}, not waiting")  # type: ignore[index]


def kv_error(eng, g: int, t: float, tokens: int, r: int, prefill: bool) -> None:
    """Raise the ActionError for work whose KV cache does not fit on GPU g."""
    action, what = ("start_prefill", "the prompt") if prefill else ("start_decode", "the request's context")
    raise ActionError(f"{action}(r={r}, g={g}) at t={t:.9g}: GPU {g} has {eng.kvcap - eng.t_kv[g]} free KV "
                      f"tokens, {what} needs {tokens}")


def kv_overflow_error(g: int, t: float, guard: int) -> None:
    """Raise the ActionError for a GPU whose KV cache still overflows after many preemptions."""
    raise ActionError(f"GPU {g} at t={t:.9g}: KV overflow persists after {guard} preemptions; the controller "
                      "re-admits work on the GPU it was evicted from (do not start work from on_preempt)")
