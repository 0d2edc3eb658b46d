"""The controller view's cold reads and the setup-only actions of the event kernel (the protocol of
:mod:`fluidopt.control.protocol`): sizes and names, O(B) and O(queue) listings, pools and named
queues. The kernel binds these functions as methods of ``Engine`` (``eng`` is the engine); the O(1)
reads that controllers call on every event stay in the kernel, typed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from fluidopt.control.protocol import PREFILL, WAIT_PREFILL
from fluidopt.core.errors import ActionError
from fluidopt.sim import state as S
from fluidopt.sim.action_errors import check_gpu
from fluidopt.sim.state import G_ONLINE

__all__ = ["add_queue", "class_counts", "gpu_decodes_by_class", "gpu_requests", "instance_queue", "instance_tokens",
           "queue_counts", "queue_id", "queue_requests", "queue_totals", "set_pool"]


def n_gpus(eng) -> int:
    return eng.n


def batch(eng) -> int:
    return eng.B


def n_classes(eng) -> int:
    return eng.I


def class_names(eng) -> tuple[str, ...]:
    return eng._class_names


def service(eng) -> str:
    return eng._service


def rng(eng) -> random.Random:
    return eng._ctrl_rng


def n_pools(eng) -> int:
    return eng._n_pools


def gpu_mixed(eng, g: int) -> bool:
    return eng.g_pre[g] >= 0


def gpu_decodes_by_class(eng, g: int) -> tuple[int, ...]:
    return tuple(eng.g_dcls[g * eng.I:(g + 1) * eng.I])


def gpu_requests(eng, g: int) -> list[int]:
    """The requests running on g: its prefill first, then its decodes by id."""
    out = [eng.g_pre[g]] if eng.g_pre[g] >= 0 else []
    b = g * eng.B
    return out + sorted(eng.g_dec[b:b + eng.g_ndec[g]])


def class_counts(eng) -> Sequence[int]:
    """The live per-class counts (the protocol's layout, which is metrics' N_CLASS_QTY layout)."""
    return eng._cnt


def queue_counts(eng) -> Sequence[int]:
    return eng.q_cnt  # (a new vector after add_queue: the protocol says to ask again)


def queue_totals(eng) -> Sequence[int]:
    return eng.q_tot


def queue_id(eng, name: str) -> int:
    try:
        return eng._qindex[name]
    except KeyError:
        raise ActionError(f"queue_id: no queue named {name!r}; known: {', '.join(eng._qnames[:2])}, "
                          f"instance[g], and {', '.join(eng._qnames[2 + eng.n:]) or 'no named queues'}") from None


def instance_queue(eng, g: int) -> int:
    if not 0 <= g < eng.n:
        check_gpu(eng, "instance_queue", g)
    return 2 + g


def queue_requests(eng, q: int) -> list[int]:
    """The requests waiting in queue q, in FCFS order."""
    I = eng.I
    out = []
    for k in range(q * I, q * I + I):
        r = eng.q_head[k]
        while r >= 0:
            out.append(r)
            r = eng.r_next[r]
    out.sort(key=eng.r_seq.__getitem__)
    return out


def tokens(eng, r: int) -> int:
    """Outstanding work of r in tokens: its (re)prefill if still due, plus its remaining output."""
    ph = eng.r_phase[r]
    rem = eng.r_output[r] - eng.r_gen[r]
    if ph == WAIT_PREFILL or ph == PREFILL:
        return eng.r_prompt[r] + eng.r_gen[r] + rem
    return rem


def instance_tokens(eng, g: int) -> int:
    # computed on demand (O(B + queue length)): keeps the per-event cost free of it
    return sum(tokens(eng, r) for r in queue_requests(eng, 2 + g)) + sum(tokens(eng, r) for r in gpu_requests(eng, g))


def req_queue(eng, r: int) -> int:
    return eng.r_q[r]


def req_preemptions(eng, r: int) -> int:
    return eng.r_npre[r]


def set_pool(eng, gpus: Sequence[int], pool: int, *, prefill: bool = True, max_decodes: int | None = None) -> None:
    """Put ``gpus`` in ``pool`` (0, 1, ...), allow or forbid prefills there, cap their decodes."""
    if not eng._in_setup:
        raise ActionError("set_pool: pools can only be declared in Controller.setup")
    if isinstance(pool, bool) or not isinstance(pool, int) or pool < 0:
        raise ActionError(f"set_pool: pool: expected an integer >= 0, got {pool!r}")
    md = eng.B if max_decodes is None else max_decodes
    if isinstance(md, bool) or not isinstance(md, int) or not 0 <= md <= eng.B:
        raise ActionError(f"set_pool: max_decodes: expected an integer in 0..{eng.B} (B), got {max_decodes!r}")
    gpuset = type(eng._ip[0])
    while eng._n_pools <= pool:
        eng._ip.append(gpuset(eng.n, eng._ctrl_rng.random))
        eng._fd.append(gpuset(eng.n, eng._ctrl_rng.random))
        eng._n_pools += 1
    for g in gpus:
        check_gpu(eng, "set_pool", g)
        if eng.g_state[g] != G_ONLINE:
            eng._saved[g] = (1 if prefill else 0, md)
            eng.g_pool[g] = pool
            continue
        eng._ip[eng.g_pool[g]]._discard(g)
        eng._fd[eng.g_pool[g]]._discard(g)
        eng.g_pool[g] = pool
        eng.g_pok[g] = bool(prefill)
        eng.g_maxd[g] = md
        eng._refresh(g)


def add_queue(eng, name: str) -> int:
    """Declare a named FCFS queue (setup only); returns its id."""
    if not eng._in_setup:
        raise ActionError("add_queue: queues can only be declared in Controller.setup")
    if not isinstance(name, str) or not name:
        raise ActionError(f"add_queue: name: expected a non-empty string, got {name!r}")
    if name in eng._qindex:
        raise ActionError(f"add_queue: a queue named {name!r} already exists")
    typed = eng.engine_name == "compiled"
    q = len(eng._qnames)
    eng._qnames.append(name)
    eng._qindex[name] = q
    eng.q_head = S.grown(eng.q_head, eng.I, -1, typed)
    eng.q_tail = S.grown(eng.q_tail, eng.I, -1, typed)
    eng.q_cnt = S.grown(eng.q_cnt, eng.I, 0, typed)
    eng.q_tot = S.grown(eng.q_tot, 1, 0, typed)
    return q


def cached_prefix_tokens(eng, r: int, g: int) -> int:
    """How many leading tokens of request r's prompt are cached on instance (GPU) g now (0 without a
    prefix cache: no block hashes, markov service or ``prefix_cache=False``; docs/simulator.md 1.2)."""
    pc = eng._pc
    return 0 if pc is None else pc.query(eng.r_serial[r], eng.r_prompt[r], g)


def req_blocks(eng, r: int) -> Sequence[int]:
    """Request r's prompt KV block ids (chained; a trace's ``hashes`` row), empty when the workload has none."""
    h = getattr(eng.workload, "hashes", None)
    return () if h is None else h[eng.r_serial[r] - 1]
