"""The disaggregated engine's routing policies (fluidopt.engines.disagg_policies): each policy's decision
on a hand-built state, conservation of requests across both pools and the link at every event and
Little's law per pool for every policy, and distserve-fcfs against the engine's results before the
policies were pluggable."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.core.errors import UsageError
from fluidopt.engines.disagg_policies import DisaggTargets, PoolsView, make_policy, targets_from_lp
from fluidopt.engines.disaggregated import STAGES, Pool, replay_disaggregated
from fluidopt.engines.stepper import attained

# prefill 10 ms + 1 ms per prompt token (+ a small quadratic term); decode 5 ms + 1 ms per request, with a
# large-batch law from 8 requests, so both regimes run
LAW = IterationLaw(PrefillLaw(0.010, 0.001, 1e-7), DecodeLaw((0.005, 1e-6, 0.001), (0.004, 1.2e-6, 0.0008), 8))
LINK = dict(kv_bytes_per_token=1000, link_bandwidth=1e6, link_latency=0.002)  # 1 ms per token + 2 ms
TARGETS = DisaggTargets((0.3, 0.7), (4.0, 2.0))
POLICY_NAMES = ("distserve-fcfs", "round-robin", "least-load", "gate-and-route", "least-load/gate-and-route",
                "gate-and-route/round-robin")


def _view(n_prefill=3, n_decode=3, n_classes=2, prompt=(), **kw) -> PoolsView:
    P = list(prompt)
    return PoolsView(n_prefill, n_decode, n_classes, P, [2] * len(P), [0] * len(P), max_tokens=kw.get("max_tokens", 500),
                     max_batch=kw.get("max_batch", 10), block_size=16)


# ------------------------------------------------------------------------------------------------ decisions


def test_prefill_decisions_by_hand():
    v = _view()
    v.prefill_queued_tokens[:] = [300, 100, 100]
    v.prefill_batch_tokens[:] = [0, 500, 0]
    # DistServe's: fewest queued tokens, 100 at instances 1 and 2, the lower index wins; the running batch
    # is not counted
    pre, _ = make_policy("distserve-fcfs")
    assert pre.admit(v, 0) == 1
    # least-load counts the running batch too: 300, 600, 100
    pre, _ = make_policy("least-load")
    assert pre.admit(v, 0) == 2
    # round robin ignores the load
    pre, _ = make_policy("round-robin")
    pre.setup(v)
    assert [pre.admit(v, r) for r in range(4)] == [0, 1, 2, 0]


def test_decode_decisions_by_hand():
    v = _view()
    v.decode_assigned[:] = [2, 1, 1]
    v.decode_assigned_tokens[:] = [100, 500, 300]
    _, dec = make_policy("least-load")
    assert dec.route(v, 0) == 2  # one request each at 1 and 2; fewer prompt tokens at 2
    _, dec = make_policy("distserve-fcfs")
    dec.setup(v)
    assert [dec.route(v, r) for r in range(4)] == [0, 1, 2, 0]
    # gate-and-route: targets y = (4, 1) requests per instance, so a class-0 request fills 1/4 of an
    # instance and a class-1 request all of it: fills 2/4 + 1 = 1.5, 4/4 = 1.0, 0 + 2 = 2.0 -> instance 1,
    # though it holds the most requests
    v.decode_class[:] = [[2, 1], [4, 0], [0, 2]]
    _, dec = make_policy("gate-and-route", targets=DisaggTargets((0.5, 0.5), (4.0, 1.0)))
    dec.setup(v)
    assert dec.route(v, 0) == 1


def test_gate_decision_by_hand():
    # two prefill instances; LP shares x = (0.25, 0.75); running batches now hold X = (0.5, 1.0) busy
    # instances of each class. Deviation (X_i - n x_i) / x_i: class 0 (0.5 - 0.5) / 0.25 = 0, class 1
    # (1.0 - 1.5) / 0.75 = -2/3: class 1 is further below its target and goes first.
    v = _view(n_prefill=2, prompt=[100, 200, 100, 400, 50])
    v.cls[:] = [0, 1, 0, 1, 0]
    v.gate[0].extend([0, 2, 4])
    v.gate[1].extend([1, 3])
    v.prefill_share[:] = [0.5, 1.0]
    pre, _ = make_policy("gate-and-route", targets=DisaggTargets((0.25, 0.75), (1.0, 1.0)))
    pre.setup(v)
    assert pre.order(v) == [1, 0]
    # the batch (500 tokens at most) takes class 1's head (200); its next head (400) does not fit, which ends
    # class 1's turn; then class 0's heads 0 (300 in all) and 2 (400), then 4 (450)
    assert pre.pull(v, 0) == [1, 0, 2, 4]
    # with its free KV at 350 tokens, instance 1 stops at 300
    v.prefill_free_kv[1] = 350
    assert pre.pull(v, 1) == [1, 0]
    # equal deviations (an idle pool of one instance): the class whose head arrived first
    v = _view(n_prefill=1, prompt=[100, 200])
    v.gate[1].append(0)
    v.gate[0].append(1)
    assert pre.order(v) == [1, 0]


def test_gate_and_route_forms_single_class_batches_in_the_engine():
    # one prefill instance; requests 0 (class 0) at t = 0 starts alone; 1 (class 1), 2 (class 0), 3 (class 1)
    # arrive during it. Class 1 has the larger share, so the next batch holds 1 and 3, then 2 -- FCFS
    # (distserve-fcfs) would batch 1, 2, 3 together.
    t = DisaggTargets((0.2, 0.8), (1.0, 1.0))
    arr, P, O, C = [0.0, 0.001, 0.002, 0.003], [100, 100, 100, 100], [2] * 4, [0, 1, 0, 1]
    s = replay_disaggregated(Pool(LAW, max_tokens=200), Pool(LAW), arr, P, O, cls=C, policy="gate-and-route",
                             targets=t, **LINK)
    # batch of one 100-token prompt: 0.010 + 0.1 + 1e-7 * 1e4 = 0.111 s; of two: 0.010 + 0.2 + 0.002 = 0.212
    assert s.prefill_start == pytest.approx([0.0, 0.111, 0.323, 0.111])
    assert s.first_token == pytest.approx([0.111, 0.323, 0.434, 0.323])
    f = replay_disaggregated(Pool(LAW, max_tokens=300), Pool(LAW), arr, P, O, cls=C, **LINK)
    assert f.prefill_start == pytest.approx([0.0, 0.111, 0.111, 0.111])


def test_queueing_in_each_pool_is_recorded():
    # one request: no wait for prefill; prefill ends 0.010 + 0.010 + 1e-7 x 100 = 0.02001, the transfer
    # takes 0.012, its first decode step starts at 0.03201
    s = replay_disaggregated(Pool(LAW), Pool(LAW), [0.0], [10], [3], **LINK)
    assert s.prefill_wait == pytest.approx([0.0]) and s.decode_wait == pytest.approx([0.0])
    assert s.decode_start == pytest.approx([0.03201]) and s.policy == "distserve-fcfs"
    # two at once with a 10-token batch limit: the second waits 0.02001 for the prefill instance; its
    # transfer runs from 0.04002 to 0.05202, after the first's two decode steps (from 0.03201, about
    # 0.006 each) have ended, so it steps at once: no decode wait for either
    s = replay_disaggregated(Pool(LAW, max_tokens=10), Pool(LAW), [0.0, 0.0], [10, 10], [3, 3], **LINK)
    assert s.prefill_wait == pytest.approx([0.0, 0.02001]) and s.decode_wait == pytest.approx([0.0, 0.0])


def test_targets_from_the_lp():
    from fluidopt.fluid.disaggregated import DisaggClass, DisaggPools, solve_disaggregated

    classes = [DisaggClass("short", 2.0, 100, 50, tpot=0.05), DisaggClass("long", 1.0, 800, 200, tpot=0.05)]
    sol = solve_disaggregated(classes, DisaggPools(LAW, LAW, kv_tokens=20000), "min_gpus")
    t = targets_from_lp(sol)
    assert sum(t.prefill_share) == pytest.approx(1.0)
    assert t.prefill_share[1] / t.prefill_share[0] == pytest.approx(sol.prefill_instances[1] / sol.prefill_instances[0])
    for i in range(2):
        assert t.decode_per_instance[i] == pytest.approx(
            sol.decode_instances[i] / sol.decode_instances_total * sol.decode_batch[i])


@pytest.mark.parametrize("name, fragment", [
    ("fifo", "no such policy"), ("least-lod", "did you mean 'least-load'"), ("a/b/c", "NAME or PREFILL/DECODE"),
    ("gate-and-route", "needs the disaggregated LP's targets"), ("round-robin/gate-and-route", "targets"),
])
def test_bad_policy_names(name, fragment):
    with pytest.raises(UsageError, match=fragment):
        make_policy(name)


def test_gate_targets_must_match_the_classes():
    with pytest.raises(UsageError, match="one target per class"):
        replay_disaggregated(Pool(LAW), Pool(LAW), [0.0], [10], [3], cls=[2], policy="gate-and-route",
                             targets=TARGETS, **LINK)


# ------------------------------------------------------------------------------------------------ identities


def _requests(n=160, seed=4, gap=0.06):
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(gap, n))
    arr[5] = arr[6] = arr[4]  # simultaneous arrivals share a batch
    P = rng.integers(1, 300, n)
    O = rng.integers(1, 60, n)
    return arr, P, O, (P > 150).astype(int)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_conservation_and_littles_law_per_pool(policy):
    """check=True: the engine's census after every event adds up to the arrivals (else AssertionError).
    Little's law on the closed window [first arrival, last completion] of a run that empties: the time
    average of the census's count in each pool equals the completion rate times the mean sojourn there,
    computed from the per-request timestamps. The prefill pool holds a request from its arrival to its
    first token; the decode pool from its first token to its last (waiting for KV, the link, decoding)."""
    arr, P, O, C = _requests()
    s = replay_disaggregated(Pool(LAW, instances=2, kv_tokens=1500, max_tokens=600),
                             Pool(LAW, instances=3, kv_tokens=600), arr, P, O, cls=C, policy=policy, targets=TARGETS,
                             check=True, **LINK)
    ev = s.events
    k = {name: 1 + i for i, name in enumerate(STAGES)}
    n = len(arr)
    assert s.counts == dict(arrived=n, prefilled=n, transferred=int((O > 1).sum()), finished=n, rejected=0)
    assert (ev[:, k["arrived"]] == ev[:, 2:].sum(axis=1)).all()  # the identity, row by row
    assert ev[-1, k["done"]] == n and ev[0, 0] == arr[0] and ev[-1, 0] == np.nanmax(s.finish)
    assert s.preemptions.sum() > 0  # the small decode caches made every policy swap
    T = ev[-1, 0] - ev[0, 0]
    dt = np.diff(ev[:, 0])
    in_prefill = ev[:-1, k["wait_prefill"]] + ev[:-1, k["prefilling"]]
    in_decode = ev[:-1, k["wait_transfer"]] + ev[:-1, k["transferring"]] + ev[:-1, k["decoding"]]
    moved = O > 1
    for N, sojourn in ((in_prefill, s.first_token - s.arrival), (in_decode, (s.finish - s.first_token)[moved])):
        L = float(N @ dt) / T
        lam, W = len(sojourn) / T, float(np.mean(sojourn))
        assert L == pytest.approx(lam * W, rel=1e-9)
    # and the census's finished count agrees with the finish times at every event
    t = ev[:, 0]
    assert (ev[:, k["done"]] == np.searchsorted(np.sort(s.finish), t, side="right")).all()


def test_every_policy_is_reproducible_and_uses_every_instance():
    arr, P, O, C = _requests(seed=9, gap=0.02)
    for policy in POLICY_NAMES:
        runs = [replay_disaggregated(Pool(LAW, instances=2), Pool(LAW, instances=3, kv_tokens=4000), arr, P, O, cls=C,
                                     policy=policy, targets=TARGETS, **LINK) for _ in range(2)]
        a, b = runs
        assert np.array_equal(a.finish, b.finish) and np.array_equal(a.decode_instance, b.decode_instance)
        assert set(a.prefill_instance) == {0, 1} and set(a.decode_instance[O > 1]) == {0, 1, 2}, policy


# ------------------------------------------------------------------------------------------------ distserve-fcfs


def _fingerprint(s) -> str:
    h = hashlib.sha256()
    for a in (s.arrival, s.first_token, s.finish, s.preemptions, s.transfer_start, s.transfer_end, s.prefill_instance,
              s.decode_instance):
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(repr((s.iterations, s.prefill_iterations, sorted(s.counts.items()))).encode())
    return h.hexdigest()[:16]


def test_distserve_fcfs_reproduces_the_engine_before_policies():
    """The digests of every output array, recorded from the engine at main 3e2b36d (routing hard-coded:
    fewest queued prompt tokens, round robin to decode), on three layouts: several instances with swaps,
    one of each with engine costs, and prompts rejected for the prefill KV with batch limits."""
    rng = np.random.default_rng(4)
    n = 400
    arr = np.cumsum(rng.exponential(0.02, n))
    arr[5] = arr[6] = arr[4]
    P, O = rng.integers(1, 300, n), rng.integers(1, 120, n)
    cases = {
        "5e9dd107a9a483db": (Pool(LAW, instances=2, kv_tokens=2000, max_tokens=600), Pool(LAW, instances=3, kv_tokens=1200)),
        "29887f65e3069ff9": (Pool(LAW, overhead=0.003), Pool(LAW, kv_tokens=3000, request_overhead=2e-4)),
        "ba720059bd863fe3": (Pool(LAW, instances=3, kv_tokens=250, max_tokens=400, max_batch=3),
                             Pool(LAW, instances=2, kv_tokens=1600, max_batch=6)),
    }
    for digest, (pre, dec) in cases.items():
        for policy in ("distserve-fcfs", "distserve-fcfs/round-robin"):
            assert _fingerprint(replay_disaggregated(pre, dec, arr, P, O, policy=policy, **LINK)) == digest


# every time a multiple of 2^-10 s: events tie in time (the heap's insertion order decides), on purpose
LATTICE = IterationLaw(PrefillLaw(0.125, 2.0 ** -10, 0.0), DecodeLaw((0.0625, 0.0, 2.0 ** -6), None, 10**9))


def _full_fingerprint(s) -> str:
    """:func:`_fingerprint` plus the prefill and decode start times and the census (``check=True``)."""
    h = hashlib.sha256(_fingerprint(s).encode())
    for a in (s.prefill_start, s.decode_start) + (() if s.events is None else (s.events,)):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def test_every_policy_reproduces_the_engine_before_its_speed_work():
    """Digests recorded from the engine at main a14d418, before the event loop was made faster (issue 44,
    "Speed"), for every policy on two layouts that swap: the identity test's requests on 2 + 3 instances,
    and a lattice of times (ties between events everywhere) on 2 + 2 instances with batch limits, with the
    census. The swaps are counted too, so a digest cannot pass on a run that never swaps."""
    arr, P, O, C = _requests()
    rng = np.random.default_rng(5)
    arr2 = np.cumsum(rng.integers(0, 4, 160) / 8.0)
    P2, O2 = rng.integers(1, 100, 160), rng.integers(1, 30, 160)
    expected = {
        "distserve-fcfs": ("803a1310f81d6ea9", "2d6e1d05a35a5578", 25, 13),
        "round-robin": ("28cbeeee2d4d50af", "2600bb28db40b907", 23, 10),
        "least-load": ("f28cf74679ecf11f", "0d958daaa4175002", 8, 5),
        "gate-and-route": ("dae84ef049f26162", "12fbba4ebd0bc65b", 25, 6),
        "least-load/gate-and-route": ("98fe4e1de6a88f08", "54ab6fc440a09795", 3, 6),
        "gate-and-route/round-robin": ("50e080e952d62287", "ef4b1f7ef5f92dfb", 9, 12),
    }
    assert set(expected) == set(POLICY_NAMES)
    for policy, want in expected.items():
        s = replay_disaggregated(Pool(LAW, instances=2, kv_tokens=1500, max_tokens=600),
                                 Pool(LAW, instances=3, kv_tokens=600), arr, P, O, cls=C, policy=policy,
                                 targets=TARGETS, **LINK)
        t = replay_disaggregated(Pool(LATTICE, instances=2, kv_tokens=800, max_batch=4),
                                 Pool(LATTICE, instances=2, kv_tokens=500, max_batch=5), arr2, P2, O2,
                                 cls=(P2 > 50).astype(int), policy=policy, targets=TARGETS, check=True,
                                 kv_bytes_per_token=1, link_bandwidth=1024.0, link_latency=0.125)
        got = (_full_fingerprint(s), _full_fingerprint(t), int(s.preemptions.sum()), int(t.preemptions.sum()))
        assert got == want, policy


# ------------------------------------------------------------------------------------------------ attainment


def test_attainment_is_distserves_definition_in_both_places():
    """A one-token request has TPOT 0 (DistServe: ``tpot = 0 if output_len == 1``) and attains on TTFT
    alone; a rejected request (NaN) misses TTFT and TPOT. Replay.attainment and the placement search's
    shares are the same function."""
    from fluidopt.planning.placement import _attained

    # 10-token prompts: 0.020 s prefill; r0 one token, r1 three tokens, r2 rejected (prefill KV 50 tokens)
    s = replay_disaggregated(Pool(LAW, kv_tokens=50), Pool(LAW), [0.0, 1.0, 2.0], [10, 10, 60], [1, 3, 3], **LINK)
    assert s.tpot[0] == 0.0 and math.isnan(s.tpot[2]) and s.counts["rejected"] == 1
    # TTFT bound 0.03 s: r0, r1 attain it; TPOT bound 0.001 s: only r0 (its TPOT is 0)
    assert attained(s.ttft, s.tpot, 0.03, 0.001) == pytest.approx((1 / 3, 2 / 3, 1 / 3))
    assert _attained(s.ttft, s.tpot, 0.03, 0.001) == attained(s.ttft, s.tpot, 0.03, 0.001)
    assert s.attainment(0.03, 0.001) == pytest.approx(1 / 3) and s.attainment(0.03, 1.0) == pytest.approx(2 / 3)
