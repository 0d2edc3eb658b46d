"""The fleet actions of the event kernel: GPUs added, drained and removed during a run, runtime
batch limits, eviction (docs/simulator.md section 11). Cold code, kept out of the kernel: a fixed
fleet never calls it. The kernel binds these functions as methods of ``Engine`` (``eng`` is the
engine), so a controller calls ``ctx.add_gpu()`` as before; the state they change and the kernel
methods they call (``_evict``, ``_join``, ``_hset``, ...) are the kernel's.
"""

from __future__ import annotations

import math
import numbers

from fluidopt.control.protocol import DECODE, PREFILL
from fluidopt.core.errors import ActionError
from fluidopt.sim.action_errors import PHASE_NAMES, check_gpu, check_req
from fluidopt.sim.state import G_DRAINING, G_OFFLINE, G_ONLINE, G_STARTING, GSTATE_NAMES, STARTUP

__all__ = ["add_gpu", "drain_gpu", "evict", "fleet_online", "fleet_size", "gpu_hours", "gpu_state", "remove_gpu",
           "set_max_decodes"]


def gpu_state(eng, g: int) -> str:
    """GPU g's fleet state: 'online', 'starting', 'draining' or 'offline'."""
    check_gpu(eng, "gpu_state", g)
    return GSTATE_NAMES[eng.g_state[g]]


def fleet_size(eng) -> int:
    """GPUs counted in GPU-hours now: online, starting (added, not yet up) and draining."""
    return eng._fleet_on


def fleet_online(eng) -> list[int]:
    """The online GPUs, in index order (O(n))."""
    st = eng.g_state
    return [g for g in range(eng.n) if st[g] == G_ONLINE]


def gpu_hours(eng) -> float:
    """GPU-hours used from time 0 to now (every GPU counted from being added to going offline)."""
    return (eng._fleet_on * eng._now - eng._fleet_acc) / 3600.0


def startup_delay(eng) -> float:
    """The fleet's start-up delay (s): how long a GPU added without a delay of its own takes to come online."""
    return eng._startup


def add_gpu(eng, g: int | None = None, startup_delay: float | None = None) -> int:
    """Add an offline GPU to the fleet (g, or the lowest-numbered offline one); return its id.

    It counts towards GPU-hours at once and takes work after ``startup_delay`` seconds (None: the
    fleet's), when ``on_slot_freed(g)`` announces it (at once during ``setup`` or with no delay)."""
    if startup_delay is None:
        delay = eng._startup
    else:
        ok = isinstance(startup_delay, numbers.Real) and not isinstance(startup_delay, bool)
        delay = float(startup_delay) if ok else math.nan
        if not (math.isfinite(delay) and delay >= 0):
            raise ActionError(f"add_gpu(startup_delay={startup_delay!r}) at t={eng._now:.9g}: expected a finite "
                              "number of seconds >= 0 (or None for the fleet's start-up delay)")
    st = eng.g_state
    if g is None:
        g = -1
        for k in range(eng.n):
            if st[k] == G_OFFLINE:
                g = k
                break
        if g < 0:
            raise ActionError(f"add_gpu at t={eng._now:.9g}: all {eng.n} GPUs (cluster.gpus, the fleet's maximum) "
                              "are already in the fleet")
    else:
        check_gpu(eng, "add_gpu", g)
        if st[g] != G_OFFLINE:
            raise ActionError(f"add_gpu(g={g}) at t={eng._now:.9g}: GPU {g} is {GSTATE_NAMES[st[g]]}, not offline")
    eng._fleet_used = True
    t = eng._now
    st[g] = G_STARTING
    fleet_count(eng, 1, t)
    if delay > 0 and not eng._in_setup:
        eng.t_pkb[g] = STARTUP
        eng._hset(g, t + delay)
    else:
        online(eng, g, t)
    return g


def drain_gpu(eng, g: int) -> None:
    """Take GPU g out of the fleet: it takes no new work (no prefill, no decode: its cap is 0),
    its running requests finish, and it goes offline when the last one leaves (at once if idle).
    A starting GPU is cancelled at once."""
    check_gpu(eng, "drain_gpu", g)
    st = eng.g_state[g]
    if st == G_OFFLINE or st == G_DRAINING:
        raise ActionError(f"drain_gpu(g={g}) at t={eng._now:.9g}: GPU {g} is already {GSTATE_NAMES[st]} "
                          "(the fleet cannot shrink below its online GPUs)")
    eng._fleet_used = True
    t = eng._now
    if st == G_STARTING:
        eng._hremove(g)
        eng.t_pkb[g] = -1
        eng.g_state[g] = G_OFFLINE
        fleet_count(eng, -1, t)
        return
    eng._saved[g] = (eng.g_pok[g], eng.g_maxd[g])
    eng.g_state[g] = G_DRAINING
    eng.g_pok[g] = 0
    eng.g_maxd[g] = 0
    eng._refresh(g)
    if eng.g_cnt[g] == 0:
        offline(eng, g, t)
    else:
        eng._fleet_log.append((t, eng._fleet_on, n_online(eng)))


