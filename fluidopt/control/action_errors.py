"""Why an action is refused: the conditions and texts of :class:`~fluidopt.core.errors.ActionError`, once.

Every :class:`~fluidopt.control.protocol.Context` validates a controller's actions with these checks:
the simulator engine (through :mod:`fluidopt.sim.action_errors`, which reads its typed arrays and is
called only once the engine's fast check has failed) and :class:`~fluidopt.control.snapshot.ClusterSnapshot`
(a real router's view). Each check takes the facts it judges as plain values, so both ask the same
questions in the same order and say the same words: which request, which GPU, when, and why.
"""

from __future__ import annotations

from collections.abc import Callable

from fluidopt.control.protocol import DECODE, PREFILL, WAIT_DECODE, WAIT_PREFILL
from fluidopt.core.errors import ActionError

__all__ = ["GONE", "PHASE_NAMES", "action", "check_decode", "check_enqueue", "check_gpu", "check_prefill",
           "check_queue", "check_request", "kv_refused", "kv_overflow"]

GONE = 4  # the phase of a request that is not in the system (the engine's freed request slot)
PHASE_NAMES = {WAIT_PREFILL: "waiting for a prefill", PREFILL: "in prefill", WAIT_DECODE: "waiting for a decode",
               DECODE: "decoding", GONE: "not in the system"}


def _is_id(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def action(name: str, r: object, x: object, now: float, key: str = "g") -> str:
    """The action as an error names it: ``start_prefill(r=3, g=7) at t=1.5``."""
    return f"{name}(r={r!r}, {key}={x!r}) at t={now:.9g}"


def check_gpu(what: str, g: object, n_gpus: int) -> None:
    """ActionError unless ``g`` is a GPU id (an integer in 0..n_gpus-1)."""
    if not _is_id(g) or not 0 <= g < n_gpus:  # type: ignore[operator]
        raise ActionError(f"{what}: GPU {g!r} does not exist (expected an integer in 0..{n_gpus - 1})")


def check_request(what: str, r: object, now: float, in_system: Callable[[int], bool]) -> None:
    """ActionError unless ``r`` is an integer and ``in_system(r)`` (a request in the system at ``now``, seconds)."""
    if not _is_id(r) or not in_system(r):  # type: ignore[arg-type]
        raise ActionError(f"{what}: request {r!r} is not in the system at t={now:.9g}")


def check_queue(what: str, q: object, n_queues: int) -> None:
    """ActionError unless ``q`` is a queue id (an integer in 0..n_queues-1)."""
    if not _is_id(q) or not 0 <= q < n_queues:  # type: ignore[operator]
        raise ActionError(f"{what}: queue {q!r} does not exist (expected 0..{n_queues - 1})")


def check_prefill(what: str, r: int, g: int, *, phase: int, prefill_allowed: bool, pool: int, running: int,
                  used: int, batch: int) -> None:
    """ActionError if request r (in ``phase``) cannot start its prefill on GPU g: g's pool forbids
    prefills, g already runs request ``running`` (>= 0), or ``used`` of its ``batch`` slots are taken."""
    if phase != WAIT_PREFILL:
        raise ActionError(f"{what}: request {r} is {PHASE_NAMES[phase]}, not waiting for a prefill")
    if not prefill_allowed:
        raise ActionError(f"{what}: GPU {g} does not take prefills (pool {pool}, set in setup)")
    if running >= 0:
        raise ActionError(f"{what}: GPU {g} already runs a prefill (request {running})")
    if used >= batch:
        raise ActionError(f"{what}: GPU {g} has no free slot ({used} of B={batch} in use)")


def check_decode(what: str, r: int, g: int, *, phase: int, used: int, batch: int, decodes: int,
                 max_decodes: int) -> None:
    """ActionError if request r (in ``phase``) cannot start its decode on GPU g: ``used`` of its ``batch``
    slots are taken, or it runs ``decodes`` >= ``max_decodes`` (its pool's cap)."""
    if phase != WAIT_DECODE:
        raise ActionError(f"{what}: request {r} is {PHASE_NAMES[phase]}, not waiting for a decode")
    if used >= batch:
        raise ActionError(f"{what}: GPU {g} has no free slot ({used} of B={batch} in use)")
    if decodes >= max_decodes:
        raise ActionError(f"{what}: GPU {g} already runs {decodes} decodes, its cap (max_decodes={max_decodes}, "
                          "set in setup)")


def check_enqueue(what: str, r: int, phase: int) -> None:
    """ActionError unless request r (in ``phase``) waits (for a prefill or a decode)."""
    if phase not in (WAIT_PREFILL, WAIT_DECODE):
        raise ActionError(f"{what}: request {r} is {PHASE_NAMES[phase]}, not waiting")


def kv_refused(r: int, g: int, now: float, free: int, tokens: int, prefill: bool) -> ActionError:
    """The error for work whose KV cache (``tokens``) does not fit in GPU g's ``free`` tokens."""
    name, what = ("start_prefill", "the prompt") if prefill else ("start_decode", "the request's context")
    return ActionError(f"{name}(r={r}, g={g}) at t={now:.9g}: GPU {g} has {free} free KV tokens, {what} needs {tokens}")


def kv_overflow(g: int, now: float, guard: int) -> ActionError:
    """The error for a GPU whose KV cache still overflows after ``guard`` preemptions."""
    return ActionError(f"GPU {g} at t={now:.9g}: KV overflow persists after {guard} preemptions; the controller "
                       "re-admits work on the GPU it was evicted from (do not start work from on_preempt)")
