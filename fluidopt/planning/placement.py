"""Where to run prefill and decode on a fleet of G GPUs: DistServe's placement search, with the fluid
LP as the first guess and replay as the check (docs/planning.md, "Placement").

A *split* is ``n_p`` prefill instances of TP ``t_p`` and ``n_d`` decode instances of TP ``t_d``
(disaggregated), or ``n`` instances of TP ``t`` that each prefill and decode (colocated). Its
*goodput* is the largest Poisson arrival rate (requests/s) at which the share of requests that attain
their SLO (TTFT < ``ttft`` and TPOT < ``tpot``, DistServe's definition) is at least ``attainment``;
its goodput per GPU divides by the GPUs the split uses. :func:`search_placement` tries every split
of at most ``gpus`` GPUs from the TP degrees given and returns them ranked.

How a split's goodput is found:

* **Requests**: ``requests`` arrivals of a Poisson process (exponential gaps drawn once with
  ``seed`` and divided by the rate, so every rate sees the same requests at the same relative times),
  each with a (prompt, output) pair drawn with replacement from the lengths given (e.g. measured runs).
* **Replay**: disaggregated splits run through
  :func:`fluidopt.engines.disaggregated.replay_disaggregated` (prefill batches of whole prompts, the
  KV transfer, decode continuous batching with its KV limit); a colocated split runs one instance of
  the ``colocated_engine`` (default ``vllm``) of :mod:`fluidopt.engines` at ``rate / n``: a Poisson
  stream split at random over ``n`` instances gives each an independent Poisson stream of that rate,
  so one instance's attainment is the split's.
* **First guess**: the fluid bound of the split, ``min(n_p / N_p, n_d / N_d)`` where ``N_p`` and
  ``N_d`` are the prefill and decode instances per request/s of the disaggregated LP
  (:func:`fluidopt.fluid.disaggregated.solve_disaggregated`, minimum GPUs, the sampled requests as
  classes, without the TTFT/TPOT rows, which bind only on means). Bisection on the rate between 0 and
  a bracket that starts at that bound (doubled while the attainment still holds) stops when the bracket
  is within ``rtol`` of its top. Before it, the first :data:`IDLE_REQUESTS` requests are replayed
  each alone: a split that misses the attainment even so has goodput 0.

Times in seconds, rates in requests/s, lengths in tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fluidopt.calibration.timemodels import IterationLaw
from fluidopt.core.errors import UsageError

LAYOUTS = ("colocated", "disaggregated")
_IDLE_RATE = 1e-9  # requests/s: far enough apart that each request runs alone
IDLE_REQUESTS = 300  # requests replayed alone to find a split that misses the SLO at any rate
COLUMNS = ("layout", "prefill_tp", "prefill_instances", "decode_tp", "decode_instances", "gpus", "fluid_rate",
           "goodput", "goodput_per_gpu", "attainment", "ttft_attainment", "tpot_attainment", "replays")


@dataclass(frozen=True)
class Split:
    """One placement. Disaggregated: ``prefill_instances`` of TP ``prefill_tp`` and ``decode_instances``
    of TP ``decode_tp``. Colocated: ``prefill_instances`` instances of TP ``prefill_tp`` that do both
    (the decode fields repeat them)."""

    layout: str
    prefill_tp: int
    prefill_instances: int
    decode_tp: int
    decode_instances: int

    @property
    def gpus(self) -> int:
        if self.layout == "colocated":
            return self.prefill_tp * self.prefill_instances
        return self.prefill_tp * self.prefill_instances + self.decode_tp * self.decode_instances

    def label(self) -> str:
        if self.layout == "colocated":
            return f"colocated {self.prefill_instances} x TP{self.prefill_tp}"
        return (f"prefill {self.prefill_instances} x TP{self.prefill_tp} + decode {self.decode_instances} x "
                f"TP{self.decode_tp}")


def splits(gpus: int, tps: Sequence[int], layouts: Sequence[str] = LAYOUTS) -> list[Split]:
    """Every split of at most ``gpus`` GPUs from the TP degrees ``tps``, colocated first."""
    out: list[Split] = []
    tps = sorted(set(int(t) for t in tps))
    if "colocated" in layouts:
        out += [Split("colocated", t, n, t, n) for t in tps for n in range(1, gpus // t + 1)]
    if "disaggregated" in layouts:
        for tp in tps:
            for npre in range(1, gpus // tp + 1):
                left = gpus - tp * npre
                for td in tps:
                    out += [Split("disaggregated", tp, npre, td, nd) for nd in range(1, left // td + 1)]
    return out


def checked_splits(gpus: int, tps: Sequence[int], layouts: Sequence[str] = LAYOUTS) -> list[Split]:
    """:func:`splits`, or :class:`UsageError` when there is none (a fleet too small for a decode pool
    beside the prefill pool, or for one instance)."""
    todo = splits(gpus, tps, layouts)
    if not todo:
        least = min(int(t) for t in tps)
        need = (f"a disaggregated split needs a decode pool beside its prefill pool: at least {2 * least} GPUs at "
                f"TP {least}") if "colocated" not in layouts else f"an instance needs at least {least} GPUs at TP {least}"
        raise UsageError(f"--gpus {gpus}: no split fits; {need}")
    return todo


@dataclass(frozen=True)
class PlacementResult:
    """What :func:`search_placement` found. ``table``: one row per split tried (:data:`COLUMNS`), best
    goodput per GPU first; ``best``: that first row as a dict; ``best_on_fleet``: the best split using
    all ``gpus`` (goodput per GPU of the whole fleet), or None; ``settings``: what the search used."""

    table: pd.DataFrame
    gpus: int
    settings: Mapping[str, object] = field(default_factory=dict)

    @property
    def best(self) -> dict:
        return self.table.iloc[0].to_dict()

    @property
    def best_on_fleet(self) -> dict | None:
        full = self.table[self.table["gpus"] == self.gpus]
        return None if full.empty else full.iloc[0].to_dict()

    def to_dict(self) -> dict:
        rows = [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
                for r in self.table.to_dict(orient="records")]
        return {"gpus": self.gpus, "best": rows[0] if rows else None,
                "best_on_fleet": next((r for r in rows if r["gpus"] == self.gpus), None),
                "splits": rows, "settings": dict(self.settings)}


def _attained(ttft: np.ndarray, tpot: np.ndarray, slo_ttft: float, slo_tpot: float) -> tuple[float, float, float]:
    # one definition with Replay.attainment (DistServe's: a one-token request has TPOT 0 and attains on
    # TTFT alone; a rejected request, NaN TTFT and TPOT, misses both, the TPOT share included)
    from fluidopt.engines.stepper import attained

    return attained(ttft, tpot, slo_ttft, slo_tpot)


def search_placement(law_of: Callable[[int], IterationLaw], kv_of: Callable[[int], float | None], prompt, output, *,
                     gpus: int, tps: Sequence[int], ttft: float = 0.2, tpot: float = 0.1, attainment: float = 0.9,
                     layouts: Sequence[str] = ("disaggregated",), kv_bytes_per_token: float | None = None,
                     link_bandwidth: float | None = None, link_latency: float = 0.0, prefill_overhead: float = 0.0,
                     decode_request_overhead: float = 0.0, prefill_max_tokens: int = 2048,
                     colocated_engine: str = "vllm", colocated_law_of: Callable[[int], IterationLaw] | None = None,
                     colocated_kv_of: Callable[[int], float | None] | None = None, requests: int = 2000, seed: int = 0, rtol: float = 0.01,
                     progress: Callable[[Split, dict], None] | None = None) -> PlacementResult:
    """Rank every split of at most ``gpus`` GPUs by goodput per GPU (see the module docstring).

    ``law_of(tp)``: the iteration-time law of an instance of TP ``tp``; ``kv_of(tp)``: its KV capacity
    (tokens; None: unlimited). ``prompt``, ``output``: the lengths requests are drawn from (tokens).
    ``prefill_overhead`` (s per prefill batch) and ``decode_request_overhead`` (s per request of a decode
    step) add the engine's CPU costs a kernel-only profile omits (the disaggregated replay's
    ``--fit-costs``). Colocated splits run ``colocated_law_of`` / ``colocated_kv_of`` (default: the
    same as the disaggregated pools; a colocated engine such as vLLM has its own profile and costs).
    ``progress(split, row)`` is called after each split."""
    from fluidopt.engines.disaggregated import NVLINK_A100

    if isinstance(gpus, bool) or not isinstance(gpus, (int, np.integer)) or gpus < 1:
        raise UsageError(f"--gpus {gpus!r}: expected an integer >= 1")
    if not tps or any(isinstance(t, bool) or int(t) != t or t < 1 for t in tps):
        raise UsageError(f"--tp {list(tps)!r}: expected TP degrees, integers >= 1")
    bad = [x for x in layouts if x not in LAYOUTS]
    if bad or not layouts:
        raise UsageError(f"--layout {bad[0] if bad else ''!r}: expected {' or '.join(LAYOUTS)}")
    for name, v in (("--slo-ttft-ms", ttft), ("--slo-tpot-ms", tpot)):
        if not (v > 0 and math.isfinite(v)):
            raise UsageError(f"{name}: expected a time > 0, got {v}")
    if not 0 < attainment < 1:
        raise UsageError(f"--attainment {attainment}: expected a share in (0, 1)")
    if requests < 10:
        raise UsageError(f"--requests {requests}: expected at least 10 simulated requests per rate")
    P = np.asarray(prompt, dtype=np.int64)
    O = np.asarray(output, dtype=np.int64)
    if P.size == 0 or P.shape != O.shape or (P < 1).any() or (O < 1).any():
        raise UsageError("lengths: expected as many prompt as output lengths, at least one, every one >= 1 token")
    if kv_bytes_per_token is None and "disaggregated" in layouts:
        raise UsageError("a disaggregated split needs the KV bytes per token (the model's shape) for its transfers")
    link = dict(kv_bytes_per_token=kv_bytes_per_token, link_bandwidth=link_bandwidth or NVLINK_A100,
                link_latency=link_latency)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, P.size, requests)
    unit = np.cumsum(rng.exponential(1.0, requests))
    unit -= unit[0]
    prompts, outputs = P[pick], O[pick]
    laws = {"disaggregated": _cached(law_of, kv_of),
            "colocated": _cached(colocated_law_of or law_of, colocated_kv_of or kv_of)}
    per_rate: dict = {}  # (layout, TP of prefill, TP of decode) -> the LP's instances per request/s
    todo = checked_splits(int(gpus), tps, layouts)
    rows = []
    for sp in todo:
        get = laws[sp.layout]
        key = (sp.layout, sp.prefill_tp, sp.decode_tp)
        if key not in per_rate:
            per_rate[key] = _instances_per_rate(sp, get, prompts, outputs, prefill_max_tokens)
        guess = _fluid_rate(sp, *per_rate[key])
        evaluate = _evaluator(sp, get, unit, prompts, outputs, ttft, tpot, link, prefill_overhead,
                              decode_request_overhead, prefill_max_tokens, colocated_engine)
        rate, att, n = _goodput(evaluate, guess, attainment, rtol)
        row = dict(layout=sp.layout, prefill_tp=sp.prefill_tp, prefill_instances=sp.prefill_instances,
                   decode_tp=sp.decode_tp, decode_instances=sp.decode_instances, gpus=sp.gpus, fluid_rate=guess,
                   goodput=rate, goodput_per_gpu=rate / sp.gpus, attainment=att[0], ttft_attainment=att[1],
                   tpot_attainment=att[2], replays=n)
        rows.append(row)
        if progress is not None:
            progress(sp, row)
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table = table.sort_values(["goodput_per_gpu", "gpus"], ascending=[False, True], kind="stable").reset_index(drop=True)
    settings = dict(ttft=ttft, tpot=tpot, attainment=attainment, tps=sorted(set(int(t) for t in tps)),
                    layouts=list(layouts), requests=requests, seed=seed, rtol=rtol, prefill_overhead=prefill_overhead,
                    decode_request_overhead=decode_request_overhead, prefill_max_tokens=prefill_max_tokens,
                    colocated_engine=colocated_engine, link_bandwidth=link["link_bandwidth"],
                    link_latency=link_latency, kv_bytes_per_token=kv_bytes_per_token)
    return PlacementResult(table, int(gpus), settings)


def _cached(law_of, kv_of):
    cache: dict = {}

    def get(tp: int):
        if tp not in cache:
            cache[tp] = (law_of(tp), kv_of(tp))
        return cache[tp]
    return get


def _instances_per_rate(sp: Split, get, prompts, outputs, max_tokens: int) -> tuple[float, float]:
    """(N_p, N_d): prefill and decode instances per request/s of the disaggregated LP at the split's TP
    degrees (NaN where the LP has no solution). They do not depend on the instance counts, so the search
    solves one LP per pair of TP degrees."""
    from fluidopt.fluid.disaggregated import DisaggClass, DisaggPools, solve_disaggregated

    # the distinct lengths of the sample as classes (rates: their shares of one request/s)
    pairs, counts = np.unique(np.column_stack([prompts, outputs]), axis=0, return_counts=True)
    classes = [DisaggClass(f"r{i}", float(c) / len(prompts), float(p), float(o))
               for i, ((p, o), c) in enumerate(zip(pairs, counts))]
    (lp, _), (ld, kv) = get(sp.prefill_tp), get(sp.decode_tp)
    try:
        pools = DisaggPools(lp, ld, sp.prefill_tp, sp.decode_tp,
                            kv_tokens=math.inf if kv is None else float(kv), max_tokens=float(max_tokens))
        sol = solve_disaggregated(classes, pools, "min_gpus")
    except Exception:  # an LP without a solution gives no first guess; the bracket search still runs
        return math.nan, math.nan
    if sol.status != "optimal" or not (sol.prefill_instances_total > 0 and sol.decode_instances_total > 0):
        return math.nan, math.nan
    return sol.prefill_instances_total, sol.decode_instances_total


def _fluid_rate(sp: Split, n_p: float, n_d: float) -> float:
    """The split's fluid bound (requests/s) from the LP's instances per request/s (NaN where it has none)."""
    if sp.layout == "colocated":
        # an instance that does both spends its time on each: the instance shares add (a first guess only)
        return sp.prefill_instances / (n_p + n_d)
    return min(sp.prefill_instances / n_p, sp.decode_instances / n_d)


def _evaluator(sp: Split, get, unit, prompts, outputs, ttft, tpot, link, prefill_overhead,
               decode_request_overhead, max_tokens, engine_name):
    from fluidopt.engines import engine_config, replay
    from fluidopt.engines.disaggregated import Pool, replay_disaggregated

    if sp.layout == "colocated":
        law, kv = get(sp.prefill_tp)
        cfg = engine_config(engine_name, kv_tokens=None if kv is None else int(kv))

        def run(rate: float, first: int | None = None) -> tuple[float, float, float]:
            k = slice(None, first)
            r = replay(law, cfg, unit[k] / (rate / sp.prefill_instances), prompts[k], outputs[k])
            return _attained(r.ttft, r.tpot, ttft, tpot)
        return run
    lp, kp = get(sp.prefill_tp)
    ld, kd = get(sp.decode_tp)
    pre = Pool(lp, instances=sp.prefill_instances, kv_tokens=None if kp is None else int(kp), max_tokens=max_tokens,
               overhead=prefill_overhead)
    dec = Pool(ld, instances=sp.decode_instances, kv_tokens=None if kd is None else int(kd),
               request_overhead=decode_request_overhead)

    def run(rate: float, first: int | None = None) -> tuple[float, float, float]:
        k = slice(None, first)
        r = replay_disaggregated(pre, dec, unit[k] / rate, prompts[k], outputs[k], **link)
        return _attained(r.ttft, r.tpot, ttft, tpot)
    return run


def _goodput(evaluate, guess: float, target: float, rtol: float) -> tuple[float, tuple[float, float, float], int]:
    """The largest rate whose attainment is >= target (bisection), its attainments and the replays run."""
    # at a vanishing rate no two requests overlap: a split that misses the target there (prompts too long
    # for the TTFT bound at this TP degree, say) has no goodput at all. Alone, a request decodes one step
    # per token, the most steps any rate costs, so this check replays only the first IDLE_REQUESTS.
    idle = evaluate(_IDLE_RATE, IDLE_REQUESTS)
    if idle[0] < target:
        return 0.0, idle, 1
    n = 1
    hi = guess if guess > 0 and math.isfinite(guess) else 1.0
    lo, lo_att = 0.0, idle
    while True:  # the bracket's top: attainment fails there
        a = evaluate(hi)
        n += 1
        if a[0] < target:
            break
        lo, lo_att = hi, a
        hi *= 2.0
        if hi > 1e6:  # pragma: no cover - a law that never saturates
            return math.inf, a, n
    while hi - lo > rtol * hi:
        mid = 0.5 * (lo + hi)
        a = evaluate(mid)
        n += 1
        if a[0] >= target:
            lo, lo_att = mid, a
        else:
            hi = mid
    return lo, lo_att, n
