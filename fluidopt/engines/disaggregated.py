"""Disaggregated prefill and decode, instance by instance: a prefill pool, a decode pool and the KV
transfer between them, as DistServe (Zhong et al., OSDI 2024) serves them (docs/fidelity.md,
"Disaggregated replay").

Rules (each pool has its own :class:`~fluidopt.calibration.timemodels.IterationLaw`, usually one TP
degree of DistServe's profile, and its own KV capacity):

Where an arrival goes and which decode instance takes a prefilled request are decided by a policy per
pool (:mod:`fluidopt.engines.disagg_policies`); the rules below are the default, ``distserve-fcfs``.

* **Prefill instance**: an arrival joins the prefill instance with the fewest queued prompt tokens
  (ties: the lowest index). An idle instance runs one batch of whole prompts from the head of its
  FCFS queue, as many as fit ``prefill_max_tokens`` tokens and ``prefill_max_batch`` prompts and the
  instance's free KV (a prompt's KV stays on the prefill instance until its transfer ends). A batch
  takes ``law.prefill_time(lengths)``; at its end every request of it has its first token (TTFT ends
  here, as in DistServe's measurements) and one that wants one token is finished.
* **Transfer**: the others go, in the order they finished, to a decode instance in turn (round robin)
  and wait in its FCFS migration queue. The head starts its transfer only when the decode instance can
  hold its KV (``ceil(prompt / block)`` blocks of ``block_size`` tokens, reserved then); the transfer
  takes ``link_latency + prompt * kv_bytes_per_token / link_bandwidth`` s, one transfer at a time per
  (prefill, decode) link, FCFS. Its end frees the prompt's KV on the prefill instance.
* **Engine costs** a kernel-only profile leaves out (:class:`Pool`'s fields, 0 by default): per prefill
  batch, per prompt of a batch, per prompt token, per request of a decode step, and an entry latency
  between a request's issue and its arrival at the prefill pool that occupies no instance.
* **Decode instance**: continuous batching. Each step decodes every running request (one token each)
  and takes ``law.decode_time(T, B)`` (``B`` requests, ``T`` context tokens). Transferred requests join
  at the next step boundary. A request holding ``L`` tokens holds ``ceil((L - 1) / block)`` blocks and
  needs one more when ``L - 1`` is a multiple of the block; a step short of blocks swaps out the
  last-joined running request (its blocks freed; it goes back to the head of the instance's queue and
  rejoins when its blocks fit again; the swap itself costs no time).

Speed (docs/fidelity.md, "Speed of the disaggregated replay"): arrivals are read from the sorted array,
and the heap holds the ends of prefill batches, transfers and decode steps. A decode step that ends
before any other event runs in place, without the heap, on the instance's counters held in locals; a
run of such steps with nothing joining or finishing (a quiet stretch) is a tight loop of block checks
and step times. Every result is the heap's order of events, bit for bit (tests/engines hold digests).

Times in seconds, lengths in tokens, KV capacities in tokens, bandwidth in bytes/s.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from fluidopt.calibration.timemodels import IterationLaw
from fluidopt.core.errors import UsageError
from fluidopt.engines.disagg_policies import DecodePolicy, DisaggTargets, PoolsView, PrefillPolicy, make_policy
from fluidopt.engines.stepper import Replay, checked_requests

# Geometry of the models DistServe profiled (config.json: num_hidden_layers, num_attention_heads,
# hidden_size / heads; OPT has no grouped-query attention, so KV heads = heads) and parameter counts.
MODEL_SHAPES: dict[str, dict] = {
    "facebook/opt-13b": dict(layers=40, kv_heads=40, head_dim=128, params=12.85e9),
    "facebook/opt-66b": dict(layers=64, kv_heads=72, head_dim=128, params=65.7e9),
}
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1}
# A100-SXM4 NVLink 3: 600 GB/s both directions, 300 GB/s each way (the GPUs of DistServe's runs share a node)
NVLINK_A100 = 300e9


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: str = "fp16") -> int:
    """Bytes of KV cache one token takes in the whole model (K and V, every layer, all heads)."""
    if dtype not in DTYPE_BYTES:
        raise UsageError(f"dtype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]


def model_kv_bytes(model: str, dtype: str = "fp16") -> int:
    """:func:`kv_bytes_per_token` of a model in :data:`MODEL_SHAPES`."""
    if model not in MODEL_SHAPES:
        raise UsageError(f"model {model!r}: no shape known for the KV transfer; known: {', '.join(MODEL_SHAPES)}")
    s = MODEL_SHAPES[model]
    return kv_bytes_per_token(s["layers"], s["kv_heads"], s["head_dim"], dtype)


def check_fits(model: str, tp: int, gpu_bytes: float = 80e9, utilisation: float = 0.9, dtype: str = "fp16",
               what: str = "instance") -> None:
    """Raise :class:`UsageError` when ``model``'s weights (``params * dtype`` bytes, split over ``tp``
    GPUs) leave no room for KV in ``utilisation * gpu_bytes`` per GPU."""
    s = MODEL_SHAPES.get(model)
    if s is None:
        return
    per_gpu = s["params"] * DTYPE_BYTES.get(dtype, 2) / tp
    if per_gpu >= utilisation * gpu_bytes:
        raise UsageError(f"{what}: {model} at TP {tp} needs {per_gpu / 1e9:.1f} GB of weights per GPU, more than "
                         f"{utilisation:.0%} of {gpu_bytes / 1e9:g} GB; raise the TP degree")


@dataclass(frozen=True)
class Pool:
    """One pool: ``instances`` instances with ``law`` and ``kv_tokens`` of KV each (None: unlimited)."""

    law: IterationLaw
    instances: int = 1
    kv_tokens: int | None = None
    max_tokens: int = 2048  # prefill: prompt tokens per batch (OPT's context is 2048)
    max_batch: int = 10**9  # prompts per prefill batch / requests per decode step
    block_size: int = 16
    overhead: float = 0.0  # s added to every batch or step (the engine's CPU time; kernel-only profiles omit it)
    request_overhead: float = 0.0  # decode: s added per request of a step (sampling, detokenising, streaming)
    prompt_overhead: float = 0.0  # prefill: s added per prompt of a batch (tokenising, request set-up, the reply)
    token_overhead: float = 0.0  # prefill: s added per prompt token of a batch (on top of the law's b)
    # prefill: s from a request's issue to its arrival at the pool (the API server in front: tokenising,
    # handing over); it occupies no instance, so it adds to TTFT without queueing
    entry_latency: float = 0.0


@dataclass(frozen=True)
class DisaggReplay(Replay):
    """:class:`Replay` plus the transfer, per request in input order (s): ``transfer_start``,
    ``transfer_end`` (NaN for one-token requests, which never leave the prefill pool), the instances
    that served it, the swaps on the decode side, and counts of requests through each stage.
    ``prefill_start``: the start of its prefill batch; ``decode_start``: the start of its first decode
    step (NaN where none); ``cls``: its class. ``events`` (``check=True`` only): after every event, a
    row ``(time, *STAGES counts)``, the engine's own census of where the requests are."""

    transfer_start: np.ndarray
    transfer_end: np.ndarray
    prefill_instance: np.ndarray
    decode_instance: np.ndarray
    counts: dict
    prefill_start: np.ndarray
    decode_start: np.ndarray
    cls: np.ndarray
    policy: str = "distserve-fcfs"
    events: np.ndarray | None = None

    @property
    def transfer(self) -> np.ndarray:
        """Transfer time per request, s (NaN where none)."""
        return self.transfer_end - self.transfer_start

    @property
    def prefill_wait(self) -> np.ndarray:
        """Queueing in the prefill pool (gate or instance queue), s: prefill start - arrival (so it includes
        the pool's entry latency)."""
        return self.prefill_start - self.arrival

    @property
    def decode_wait(self) -> np.ndarray:
        """Queueing for decode, s: first token -> first decode step, less the transfer (NaN where none)."""
        return self.decode_start - self.first_token - self.transfer


