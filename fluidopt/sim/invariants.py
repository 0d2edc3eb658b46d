"""The simulator's invariants: recount an engine's whole state from scratch and compare it with every
incremental counter, queue, set and rate the engine keeps (tests; ``simulate(check=True)`` runs this
after every event). Cold code, kept out of the event kernel."""

from __future__ import annotations

import numpy as np

from fluidopt.control.protocol import DECODE, PREFILL, WAIT_DECODE, WAIT_PREFILL
from fluidopt.sim import metrics as M
from fluidopt.sim.metrics import C_AB_DECODE, C_AB_PREFILL, C_ARRIVED, C_COMPLETED, C_DROPPED, C_PREEMPTED, C_PREFILLED

NQ, NC = M.N_CLASS_QTY, M.N_CTR
Q_WP, Q_X, Q_WD, Q_YM, Q_YS = M.Q_PREFILL, M.X_PREFILL, M.Q_DECODE, M.Y_MIXED, M.Y_SOLO

__all__ = ["check_invariants"]


def _as_list(a) -> list:
    # the pure-Python engine's state is already lists (fluidopt.sim.state): read them as they are (a
    # round trip through numpy copied every slot after every event, three quarters of a check=True run)
    return a if type(a) is list else np.asarray(a).tolist()


def check_invariants(eng) -> None:
    """Raise AssertionError naming the first counter, queue, set or rate of ``eng`` (an
    :class:`fluidopt.sim.engine.Engine`) that disagrees with a recount."""
    I = eng.I
    # Every array read once, as a list: from Python, each read of a compiled core's attribute builds a
    # memoryview object, and each index into it a Python int, which made this check most of a
    # check=True run's time
    cnt_ = _as_list(eng._cnt)
    ctr_ = _as_list(eng._ctr)
    fd_ = eng._fd  # sets per pool
    hpos_ = _as_list(eng._hpos)
    ip_ = eng._ip
    rs_ = _as_list(eng._rs)
    rsn_ = _as_list(eng._rsn)
    rsoff_ = _as_list(eng._rsoff)
    g_cnt_ = _as_list(eng.g_cnt)
    g_dcls_ = _as_list(eng.g_dcls)
    g_dec_ = _as_list(eng.g_dec)
    g_maxd_ = _as_list(eng.g_maxd)
    g_ndec_ = _as_list(eng.g_ndec)
    g_pok_ = _as_list(eng.g_pok)
    g_pool_ = _as_list(eng.g_pool)
    g_pre_ = _as_list(eng.g_pre)
    g_state_ = _as_list(eng.g_state)
    q_cnt_ = _as_list(eng.q_cnt)
    q_head_ = _as_list(eng.q_head)
    q_tail_ = _as_list(eng.q_tail)
    q_tot_ = _as_list(eng.q_tot)
    r_cls_ = _as_list(eng.r_cls)
    r_dkey_ = _as_list(eng.r_dkey)
    r_dpos_ = _as_list(eng.r_dpos)
    r_dstart_ = _as_list(eng.r_dstart)
    r_gen_ = _as_list(eng.r_gen)
    r_gpu_ = _as_list(eng.r_gpu)
    r_next_ = _as_list(eng.r_next)
    r_output_ = _as_list(eng.r_output)
    r_phase_ = _as_list(eng.r_phase)
    r_pos_ = _as_list(eng.r_pos)
    r_prev_ = _as_list(eng.r_prev)
    r_q_ = _as_list(eng.r_q)
    t_kv_ = _as_list(eng.t_kv)
    t_pkb_ = _as_list(eng.t_pkb)
    live = eng._in_system()
    # one pass over the live requests recounts everything the checks below compare with (a pass per GPU
    # made the check quadratic in the fleet: most of a check=True run's time)
    cnt = [0] * len(cnt_)
    nd_of = [0] * eng.n
    pre_of: list[list[int]] = [[] for _ in range(eng.n)]
    dec_of: list[list[int]] = [[] for _ in range(eng.n)]
    in_sys_of = [0] * I
    past_of = [0] * I
    n_waiting = 0
    for r in live:
        c = r_cls_[r]
        ph = r_phase_[r]
        in_sys_of[c] += 1
        if ph == WAIT_PREFILL:
            cnt[NQ * c + Q_WP] += 1
            n_waiting += 1
        elif ph == PREFILL:
            cnt[NQ * c + Q_X] += 1
            pre_of[r_gpu_[r]].append(r)
        elif ph == WAIT_DECODE:
            cnt[NQ * c + Q_WD] += 1
            n_waiting += 1
            past_of[c] += 1
        else:
            g = r_gpu_[r]
            cnt[NQ * c + (Q_YM if g_pre_[g] >= 0 else Q_YS)] += 1
            if ph == DECODE:
                nd_of[g] += 1
                dec_of[g].append(r)
                past_of[c] += 1
    for g in range(eng.n):
        nd = nd_of[g]
        pre = pre_of[g]
        assert len(pre) <= 1, f"GPU {g} runs {len(pre)} prefills"
        assert g_pre_[g] == (pre[0] if pre else -1), f"GPU {g}: prefill {g_pre_[g]} vs {pre}"
        assert g_ndec_[g] == nd, f"GPU {g}: {g_ndec_[g]} decodes counted, {nd} found"
        assert g_cnt_[g] == nd + len(pre) <= eng.B, f"GPU {g}: slots {g_cnt_[g]}"
        # (a cap lowered during the run, or a draining GPU's 0, evicts nothing: only then may it be exceeded)
        assert nd <= g_maxd_[g] or eng._fleet_used, f"GPU {g}: {nd} decodes > cap {g_maxd_[g]}"
        assert sum(g_dcls_[g * I + c] for c in range(I)) == nd
        b = g * eng.B
        slots = [g_dec_[b + k] for k in range(nd)]
        mine = sorted(dec_of[g])
        assert sorted(slots) == mine, f"GPU {g}: decode slots {slots}, decoding {mine}"
        if not eng.markov:  # a min-heap by (end clock, request), r_dpos its positions (markov: unused)
            assert all(r_dpos_[r] == b + k for k, r in enumerate(slots)), f"GPU {g}: decode slot positions"
            key = [(r_dkey_[r], r) for r in slots]
            assert all(key[(k - 1) // 2] < key[k] for k in range(1, nd)), f"GPU {g}: decode heap order {key}"
            for r in slots:
                assert r_dkey_[r] == r_dstart_[r] + r_output_[r] - r_gen_[r], f"request {r}: end clock"
        cnt[eng._gbase] += g_cnt_[g] > 0
        p = g_pool_[g]
        ip = g_pre_[g] < 0 and g_cnt_[g] < eng.B and g_pok_[g]
        fd = g_cnt_[g] < eng.B and g_ndec_[g] < g_maxd_[g]
        assert (g in ip_[p]) == ip, f"GPU {g}: idle-prefill set membership"
        assert (g in fd_[p]) == fd, f"GPU {g}: free-decode set membership"
        if not eng.markov and g_cnt_[g]:
            assert eng.kvcap < 0 or t_kv_[g] <= eng.kvcap, f"GPU {g}: KV {t_kv_[g]} > {eng.kvcap}"
    assert cnt == list(cnt_), f"counts {list(cnt_)} != recount {cnt}"
    # queues
    inq = 0
    for q in range(len(q_tot_)):
        tot = 0
        for c in range(I):
            k = q * I + c
            n = 0
            r = q_head_[k]
            prev = -1
            while r >= 0:
                assert r_q_[r] == q and r_cls_[r] == c and r_prev_[r] == prev
                assert r_phase_[r] in (WAIT_PREFILL, WAIT_DECODE)
                n += 1
                prev = r
                r = r_next_[r]
            assert q_tail_[k] == prev and q_cnt_[k] == n, f"queue {q} class {c}: count"
            tot += n
        assert q_tot_[q] == tot
        inq += tot
    assert inq == n_waiting, f"{n_waiting} waiting but {inq} queued (a request was left unplaced)"
    seg = [[rs_[rsoff_[s] + 2 * k] for k in range(rsn_[s])] for s in range(3 * I)]
    assert sum(len(seg[c]) for c in range(I)) == inq  # RACE_WAIT segments
    for s, members in enumerate(seg):
        kind, c = divmod(s, I)
        for j, r in enumerate(members):
            assert r_pos_[r] == j and r_cls_[r] == c, f"race segment {s}: request {r}"
            # the pair's GPU: the request's while in service, -1 while it waits
            assert rs_[rsoff_[s] + 2 * j + 1] == (r_gpu_[r] if kind else -1), f"race pair {s}, {j}"
            if kind == 0:
                assert r_q_[r] >= 0
            else:
                assert eng.markov and r_phase_[r] == (PREFILL if kind == 1 else DECODE)
    if eng.markov:
        for c in range(I):
            assert len(seg[I + c]) == cnt_[NQ * c + Q_X], f"class {c}: prefill race set"
            assert len(seg[2 * I + c]) == cnt_[NQ * c + Q_YM] + cnt_[NQ * c + Q_YS], f"class {c}: decode race set"
    # conservation per class and per phase
    ctr = ctr_
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
    st = list(g_state_)
    assert eng._fleet_on == sum(1 for v in st if v != 3), f"fleet size {eng._fleet_on} != recount {st}"
    for g, v in enumerate(st):
        if v != 0:
            assert g_pok_[g] == 0 and g_maxd_[g] == 0, f"GPU {g} ({v}): takes work while not online"
        if v in (1, 3):
            assert g_cnt_[g] == 0, f"GPU {g} ({v}): holds requests"
        if v == 1:  # starting (a GPU added with no delay is online at once)
            assert hpos_[g] >= 0 and t_pkb_[g] == -2, f"GPU {g}: starting without a start-up event"
    lam = eng._exact_lam()
    assert abs(lam - eng._lam) <= 1e-6 * max(1.0, lam), f"race rate {eng._lam} != {lam}"
