"""The simulator's invariants: recount an engine's whole state from scratch and compare it with every
incremental counter, queue, set and rate the engine keeps (tests; ``simulate(check=True)`` runs this
after every event). Cold code, kept out of the event kernel."""

from __future__ import annotations

from fluidopt.control.protocol import DECODE, PREFILL, WAIT_DECODE, WAIT_PREFILL
from fluidopt.sim import metrics as M
from fluidopt.sim.metrics import C_AB_DECODE, C_AB_PREFILL, C_ARRIVED, C_COMPLETED, C_DROPPED, C_PREEMPTED, C_PREFILLED

NQ, NC = M.N_CLASS_QTY, M.N_CTR
Q_WP, Q_X, Q_WD, Q_YM, Q_YS = M.Q_PREFILL, M.X_PREFILL, M.Q_DECODE, M.Y_MIXED, M.Y_SOLO

__all__ = ["check_invariants"]


def check_invariants(eng) -> None:
    """Raise AssertionError naming the first counter, queue, set or rate of ``eng`` (an
    :class:`fluidopt.sim.engine.Engine`) that disagrees with a recount."""
    I = eng.I
    live = eng._in_system()
    # one pass over the live requests recounts everything the checks below compare with (a pass per GPU
    # made the check quadratic in the fleet: most of a check=True run's time)
    cnt = [0] * len(eng._cnt)
    nd_of = [0] * eng.n
    pre_of: list[list[int]] = [[] for _ in range(eng.n)]
    dec_of: list[list[int]] = [[] for _ in range(eng.n)]
    in_sys_of = [0] * I
    past_of = [0] * I
    n_waiting = 0
    r_cls, r_phase, r_gpu, g_pre = eng.r_cls, eng.r_phase, eng.r_gpu, eng.g_pre
    for r in live:
        c = r_cls[r]
        ph = r_phase[r]
        in_sys_of[c] += 1
        if ph == WAIT_PREFILL:
            cnt[NQ * c + Q_WP] += 1
            n_waiting += 1
        elif ph == PREFILL:
            cnt[NQ * c + Q_X] += 1
            pre_of[r_gpu[r]].append(r)
        elif ph == WAIT_DECODE:
            cnt[NQ * c + Q_WD] += 1
            n_waiting += 1
            past_of[c] += 1
        else:
            g = r_gpu[r]
            cnt[NQ * c + (Q_YM if g_pre[g] >= 0 else Q_YS)] += 1
            if ph == DECODE:
                nd_of[g] += 1
                dec_of[g].append(r)
                past_of[c] += 1
    for g in range(eng.n):
        nd = nd_of[g]
        pre = pre_of[g]
        assert len(pre) <= 1, f"GPU {g} runs {len(pre)} prefills"
        assert eng.g_pre[g] == (pre[0] if pre else -1), f"GPU {g}: prefill {eng.g_pre[g]} vs {pre}"
        assert eng.g_ndec[g] == nd, f"GPU {g}: {eng.g_ndec[g]} decodes counted, {nd} found"
        assert eng.g_cnt[g] == nd + len(pre) <= eng.B, f"GPU {g}: slots {eng.g_cnt[g]}"
        # (a cap lowered during the run, or a draining GPU's 0, evicts nothing: only then may it be exceeded)
        assert nd <= eng.g_maxd[g] or eng._fleet_used, f"GPU {g}: {nd} decodes > cap {eng.g_maxd[g]}"
        assert sum(eng.g_dcls[g * I + c] for c in range(I)) == nd
        b = g * eng.B
        slots = [eng.g_dec[b + k] for k in range(nd)]
        mine = sorted(dec_of[g])
        assert sorted(slots) == mine, f"GPU {g}: decode slots {slots}, decoding {mine}"
        if not eng.markov:  # a min-heap by (end clock, request), r_dpos its positions (markov: unused)
            assert all(eng.r_dpos[r] == b + k for k, r in enumerate(slots)), f"GPU {g}: decode slot positions"
            key = [(eng.r_dkey[r], r) for r in slots]
            assert all(key[(k - 1) // 2] < key[k] for k in range(1, nd)), f"GPU {g}: decode heap order {key}"
            for r in slots:
                assert eng.r_dkey[r] == eng.r_dstart[r] + eng.r_output[r] - eng.r_gen[r], f"request {r}: end clock"
        cnt[eng._gbase] += eng.g_cnt[g] > 0
        p = eng.g_pool[g]
        ip = eng.g_pre[g] < 0 and eng.g_cnt[g] < eng.B and eng.g_pok[g]
        fd = eng.g_cnt[g] < eng.B and eng.g_ndec[g] < eng.g_maxd[g]
        assert (g in eng._ip[p]) == ip, f"GPU {g}: idle-prefill set membership"
        assert (g in eng._fd[p]) == fd, f"GPU {g}: free-decode set membership"
        if not eng.markov and eng.g_cnt[g]:
            assert eng.kvcap < 0 or eng.t_kv[g] <= eng.kvcap, f"GPU {g}: KV {eng.t_kv[g]} > {eng.kvcap}"
    assert cnt == list(eng._cnt), f"counts {list(eng._cnt)} != recount {cnt}"
    # queues
    inq = 0
    for q in range(len(eng.q_tot)):
        tot = 0
        for c in range(I):
            k = q * I + c
            n = 0
            r = eng.q_head[k]
            prev = -1
            while r >= 0:
                assert eng.r_q[r] == q and eng.r_cls[r] == c and eng.r_prev[r] == prev
                assert eng.r_phase[r] in (WAIT_PREFILL, WAIT_DECODE)
                n += 1
                prev = r
                r = eng.r_next[r]
            assert eng.q_tail[k] == prev and eng.q_cnt[k] == n, f"queue {q} class {c}: count"
            tot += n
        assert eng.q_tot[q] == tot
        inq += tot
    assert inq == n_waiting, f"{n_waiting} waiting but {inq} queued (a request was left unplaced)"
    seg = [[eng._rs[eng._rsoff[s] + 2 * k] for k in range(eng._rsn[s])] for s in range(3 * I)]
    assert sum(len(seg[c]) for c in range(I)) == inq  # RACE_WAIT segments
    for s, members in enumerate(seg):
        kind, c = divmod(s, I)
        for j, r in enumerate(members):
            assert eng.r_pos[r] == j and eng.r_cls[r] == c, f"race segment {s}: request {r}"
            # the pair's GPU: the request's while in service, -1 while it waits
            assert eng._rs[eng._rsoff[s] + 2 * j + 1] == (eng.r_gpu[r] if kind else -1), f"race pair {s}, {j}"
            if kind == 0:
                assert eng.r_q[r] >= 0
            else:
                assert eng.markov and eng.r_phase[r] == (PREFILL if kind == 1 else DECODE)
    if eng.markov:
        for c in range(I):
            assert len(seg[I + c]) == eng._cnt[NQ * c + Q_X], f"class {c}: prefill race set"
            assert len(seg[2 * I + c]) == eng._cnt[NQ * c + Q_YM] + eng._cnt[NQ * c + Q_YS], f"class {c}: decode race set"
    # conservation per class and per phase
    ctr = eng._ctr
    for c in range(I):
        in_sys = in_sys_of[c]
        arrived = ctr[NC * c + C_ARRIVED]
        resolved = (ctr[NC * c + C_COMPLETED] + ctr[NC * c + C_AB_PREFILL] + ctr[NC * c + C_AB_DECODE]
                    + ctr[NC * c + C_DROPPED])
        assert arrived == resolved + in_sys, f"class {c}: arrived {arrived} != resolved {resolved} + in system {in_sys}"
        if eng.kvcap < 0 and ctr[NC * c + C_PREEMPTED] == 0:  # without preemption (KV or evict), every
            # prefilled request is past its prefill for good
            prefilled = ctr[NC * c + C_PREFILLED]
            past = past_of[c]
            assert prefilled == ctr[NC * c + C_COMPLETED] + ctr[NC * c + C_AB_DECODE] + past, (
                f"class {c}: prefilled {prefilled} != completed + abandoned in decode wait + decoding/waiting"
            )
    # the fleet: GPUs counted in GPU-hours; offline GPUs hold nothing; not-online GPUs take no work
    st = list(eng.g_state)
    assert eng._fleet_on == sum(1 for v in st if v != 3), f"fleet size {eng._fleet_on} != recount {st}"
    for g, v in enumerate(st):
        if v != 0:
            assert eng.g_pok[g] == 0 and eng.g_maxd[g] == 0, f"GPU {g} ({v}): takes work while not online"
        if v in (1, 3):
            assert eng.g_cnt[g] == 0, f"GPU {g} ({v}): holds requests"
        if v == 1:  # starting (a GPU added with no delay is online at once)
            assert eng._hpos[g] >= 0 and eng.t_pkb[g] == -2, f"GPU {g}: starting without a start-up event"
    lam = eng._exact_lam()
    assert abs(lam - eng._lam) <= 1e-6 * max(1.0, lam), f"race rate {eng._lam} != {lam}"