# the census of check=True, in the order of DisaggReplay.events' columns after the time
STAGES = ("arrived", "wait_prefill", "prefilling", "wait_transfer", "transferring", "decoding", "done")


def replay_disaggregated(prefill: Pool, decode: Pool, arrival, prompt, output, *, kv_bytes_per_token: float,
                         link_bandwidth: float = NVLINK_A100, link_latency: float = 0.0, cls=None,
                         policy: str | tuple[PrefillPolicy, DecodePolicy] = "distserve-fcfs",
                         targets: DisaggTargets | None = None, check: bool = False) -> DisaggReplay:
    """Run the requests through the two pools and the links; see the module docstring for the rules.

    ``cls``: each request's class, 0..k-1 (default: all 0). ``policy``: a name of
    :mod:`fluidopt.engines.disagg_policies` (``"X"`` or ``"PREFILL/DECODE"``; gate-and-route needs the
    LP's ``targets``) or a (prefill, decode) pair of policy objects. ``check``: verify after every event
    that arrived = waiting for prefill + prefilling + waiting for transfer + transferring + decoding +
    done (AssertionError otherwise) and return the census (``events``)."""
    if not link_bandwidth > 0:
        raise UsageError(f"link bandwidth: expected bytes/s > 0, got {link_bandwidth}")
    if not link_latency >= 0:
        raise UsageError(f"link latency: expected seconds >= 0, got {link_latency}")
    if decode.instances < 1 or prefill.instances < 1:
        raise UsageError(f"a disaggregated layout needs at least one prefill and one decode instance, got "
                         f"{prefill.instances} and {decode.instances}")
    arr, P, O = checked_requests(arrival, prompt, output)
    n = len(arr)
    C = [0] * n if cls is None else [int(c) for c in cls]
    if len(C) != n or any(c < 0 for c in C):
        raise ValueError("replay: expected one class index >= 0 per request")
    if isinstance(policy, str):
        pre_pol, dec_pol = make_policy(policy, targets=targets)
        policy_name = policy
    else:
        pre_pol, dec_pol = policy
        policy_name = f"{pre_pol.name}/{dec_pol.name}"
    bs = decode.block_size
    nP, nD = prefill.instances, decode.instances
    view = PoolsView(nP, nD, max(C, default=0) + 1, P, O, C, max_tokens=prefill.max_tokens,
                     max_batch=prefill.max_batch, block_size=bs)
    pre_pol.setup(view)
    dec_pol.setup(view)
    gated = pre_pol.gate
    admit, pull, route = pre_pol.admit, pre_pol.pull, dec_pol.route

    # per-request records as Python lists (an item set costs a third of a numpy one), arrays at the end
    nan, inf = math.nan, math.inf
    first, done, xs, xe, ps, ds = ([nan] * n for _ in range(6))
    swaps = [0] * n
    p_of = [-1] * n
    d_of = [-1] * n
    gen = [0] * n
    # counts through each stage, as locals (a dict item costs twice as much); the census reads them
    n_arrived = n_prefilled = n_transferred = n_finished = n_rejected = 0

    # prefill instances (the view's lists are the engine's own state)
    pq = view.prefill_queue
    pq_tokens = view.prefill_queued_tokens
    pb_tokens = view.prefill_batch_tokens
    p_busy = view.prefill_busy
    p_free = view.prefill_free_kv
    if prefill.kv_tokens is not None:
        p_free[:] = [float(prefill.kv_tokens)] * nP
    gate = view.gate
    share = view.prefill_share
    p_batch: list = [None] * nP
    # decode instances: migration queue (prefilled, waiting for blocks), ready (transferred), running
    mq = [deque() for _ in range(nD)]
    ready = [deque() for _ in range(nD)]
    swapped = [deque() for _ in range(nD)]
    # running requests in the order they joined, as dict keys: a finished one leaves in O(1) (a list's
    # remove scans the batch) and popitem() gives the last-joined, the one a step short of blocks swaps out
    running: list[dict[int, None]] = [{} for _ in range(nD)]
    d_busy = [False] * nD
    d_free = view.decode_free_blocks
    if decode.kv_tokens is not None:
        d_free[:] = [float(decode.kv_tokens // bs)] * nD
    d_load, d_load_tok, d_class = view.decode_assigned, view.decode_assigned_tokens, view.decode_class
    # links, one per (p, d), at p * nD + d: FCFS queue (of transfers waiting for the link) and busy flag;
    # an idle link's queue is empty
    lq = [deque() for _ in range(nP * nD)]
    l_busy = [False] * (nP * nD)
    pre_iters = 0  # prefill batches; the iterations are these and the decode steps, sum(g)
    # events (time, seq, kind, index): a batch's end (index: the prefill instance), a transfer's end (the
    # request), a decode step's end (the decode instance); the sentinel at time inf is never popped, so
    # the loop needs no emptiness test
    PDONE, XDONE, DDONE = 0, 1, 2
    ev: list = [(inf, inf, -1, -1)]
    seq = itertools.count()  # ties in time: the event pushed first goes first
    log: list = []

    heappush, heappop = heapq.heappush, heapq.heappop
    pf = prefill.law.prefill
    pf_a, pf_b, pf_c, pf_over = pf.a, pf.b + prefill.token_overhead, pf.c, prefill.overhead
    pf_req = prefill.prompt_overhead  # (with the defaults, 0, every sum below is the same float as without)
    p_maxb, p_maxt = prefill.max_batch, prefill.max_tokens
    p_kv = inf if prefill.kv_tokens is None else prefill.kv_tokens

    def start_prefill(p: int, now: float) -> None:
        nonlocal pre_iters
        if p_busy[p]:
            return
        if gated:
            batch = pull(view, p)
            if not batch:
                return
            tok = s2 = 0
            for r in batch:
                head = gate[C[r]].popleft()
                if head != r:
                    raise RuntimeError(f"policy {pre_pol.name}: pulled request {r}, not the head of class "
                                       f"{C[r]}'s gate ({head})")
                p_of[r] = p
                tok += P[r]
                s2 += P[r] * P[r]
            for r in batch:
                share[C[r]] += P[r] / tok
        else:
            q = pq[p]
            if not q:
                return
            batch, tok, s2 = [], 0, 0
            while q and len(batch) < p_maxb:
                r = q[0]
                Pr = P[r]
                if (batch and tok + Pr > p_maxt) or Pr > p_free[p]:
                    break
                q.popleft()
                batch.append(r)
                tok += Pr
                s2 += Pr * Pr
            if not batch:
                return
            pq_tokens[p] -= tok
        p_free[p] -= tok
        p_busy[p] = True
        pb_tokens[p] = tok
        p_batch[p] = batch
        for r in batch:
            ps[r] = now
        pre_iters += 1
        heappush(ev, (now + pf_over + pf_req * len(batch) + pf_a + pf_b * tok + pf_c * s2, next(seq), PDONE, p))

    def try_migrate(d: int, now: float) -> None:
        """Move the head of ``d``'s migration queue onto its link while ``d`` has blocks for it."""
        q = mq[d]
        while q and not swapped[d]:  # swapped-out requests come back before new KV comes in
            r = q[0]
            need = -(-P[r] // bs)
            if need > d_free[d]:
                return
            q.popleft()
            d_free[d] -= need
            link = p_of[r] * nD + d
            if l_busy[link]:
                lq[link].append(r)
            else:  # the link is idle, so its queue is empty: the transfer starts now
                l_busy[link] = True
                xs[r] = now
                heappush(ev, (now + link_latency + P[r] * kv_bytes_per_token / link_bandwidth, next(seq), XDONE, r))

    # decode steps in O(1) but for joins, finishes and swaps (as in the stepper): per instance the step
    # count g, the context tokens T, the running requests bucketed by (L - g) mod block (which of them start
    # a block this step) and a heap of the steps at which each finishes (a sentinel at step inf at its root
    # when empty); per request its offset L - g, fixed while it runs (so its length is off + g), and the
    # version of its heap entry (a swap-out makes the entry stale)
    g = [0] * nD
    Tctx = [0] * nD
    bucket = [[0] * bs for _ in range(nD)]
    fin: list[list] = [[(inf, -1, -1)] for _ in range(nD)]
    d_state = list(zip(fin, running, swapped, ready, mq, bucket))  # an instance's containers, in one tuple
    off = [0] * n
    version = [0] * n

    def join(r: int, d: int) -> None:
        L = P[r] + gen[r]
        off[r] = ofs = L - g[d]
        Tctx[d] += L
        bucket[d][ofs % bs] += 1
        running[d][r] = None
        heappush(fin[d], (g[d] + O[r] - gen[r], r, version[r]))

    def leave(r: int, d: int) -> int:
        """Take ``r`` off the running set; returns the blocks it held."""
        ofs = off[r]
        L = ofs + g[d]
        gen[r] = L - P[r]
        Tctx[d] -= L
        bucket[d][ofs % bs] -= 1
        version[r] += 1
        return -(-(L - 1) // bs)

    # the decode law inlined (the same float operations as IterationLaw.decode_time, so the same times)
    d_small, d_large, d_thr = decode.law.decode.small, decode.law.decode.large, decode.law.decode.threshold
    if d_large is None:
        d_thr = inf  # one law for every batch
    d_over, d_req, d_maxb = decode.overhead, decode.request_overhead, decode.max_batch

    def start_decode(d: int, now: float) -> float | None:
        """Start instance ``d``'s next step if it is idle and has work; returns when the step ends."""
        if d_busy[d]:
            return None
        run = running[d]
        sw = swapped[d]
        while sw and len(run) < d_maxb:
            r = sw[0]
            held = -(-(P[r] + gen[r] - 1) // bs)
            if held > d_free[d]:
                break
            d_free[d] -= held
            join(sw.popleft(), d)
        rd = ready[d]
        while rd and len(run) < d_maxb:
            r = rd.popleft()
            if ds[r] != ds[r]:  # NaN: its first step
                ds[r] = now
            join(r, d)
        if not run:
            return None
        # one more block for each request whose newest token starts one; swap out the last-joined on shortage
        key = (1 - g[d]) % bs
        bk = bucket[d]
        while bk[key] > d_free[d] and run:
            r = run.popitem()[0]
            d_free[d] += leave(r, d)
            swaps[r] += 1
            sw.appendleft(r)
        if not run:
            return None  # a lone request larger than the cache: never happens when a prompt fits
        d_free[d] -= bk[key]
        B = len(run)
        d_busy[d] = True
        a, b, c = d_large if B >= d_thr else d_small
        return now + d_over + d_req * B + (a + b * Tctx[d] + c * B)

    def census(now: float, arrived: int, out: int) -> None:
        """Log where the requests are (``out``: finished or rejected); AssertionError unless they add up."""
        wait_p = sum(map(len, pq)) + sum(map(len, gate))
        prefilling = sum(len(b) for b in p_batch if b is not None)
        wait_x = sum(map(len, mq)) + sum(map(len, lq))
        moving = sum(l_busy)
        decoding = sum(map(len, ready)) + sum(map(len, running)) + sum(map(len, swapped))
        row = (now, arrived, wait_p, prefilling, wait_x, moving, decoding, out)
        if sum(row[2:]) != arrived:
            raise AssertionError(f"disaggregated replay at t = {now}: {dict(zip(STAGES, row[1:]))} do not add up")
        log.append(row)

    # Python floats (the same values, faster to compare than numpy scalars), and a sentinel at inf; the
    # engine sees each request entry_latency after its issue (every time below is the engine's)
    A = (arr + prefill.entry_latency if prefill.entry_latency else arr).tolist() + [inf]
    nxt = 0
    while True:
        now = A[nxt]
        if now <= ev[0][0]:
            if nxt == n:
                break  # no arrival left and only the sentinel in the heap
            # arrivals at one instant are queued together, so they can share a batch
            p0, touched = -1, None
            while A[nxt] == now:
                r = nxt
                nxt += 1
                n_arrived += 1
                if P[r] > p_kv:
                    n_rejected += 1  # could never be prefilled
                    continue
                if gated:
                    gate[C[r]].append(r)
                    continue
                if nP > 1:  # one instance: no choice to ask about
                    p = admit(view, r)
                    if not 0 <= p < nP:
                        raise RuntimeError(f"policy {pre_pol.name}: prefill instance {p!r} for request {r}; "
                                           f"expected 0..{nP - 1}")
                else:
                    p = 0
                p_of[r] = p
                pq[p].append(r)
                pq_tokens[p] += P[r]
                if p0 < 0:
                    p0 = p
                elif touched is None:
                    touched = [p0, p]
                else:
                    touched.append(p)
            if gated:
                for p in range(nP):
                    start_prefill(p, now)
            elif touched is not None:
                for p in sorted(set(touched)):
                    start_prefill(p, now)
            elif p0 >= 0 and not p_busy[p0]:
                start_prefill(p0, now)
            if check:
                census(now, n_arrived, n_finished + n_rejected)
            continue
        now, _, kind, x = heappop(ev)
        if kind == PDONE:
            p = x
            batch = p_batch[p]
            p_busy[p] = False
            pb_tokens[p] = 0
            p_batch[p] = None
            if gated:
                tok = sum(P[r] for r in batch)
                for r in batch:
                    share[C[r]] -= P[r] / tok
            d0, touched = -1, None
            for r in batch:
                n_prefilled += 1
                first[r] = now
                gen[r] = 1
                if O[r] == 1:
                    done[r] = now
                    p_free[p] += P[r]
                    n_finished += 1
                    continue
                if nD > 1:
                    d = route(view, r)
                    if not 0 <= d < nD:
                        raise RuntimeError(f"policy {dec_pol.name}: decode instance {d!r} for request {r}; "
                                           f"expected 0..{nD - 1}")
                else:
                    d = 0
                d_of[r] = d
                d_load[d] += 1
                d_load_tok[d] += P[r]
                d_class[d][C[r]] += 1
                mq[d].append(r)
                if d0 < 0:
                    d0 = d
                elif touched is None:
                    touched = [d0, d]
                else:
                    touched.append(d)
            if touched is not None:
                for d in sorted(set(touched)):
                    try_migrate(d, now)
            elif d0 >= 0:
                try_migrate(d0, now)
            if gated or pq[p]:  # (start_prefill's own first test, saving the call)
                start_prefill(p, now)
        elif kind == XDONE:
            r = x
            p, d = p_of[r], d_of[r]
            link = p * nD + d
            xe[r] = now
            n_transferred += 1
            p_free[p] += P[r]
            ready[d].append(r)
            q = lq[link]
            if q:  # the next transfer on this link starts now
                r2 = q.popleft()
                xs[r2] = now
                heappush(ev, (now + link_latency + P[r2] * kv_bytes_per_token / link_bandwidth, next(seq), XDONE, r2))
            else:
                l_busy[link] = False
            if not d_busy[d]:
                t = start_decode(d, now)
                if t is not None:
                    heappush(ev, (t, next(seq), DDONE, d))
            if not p_busy[p] and (gated or pq[p]):
                start_prefill(p, now)
        else:
            # instance d's step ended; its next steps run here, in place, while each ends before any other
            # event (arrival or heap), with the instance's counters in locals
            d = x
            h, run, sw, rd, q, bk = d_state[d]
            d_busy[d] = False  # only start_decode reads it before this handler ends
            gd, T, free = g[d], Tctx[d], d_free[d]
            horizon = min(ev[0][0], A[nxt])  # the next other event
            while True:
                T += len(run)  # every running request has one more token
                gd += 1
                while h[0][0] <= gd:  # finished requests leave (the leave() above, on the locals)
                    _, r, v = heappop(h)
                    if v != version[r]:
                        continue  # swapped out since
                    # (its gen and version stay: it never runs again, and older heap entries are stale)
                    ofs = off[r]
                    L = ofs + gd
                    T -= L
                    bk[ofs % bs] -= 1
                    free += -(-(L - 1) // bs)
                    del run[r]
                    done[r] = now
                    n_finished += 1
                    d_load[d] -= 1
                    d_load_tok[d] -= P[r]
                    d_class[d][C[r]] -= 1
                if rd and not sw:
                    # transferred requests join at this step boundary (join() and start_decode's common case,
                    # on the locals; with nothing swapped out, nothing else comes before them)
                    while rd and len(run) < d_maxb:
                        r = rd.popleft()
                        ds[r] = now  # its first step: a request is transferred, so made ready, once
                        L = P[r] + gen[r]
                        off[r] = ofs = L - gd
                        T += L
                        bk[ofs % bs] += 1
                        run[r] = None
                        heappush(h, (gd + O[r] - gen[r], r, version[r]))
                key = (1 - gd) % bs
                if sw or rd or not run or bk[key] > free:
                    g[d], Tctx[d], d_free[d] = gd, T, free
                    d_busy[d] = False  # the step just run in place set it
                    t = start_decode(d, now)
                    T, free = Tctx[d], d_free[d]
                    B = len(run)
                    a, b, c = d_large if B >= d_thr else d_small
                else:  # start_decode's common case, inlined: nothing joins, no block is short
                    free -= bk[key]
                    B = len(run)
                    a, b, c = d_large if B >= d_thr else d_small
                    t = now + d_over + d_req * B + (a + b * T + c * B)
                s0 = -1
                if q and not sw and -(-P[q[0]] // bs) <= free:  # try_migrate's first test: can the head move?
                    s0 = next(seq)  # the step's place in the event order comes before the transfers it starts
                    d_free[d] = free
                    try_migrate(d, now)
                    free = d_free[d]
                    horizon = min(ev[0][0], A[nxt])
                if t is None:
                    break
                if t >= horizon:
                    heappush(ev, (t, s0 if s0 >= 0 else next(seq), DDONE, d))
                    d_busy[d] = True
                    break
                # nothing else happens before this step ends: run it here rather than through the heap
                # (the order of events, hence every result, is the heap's)
                if check:
                    g[d], Tctx[d], d_free[d] = gd, T, free
                    census(now, n_arrived, n_finished + n_rejected)
                now = t
                if check or sw or rd:
                    continue
                # A quiet stretch: no other event comes, so nothing joins, and the running set stays as it is
                # until the step at which its first request finishes (hn): B and its terms are fixed and each
                # step is its block check and its time (the same float operations as above, so the same times).
                # The migration queue's head stays where it is: it did not fit, and free blocks only shrink
                # until someone finishes.
                hn = h[0][0]
                reqB, cB = d_req * B, c * B
                while True:
                    gd1 = gd + 1
                    if gd1 >= hn:
                        break  # someone finishes at this step's end: the loop above handles it
                    key = (1 - gd1) % bs
                    need = bk[key]
                    if need > free:
                        break  # short of blocks: start_decode swaps
                    gd = gd1
                    T += B
                    free -= need
                    t = now + d_over + reqB + (a + b * T + cB)
                    if t >= horizon:
                        break
                    now = t
                if t >= horizon:
                    heappush(ev, (t, next(seq), DDONE, d))
                    d_busy[d] = True
                    break
            g[d], Tctx[d], d_free[d] = gd, T, free
        if check:
            census(now, n_arrived, n_finished + n_rejected)
    iters = pre_iters + sum(g)  # every step started has ended once, and g counts the ends
    counts = dict(arrived=n_arrived, prefilled=n_prefilled, transferred=n_transferred, finished=n_finished,
                  rejected=n_rejected)
    events = np.array(log, dtype=float).reshape(-1, 1 + len(STAGES)) if check else None
    f, i = np.float64, np.int64
    return DisaggReplay(arr, np.array(first, f), np.array(done, f), np.array(swaps, i), np.asarray(O, dtype=i), iters,
                        pre_iters, np.array(xs, f), np.array(xe, f), np.array(p_of, i), np.array(d_of, i), counts,
                        np.array(ps, f), np.array(ds, f), np.asarray(C, dtype=i), policy_name, events)


# the prefill-side engine cost forms --fit-costs can fit: the Pool field each one sets and its bisection range (s).
# The first, a latency before the pool, is the default: fitted to three of DistServe's runs it predicts the
# fourth within 6% on both medians, where a cost per batch, prompt or token misses 12/s by 12-14% on TTFT
# (each occupies the instance, so at 12/s the prefill queue compounds it; docs/fidelity.md).
PREFILL_COST_FORMS = {"entry": ("entry_latency", 50e-3), "batch": ("overhead", 20e-3),
                      "prompt": ("prompt_overhead", 10e-3), "token": ("token_overhead", 20e-6)}


def fit_costs(runs, prefill: Pool, decode: Pool, *, kv_bytes_per_token: float, link_bandwidth: float = NVLINK_A100,
              link_latency: float = 0.0, tol: float = 1e-6, prefill_form: str = "entry") -> tuple[float, float]:
    """The engine's CPU costs that a kernel-only profile leaves out, fitted to measured runs
    (:class:`~fluidopt.engines.validation.MeasuredRun`): the decode cost per request of a step (s) that
    makes the simulated median TPOT match the measured one on average over the runs (mean log-ratio 0),
    then the prefill cost that does the same for the median TTFT, in the form ``prefill_form`` (a key of
    :data:`PREFILL_COST_FORMS`): s from issue to the prefill pool, occupying no instance (``entry``, the
    default), s per batch (``batch``), s per prompt of a batch (``prompt``) or s per prompt token
    (``token``). Only medians are fitted, so attainment stays a check. Each is found by bisection (both
    medians grow with their cost), the decode cost in [0, 2 ms], the prefill cost in its form's range
    (50 ms entry, 20 ms per batch, 10 ms per prompt, 20 us per token); ``tol`` (s) is the decode cost's
    tolerance and the batch form's, scaled to the other forms' ranges. Returns ``(decode cost, prefill cost)``."""
    import dataclasses

    if prefill_form not in PREFILL_COST_FORMS:
        raise UsageError(f"prefill cost form {prefill_form!r}: expected one of {', '.join(PREFILL_COST_FORMS)}")
    field, hi_pre = PREFILL_COST_FORMS[prefill_form]

    def gap(dc: float, pc: float, what: str) -> float:
        pp = dataclasses.replace(prefill, **{field: pc})
        dp = dataclasses.replace(decode, request_overhead=dc)
        tot = 0.0
        for m in runs:
            s = replay_disaggregated(pp, dp, m.arrival, m.prompt, m.output, kv_bytes_per_token=kv_bytes_per_token,
                                     link_bandwidth=link_bandwidth, link_latency=link_latency)
            sim, meas = (s.tpot, m.tpot) if what == "tpot" else (s.ttft, m.ttft)
            tot += math.log(max(float(np.nanmedian(sim)), 1e-12) / float(np.median(meas)))
        return tot / len(runs)

    def bisect(f, hi: float, eps: float) -> float:
        lo = 0.0
        if f(lo) >= 0:
            return lo
        if f(hi) <= 0:
            return hi
        while hi - lo > eps:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
        return (lo + hi) / 2

    dc = bisect(lambda x: gap(x, getattr(prefill, field), "tpot"), 2e-3, tol)
    # the prefill tolerance scales with the form's range (the batch form's 20 ms keeps ``tol`` as given)
    pc = bisect(lambda x: gap(dc, x, "ttft"), hi_pre, tol * hi_pre / 20e-3)
    return dc, pc