def remove_gpu(eng, g: int, host: bool = True) -> list[int]:
    """Drain GPU g and evict its running requests at once (see :func:`evict`; markov: they wait
    again for the phase they were in). Returns the evicted requests; none is lost: each is placed
    by ``on_preempt`` (default: the front of the prefill queue, or of the decode queue for a
    markov decode)."""
    drain_gpu(eng, g)
    out = []
    if eng.g_state[g] == G_DRAINING:
        for r in eng.gpu_requests(g):
            if evict(eng, r, host):
                out.append(r)
    return out


def set_max_decodes(eng, g: int, m: int) -> None:
    """Set GPU g's batch limit (most concurrent decodes, 1..B) while running. Lowering it below
    the decodes running there evicts none: it only stops new ones until they are fewer."""
    check_gpu(eng, "set_max_decodes", g)
    if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= eng.B:
        raise ActionError(f"set_max_decodes(g={g}) at t={eng._now:.9g}: batch limit: expected an integer in "
                          f"1..{eng.B} (B), got {m!r}")
    eng._fleet_used = True
    if eng.g_state[g] != G_ONLINE:
        eng._saved[g] = (eng._saved.get(g, (1, eng.B))[0], m)
        return
    eng.g_maxd[g] = m
    eng._refresh(g)


def evict(eng, r: int, host: bool = True) -> bool:
    """Take running request r off its GPU now; it waits again (``on_preempt``; default: the front
    of the prefill queue) and counts a preemption.

    tokens mode: the eviction takes effect at the GPU's next iteration boundary (the iteration in
    progress completes); it returns False and does nothing if r's prefill or decode ends at that
    boundary. A decode evicted with ``host=True`` keeps its KV cache in host memory: its restart is
    a restore taking ceil(kv_swap_time_per_token * (prompt + generated) / tau_mix) mixed
    iterations (at least one) in the prefill slot instead of a re-prefill; ``host=False`` (and an
    evicted prefill) recomputes. markov mode: a prefill waits for a new prefill, a decode for a new
    decode (memoryless: no restart cost)."""
    check_req(eng, "evict", r)
    ph = eng.r_phase[r]
    if ph != PREFILL and ph != DECODE:
        raise ActionError(f"evict(r={r}) at t={eng._now:.9g}: request {r} is {PHASE_NAMES[ph]}, not running")
    g = eng.r_gpu[r]
    t = eng._now
    if not eng.markov:
        eng._join(g, t)  # anchor g at the boundary where the eviction takes effect
        if ph == PREFILL:
            if eng.t_pend[g] <= eng.t_ka[g]:
                return False
        elif eng.r_dkey[r] <= eng.t_dca[g]:
            return False
    eng._evict(r, g, t, bool(host))
    return True


# -- called by the kernel ----------------------------------------------------------------------
def n_online(eng) -> int:
    st = eng.g_state
    return sum(1 for g in range(eng.n) if st[g] == G_ONLINE)


def fleet_count(eng, d: int, t: float) -> None:
    eng._fleet_on += d
    eng._fleet_acc += d * t
    eng._fleet_log.append((t, eng._fleet_on, n_online(eng)))


def online(eng, g: int, t: float) -> None:
    """A starting GPU is up: it takes work from now (announced by on_slot_freed(g))."""
    pok, md = eng._saved.pop(g, (1, eng.B))
    eng.g_state[g] = G_ONLINE
    eng.t_pkb[g] = -1
    eng.g_pok[g] = pok
    eng.g_maxd[g] = md
    eng._refresh(g)
    eng._fleet_log.append((t, eng._fleet_on, n_online(eng)))
    cb = eng._cb_freed
    if cb is not None and not eng._in_setup:
        cb(eng, g)


def offline(eng, g: int, t: float) -> None:
    """A draining GPU has emptied: it leaves the fleet (and GPU-hours) now."""
    eng.g_state[g] = G_OFFLINE
    fleet_count(eng, -1, t)


def restore(eng, r: int, g: int, ptok: int, ka: int) -> None:
    """Schedule the restore of r's KV from host memory on g (in place of a re-prefill)."""
    eng.r_host[r] = 0
    eng.l_w[g] = -1  # a restore, not a prefill (a law times its iterations: timelaw.iteration)
    T = eng._swap * ptok
    if eng.chunked:
        tau = eng.tau_mix if eng._lawc is None else eng._lawc[0] + eng._lawc[1] * eng.C  # a chunk's iteration
        eng.t_pend[g] = ka + max(1, int(math.ceil(T / tau)))
        eng.t_itl[g] = eng.tau_mix
    else:
        eng.t_pend[g] = ka + 1
        eng.t_itl[g] = T if T > 0 else eng.tau_solo
        eng.t_adv[g] = 0


def preempt_youngest(eng, g: int, t: float) -> None:
    """vLLM recompute preemption: evict the latest arrival running on g (no on_slot_freed, as vLLM)."""
    b = g * eng.B
    cands = [eng.g_dec[b + k] for k in range(eng.g_ndec[g])]
    if eng.g_pre[g] >= 0:
        cands.append(eng.g_pre[g])
    eng._evict(max(cands, key=lambda x: (eng.r_arr[x], eng.r_serial[x])), g, t, False)
