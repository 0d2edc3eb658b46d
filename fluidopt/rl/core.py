"""The RL router's MDP pieces, without torch or gymnasium: state, reward, mixing estimate, episodes.

:class:`RouterCore` is an :class:`~fluidopt.control.instance.InstanceScheduler` (vLLM-like instances:
prefill first, no chunking, KV capacity, recompute preemption) whose ``route`` holds every arrival
in the central router queue; a driver (the Gymnasium environment, or the shipped policies'
``on_tick``) sends the head-of-line request to an instance every decision epoch (0.02 s), or waits.
It keeps, from the events it sees, everything the state and the reward need in O(1) per event:

* per instance g: requests in prompt phase (routed to g, prefill not finished), unfinished requests
  routed to g by predicted decode bucket, their prompt + predicted output tokens (the mixing
  estimate's load), prompt tokens queued at g (free capacity net of the queue), and the requests
  decoding on g with their predictions;
* globally: the sum of 1 / T_j over unfinished requests (T_j: ideal completion time, prefill plus
  predicted output at solo decode speed), the progress already banked by preempted requests, and
  the number of completions.

State (``obs``, 6 m + 3 floats in [0, 1]; 27 for m = 4), per instance g:
``[prompt-phase count / B, bucket-0 count / B, bucket-1 count / B, bucket-2 count / B,
free capacity, earliest estimated completion / 10 s]`` (counts clipped at 1), then
``[min(router queue, 512) / 512, log2(1 + head prompt) / 12, head bucket / 2]``.
Free capacity = min(free slots / B, (free KV - prompts queued at g) / KV capacity), clipped to
[0, 1]. Earliest estimated completion = min over g's decoding requests of max(0, predicted - generated
output) x (tau_solo + kv_time_per_token x KV in use) seconds; 0 when nothing decodes.

Reward (per decision, docs/rl.md section 2): ``-P(t) x epochs elapsed + r_w x completions +
w_k x h``, with ``P = sum_j (1 / T_j)(1 - min(1, o_j / d_j))`` over unfinished requests (o_j output
generated, d_j predicted), ``r_w = 60``, and the guidance ``h = r_mix(chosen) - max_l r_mix(l) <= 0``
(0 for "wait").
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from fluidopt.control.instance import InstanceScheduler
from fluidopt.control.protocol import Context
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import GPUProfile, Scenario
from fluidopt.rl.predictors import BUCKET_TOKENS, NoisyOracle

__all__ = [
    "EPOCH",
    "QUEUE_CAP",
    "STATE_LAYOUT",
    "STATE_LAYOUTS",
    "STATE_LAYOUT_LOG",
    "WAIT_MASKS",
    "RewardConfig",
    "bucket_counts",
    "RouterCore",
    "episode_seed",
    "episode_workload",
    "in_system",
    "obs_dim",
    "small_large_groups",
]

EPOCH = 0.02
"""Seconds between decision epochs (the paper's minimum decode iteration)."""
QUEUE_CAP = 512
STATE_LAYOUT = "fluidopt-rl-state-v1"
"""Name of the state layout above; shipped weights record it and loading checks it."""
STATE_LAYOUT_LOG = "fluidopt-rl-state-v2-log"
"""The same entries, but the four count entries of an instance (prompts in prefill, the three bucket
counts) are ``log1p(count) / log1p(LOG_COUNT_CAP)`` (capped at 1) instead of ``count / B`` (capped
at 1): in a deep overload an instance holds hundreds of requests and ``count / B`` saturates, so
every loaded instance looks alike (docs/rl.md section 6b). Weights record which layout they read."""
STATE_LAYOUTS = (STATE_LAYOUT, STATE_LAYOUT_LOG)
LOG_COUNT_CAP = 8192  # requests: the log layout's count entry reaches 1 here
LOG1P_CAP = math.log1p(LOG_COUNT_CAP)
EST_SCALE = 10.0  # s: earliest-completion normaliser
VARIANTS = ("baseline", "wa", "wg")
CREDIT_OBJECTIVES = ("request-latency", "request-normalized", "request-excess")
"""The per-request credit objectives (docs/rl.md section 2): each dispatch credited with its own request's outcome."""
OBJECTIVES = ("latency", "revenue", "lost-revenue", "time-in-system") + CREDIT_OBJECTIVES
WAIT_MASKS = ("none", "fits", "reserve", "small-large")
"""Action masks (docs/rl.md section 2): ``none``, the paper's MDP (every action valid);
``fits``, wait is valid only when the head of the router queue fits on no instance
(:meth:`RouterCore.head_fits`); ``reserve``, the reserving hold rule's feasibility
(:meth:`RouterCore.reserve_feasible`): an instance is valid only when it can hold the head's prompt
plus its class's mean output, and wait is valid only when no instance can; ``small-large``, Dedicated
Small-Large's groups (:meth:`RouterCore.group_valid`): only the instances of the head's group (by
its predicted output) are valid, and wait never is."""


def bucket_counts(obs, g: int, layout: str = STATE_LAYOUT, batch: int = 128) -> tuple[int, int, int]:
    """Instance g's three bucket counts (requests) read back from a state vector of ``layout``
    (exact below the layout's cap: ``batch`` requests for v1, :data:`LOG_COUNT_CAP` for the log layout)."""
    if layout == STATE_LAYOUT_LOG:
        return tuple(int(round(math.expm1(float(obs[6 * g + j]) * LOG1P_CAP))) for j in (1, 2, 3))
    if layout == STATE_LAYOUT:
        return tuple(int(round(float(obs[6 * g + j]) * batch)) for j in (1, 2, 3))
    raise ScenarioError(f"bucket_counts: layout: expected one of {', '.join(STATE_LAYOUTS)}, got {layout!r}")


def obs_dim(m: int) -> int:
    """Length of the state vector for m instances (6 m + 3)."""
    return 6 * m + 3


@dataclass(frozen=True)
class RewardConfig:
    """The reward and its three variants (docs/rl.md section 2).

    ``variant``: ``"baseline"`` (progress + completions), ``"wa"`` (+ mixing guidance, weight 1),
    ``"wg"`` (+ guidance with weight gamma e^(-beta_d k) and discount gamma (1 - e^(-beta_d k)) in
    training episode k). ``grad1`` s per token (prefill cost), ``grad2`` per token (1 / KV capacity),
    ``eps`` s (prompt-latency threshold), ``alpha`` (prompt vs decode weight of the mixing estimate).
    ``objective``: ``"latency"`` (the paper's progress penalty + ``completion_reward`` per completion)
    or ``"revenue"`` (the prefill/decode paper's objective: c_p x prompt + c_d x output tokens of each
    completed request, in price units, with the class's prices; no progress penalty, no completion
    reward), or ``"lost-revenue"`` (minus the revenue c_p x prompt + c_d x output of each request
    that abandons or is dropped: over an episode, whose requests all resolve, its sum is the
    episode's revenue minus the revenue of all its arrivals, a constant, so it ranks policies as
    ``"revenue"`` does, but charges a loss when it happens instead of crediting a completion
    9-25 s after the decision; docs/rl.md section 2), or ``"time-in-system"`` (our ablation, not the
    paper's MDP: minus the integral over the step of the number of requests in the system, router
    queue included, in request-seconds, :meth:`RouterCore.time_in_system`; an episode's undiscounted
    sum is minus the total time in system of its requests, so it ranks policies exactly by mean
    end-to-end latency; docs/rl.md section 2), or ``"request-latency"`` / ``"request-normalized"`` /
    ``"request-excess"`` (per-request credit, our ablation: each dispatch is credited with its own
    request's time in system from dispatch, or that time with the realised output length replaced by
    the predicted one, or that time less the request's solo service time, when the request resolves;
    :class:`~fluidopt.rl.env.RouterEnv` hands the credits out as ``last_credits``; docs/rl.md section
    2); the guidance term is the same in all.
    """

    variant: str = "wg"
    completion_reward: float = 60.0
    alpha: float = 0.5
    grad1: float = 3.2e-4
    grad2: float = 1.0 / 30000.0
    eps: float = 1.0
    gamma: float = 0.99
    beta_d: float = 0.5
    objective: str = "latency"

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ScenarioError(f"reward: variant: expected one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if self.objective not in OBJECTIVES:
            raise ScenarioError(f"reward: objective: expected one of {', '.join(OBJECTIVES)}, got {self.objective!r}")

    def guidance_weight(self, k: int) -> float:
        """Weight of the guidance term h in training episode k (0-based)."""
        if self.variant == "baseline":
            return 0.0
        if self.variant == "wa":
            return 1.0
        return self.gamma * math.exp(-self.beta_d * k)

    def discount(self, k: int) -> float:
        """Training discount in episode k: gamma, or gamma (1 - e^(-beta_d k)) for WG-RL."""
        if self.variant == "wg":
            return self.gamma * (1.0 - math.exp(-self.beta_d * k))
        return self.gamma

    def r_mix(self, load: float, p: float, d: float) -> float:
        """Mixing estimate for sending a request (p prompt, d predicted output tokens) to an instance
        carrying ``load`` = sum of prompt + predicted output tokens of its unfinished requests."""
        tp = self.grad1 * (p + load)
        rp = 1.0 if tp <= self.eps else 1.0 - tp / self.eps
        rd = -self.grad2 * (load + p + d)
        return self.alpha * rp + (1.0 - self.alpha) * rd


class RouterCore(InstanceScheduler):
    """Instances plus the RL router's bookkeeping; holds every arrival for a driver to route.

    ``predictor``: a bucket predictor (``.bucket(ctx, r)``), default :class:`NoisyOracle` (0.79).
    ``pin``: {arrival index: instance} routed automatically, not by the driver (tests, scripted
    background load). ``chunked``: the instances run chunked prefill (Sarathi-style mixed iterations,
    the paper's Table 3) instead of whole-prompt prefills. Decision epochs are ticks every :data:`EPOCH` seconds; ``pause_on_decision``:
    at a tick with a request in the router queue, ask the engine to return from ``advance`` (the
    environment's decision points); ``pause_at_resolved``: return once that many requests are resolved.
    """

    name = "rl-router"
    tick_interval = EPOCH

    def __init__(self, gpu: GPUProfile, *, predictor=None, reward: RewardConfig | None = None,
                 pin: dict[int, int] | None = None, kv_watermark: float = 0.01, chunked: bool = False):
        super().__init__(chunked=chunked, kv_watermark=kv_watermark)
        self.gpu = gpu
        self.predictor = predictor if predictor is not None else NoisyOracle()
        self.reward = reward if reward is not None else RewardConfig()
        self.pin = dict(pin or {})
        self.pause_on_decision = False
        self.pause_at_resolved = -1
        self.predicted: list[int] | None = None  # buckets by arrival index (see precompute)
        self.log_requests = False  # log first tokens and departures (the per-request objectives)
        self.prices: tuple | None = None  # per-class (c_p, c_d): set to count revenue (the revenue objective)
        self.reserve_out: tuple[float, ...] | None = None  # per-class output tokens the reserve mask reserves
        self.groups: tuple[int, float] | None = None  # (small instances k, threshold tokens): the small-large mask
        self.layout = STATE_LAYOUT  # the state layout observe() fills (STATE_LAYOUTS)

    def precompute(self, workload) -> None:
        """Predict every request of a replayed trace in bulk, once (the predictor's ``predict_many``,
        bit-identical to asking per request); ``route`` uses it for the arrival with the same index,
        arrival time and output length, and asks the predictor otherwise."""
        from fluidopt.workloads.replay import TraceWorkload

        pm = getattr(self.predictor, "predict_many", None)
        if pm is None or not isinstance(workload, TraceWorkload):
            self.predicted = None
            return
        self._pre_t = workload.time.tolist()
        self._pre_o = workload.output.tolist()
        self.predicted = pm(workload.time, workload.cls, workload.prompt, workload.output).tolist()

    # -- setup and bookkeeping -------------------------------------------------------------------
    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        # service="markov" runs too (every registered controller does), but its state degenerates:
        # no KV cache and no output generated before completion. The RL setting is service="tokens".
        m = self.n
        self.B = ctx.batch
        cap = ctx.gpu_kv_free(0)
        self.K = None if cap == math.inf else float(cap)
        self.n_prompt = [0] * m
        self.cnt = [[0, 0, 0] for _ in range(m)]
        self.load = [0.0] * m
        self.qtok = [0] * m
        # Decoding requests per instance, in O(1) per query: every decode on g advances one token per
        # iteration of g, so o_j = V_g - c_j with V_g = gen(ref_g) + c_ref (one engine call) and c_j
        # fixed when j starts decoding. Progress sum_j (1/T_j) min(1, o_j / d_j) = sat_g + V_g A_g - C_g
        # (A_g = sum of 1/(T_j d_j), C_g = sum of c_j/(T_j d_j) over the unsaturated ones); a heap of
        # thresholds c_j + d_j moves a request to sat_g once it has produced its predicted output.
        self.dec: list[dict[int, list]] = [{} for _ in range(m)]  # r -> [serial, invT, w, c, d, saturated]
        self.heap: list[list] = [[] for _ in range(m)]  # (c + d, serial, r)
        self.ref = [-1] * m
        self.A = [0.0] * m
        self.C = [0.0] * m
        self.sat = [0.0] * m
        self._serial = 0
        self.rec: dict[int, list] = {}  # r -> [g, bucket, d, invT, p, pending prompt tokens, banked progress]
        self.held: dict[int, tuple] = {}  # r -> (bucket, d, invT) for requests in the router queue
        self.sum_invT = 0.0
        self.banked = 0.0
        self.completed = 0
        self.resolved = 0
        self.arrivals = 0
        self.router_wait = 0.0  # seconds requests spent in the router queue (summed at dispatch)
        # Time in system (the time-in-system objective): area(t) = sum of departure times of the resolved
        # + n_in t - sum of arrival times of all arrivals = request-seconds spent in the system up to t.
        self.n_in = 0
        self.s_arr = 0.0
        self.s_dep = 0.0
        # Per-request credit: with ``log_requests`` set, dispatch times, first-token times and departures are logged
        self.first_token: dict[int, float] | None = {} if self.log_requests else None
        self.departures: list | None = [] if self.log_requests else None  # (r, time, first token) in order
        self.revenue = 0.0  # price units of completed requests (only with ``prices``)
        self.lost = 0.0  # price units of requests that abandoned or were dropped (only with ``prices``)
        self._w: dict[int, float] = {}  # r -> its revenue on completion (only with ``prices``)
        self._ctx = ctx
        # The state vector, filled in place: the four count entries of instance g change only with
        # the counters above (dispatch, prefill done, gone, preempt), which mark g dirty; free
        # capacity and earliest completion move with every decode iteration and are refilled each call.
        self._vals = [0.0] * obs_dim(m)
        self._dirty = [True] * m
        if self.layout not in STATE_LAYOUTS:
            raise ScenarioError(f"RouterCore: layout: expected one of {', '.join(STATE_LAYOUTS)}, got {self.layout!r}")
        self._log_counts = self.layout == STATE_LAYOUT_LOG

    def _ideal_time(self, p: int, d: float) -> float:
        gpu = self.gpu
        return gpu.alpha + gpu.beta * p + d * gpu.tau_solo

    def route(self, ctx: Context, r: int) -> int | None:
        idx = self.arrivals
        self.arrivals = idx + 1
        pre = self.predicted
        if pre is not None and idx < len(pre) and ctx.req_arrival(r) == self._pre_t[idx] and ctx.req_output(r) == self._pre_o[idx]:
            b = pre[idx]
        else:
            b = self.predictor.bucket(ctx, r)
        d = BUCKET_TOKENS[b]
        invT = 1.0 / self._ideal_time(ctx.req_prompt(r), d)
        self.held[r] = (b, d, invT)
        self.sum_invT += invT
        self.n_in += 1
        self.s_arr += ctx.req_arrival(r)
        if self.prices is not None:  # read now: r is not to be used once it has left
            c = ctx.req_class(r)
            self._w[r] = self.prices[0][c] * ctx.req_prompt(r) + self.prices[1][c] * ctx.req_output(r)
        return self.pin.get(idx)

    def on_tick(self, ctx: Context) -> None:
        if self.pause_on_decision and ctx.qlen(self.router_queue):
            ctx.pause()

    def dispatch(self, ctx: Context, r: int, g: int) -> None:
        b, d, invT = self.held.pop(r)
        p = ctx.req_prompt(r)
        self.router_wait += ctx.now - ctx.req_arrival(r)
        self.rec[r] = [g, b, d, invT, p, p, 0.0]
        self._dirty[g] = True
        self.n_prompt[g] += 1
        self.cnt[g][b] += 1
        self.load[g] += p + d
        self.qtok[g] += p
        super().dispatch(ctx, r, g)

    def on_prefill_done(self, ctx: Context, r: int, g: int) -> None:
        rec = self.rec[r]
        h = rec[0]
        self._dirty[h] = True
        self.n_prompt[h] -= 1
        self.qtok[h] -= rec[5]
        rec[5] = 0
        if rec[6]:
            self.banked -= rec[6]
            rec[6] = 0.0
        if self.first_token is not None and r not in self.first_token:
            self.first_token[r] = ctx.now
        super().on_prefill_done(ctx, r, g)
        self._dec_add(ctx, h, r, rec[3], rec[2])

    def _V(self, ctx: Context, g: int) -> float:
        ref = self.ref[g]
        return ctx.req_generated(ref) + self.dec[g][ref][3]

    def _dec_add(self, ctx: Context, g: int, r: int, invT: float, d: float) -> None:
        dec = self.dec[g]
        o = ctx.req_generated(r)
        if dec:
            c = self._V(ctx, g) - o
        else:
            c = -float(o)
            self.ref[g] = r
        self._serial += 1
        w = invT / d
        dec[r] = [self._serial, invT, w, c, d, False]
        if o >= d:
            dec[r][5] = True
            self.sat[g] += invT
        else:
            self.A[g] += w
            self.C[g] += w * c
            heapq.heappush(self.heap[g], (c + d, self._serial, r))

    def _dec_remove(self, g: int, r: int) -> None:
        dec = self.dec[g]
        e = dec.pop(r, None)
        if e is None:
            return
        if not dec:
            self.A[g] = self.C[g] = self.sat[g] = 0.0
            self.heap[g].clear()
            self.ref[g] = -1
            return
        if e[5]:
            self.sat[g] -= e[1]
        else:
            self.A[g] -= e[2]
            self.C[g] -= e[2] * e[3]
        if self.ref[g] == r:
            self.ref[g] = next(iter(dec))

    def _settle(self, ctx: Context, g: int) -> float:
        """V_g now, after moving requests that reached their predicted output to the saturated sum."""
        V = self._V(ctx, g)
        h = self.heap[g]
        if h and h[0][0] <= V:
            self._saturate(g, V)
        return V

    def _saturate(self, g: int, V: float) -> None:
        """Move g's decoding requests whose threshold c + d is at most V to the saturated sum."""
        h = self.heap[g]
        dec = self.dec[g]
        while h and h[0][0] <= V:
            _, serial, r = heapq.heappop(h)
            e = dec.get(r)
            if e is not None and e[0] == serial and not e[5]:
                e[5] = True
                self.sat[g] += e[1]
                self.A[g] -= e[2]
                self.C[g] -= e[2] * e[3]

    def _gone(self, r: int) -> None:
        rec = self.rec.pop(r)
        g = rec[0]
        self._dirty[g] = True
        if rec[5]:
            self.n_prompt[g] -= 1
            self.qtok[g] -= rec[5]
        self.cnt[g][rec[1]] -= 1
        self.load[g] -= rec[4] + rec[2]
        self._dec_remove(g, r)
        self.sum_invT -= rec[3]
        if rec[6]:
            self.banked -= rec[6]
        self.resolved += 1

    def _depart(self, ctx: Context, r: int) -> None:
        self.n_in -= 1
        self.s_dep += ctx.now
        if self.departures is not None:  # (r, departure, first token or nan): r may be reused once it has left
            self.departures.append((r, ctx.now, self.first_token.pop(r, math.nan)))

    def time_in_system(self, t: float) -> float:
        """Request-seconds spent in the system (router queue, instance queues, service) by every
        arrival up to time t (t not before the last event seen): the sum over resolved requests of
        their time in system plus, for those still in it, t - arrival."""
        return self.s_dep + self.n_in * t - self.s_arr

    def on_decode_done(self, ctx: Context, r: int, g: int) -> None:
        self._gone(r)
        self._depart(ctx, r)
        self.completed += 1
        if self.prices is not None:
            self.revenue += self._w.pop(r)
        if self.resolved == self.pause_at_resolved:
            ctx.pause()

    def on_drop(self, ctx: Context, r: int, g: int) -> None:
        self._gone(r)
        self._depart(ctx, r)
        self.lost += self._w.pop(r, 0.0)
        if self.resolved == self.pause_at_resolved:
            ctx.pause()

    def on_abandon(self, ctx: Context, r: int, q: int) -> None:
        # scenarios with patience: r left from the router queue (never dispatched) or an instance queue
        held = self.held.pop(r, None)
        if held is not None:
            self.sum_invT -= held[2]
            self.resolved += 1
        elif r in self.rec:
            self._gone(r)
        self._depart(ctx, r)
        self.lost += self._w.pop(r, 0.0)
        if self.resolved == self.pause_at_resolved:
            ctx.pause()

    def on_preempt(self, ctx: Context, r: int, g: int) -> None:
        rec = self.rec[r]
        h = rec[0]
        self._dirty[h] = True
        gen = ctx.req_generated(r)
        pend = rec[4] + gen
        if rec[5]:
            self.qtok[h] += pend - rec[5]
        else:
            self.n_prompt[h] += 1
            self.qtok[h] += pend
        rec[5] = pend
        self._dec_remove(h, r)
        prog = rec[3] * min(1.0, gen / rec[2])
        self.banked += prog - rec[6]
        rec[6] = prog
        super().on_preempt(ctx, r, g)

    # -- the wait mask ---------------------------------------------------------------------------
    def head_fits(self, ctx: Context) -> int:
        """The first instance the head of the router queue fits on now, -1 if none (or no head).

        The head fits on instance g when g holds no request at all (an empty instance admits
        anything that fits its cache), or when g has a free batch slot counting the requests queued
        there (``instance_requests(g) < B``, the state's free-slot entry) and its free KV cache, less
        the prompts waiting in g's queue and the scheduler's watermark, holds the head's prompt (the
        state's free-capacity entry also subtracts the prompt in prefill, whose KV is already in use:
        it is conservative during a prefill). Under the
        ``fits`` mask "wait" is valid only when this is -1 (docs/rl.md section 2): sent now, the head
        would be admitted behind work already on that instance, and waiting cannot place it any
        earlier there (the router queue and the instance queues are FCFS, and nothing else is
        dispatched while the head waits); an idle fleet always fits, so a greedy policy can no longer
        wait for ever in a state that waiting does not change.
        """
        q = self.router_queue
        if not ctx.qlen(q):
            return -1
        p = ctx.req_prompt(ctx.head(q))
        B, K = self.B, self.K
        res = self._kv_reserve or 0.0
        for g in range(self.n):
            n_g = ctx.instance_requests(g)
            if n_g == 0:
                return g
            if n_g >= B:
                continue
            if K is None:
                return g
            waiting = self.qtok[g]  # prompt tokens queued at g, less the one in prefill (its KV is in use)
            pf = ctx.gpu_prefill(g)
            if pf >= 0:
                rec = self.rec.get(pf)
                if rec is not None:
                    waiting -= rec[5]
            if ctx.gpu_kv_free(g) - waiting - res >= p:
                return g
        return -1

    def reserve_feasible(self, ctx: Context) -> list[bool]:
        """Per instance, whether it can process the head of the router queue under the reserving hold
        rule (``max-capacity-reserve``, :class:`~fluidopt.control.load_balancers.MaxCapacity`): g holds
        no request, or g has a free batch slot counting its queue and its free KV cache, less the
        prompts waiting in its queue and the watermark, holds the head's prompt (plus any output it
        generated before a preemption) plus its class's mean output (``reserve_out``), capped at the
        usable cache. All False without a head."""
        q = self.router_queue
        m = self.n
        if not ctx.qlen(q):
            return [False] * m
        r = ctx.head(q)
        need = ctx.req_prompt(r) + ctx.req_generated(r)
        if self.reserve_out is None:
            raise ScenarioError("RouterCore: the reserve mask needs reserve_out (per-class output tokens)")
        need += self.reserve_out[ctx.req_class(r)]
        B, K = self.B, self.K
        res = self._kv_reserve or 0.0
        if K is not None:
            need = min(need, K - res)
        out = []
        for g in range(m):
            n_g = ctx.instance_requests(g)
            if n_g == 0:
                out.append(True)
                continue
            if n_g >= B:
                out.append(False)
                continue
            if K is None:
                out.append(True)
                continue
            waiting = self.qtok[g]
            pf = ctx.gpu_prefill(g)
            if pf >= 0:
                rec = self.rec.get(pf)
                if rec is not None:
                    waiting -= rec[5]
            out.append(ctx.gpu_kv_free(g) - waiting - res >= need)
        return out

    def group_valid(self, ctx: Context) -> list[bool]:
        """Per instance, whether it is in the head's Dedicated Small-Large group: instances 0..k-1 when
        the head's predicted output (its bucket's representative length) is at most the threshold,
        k..m-1 otherwise (the other group when its own is empty); ``groups`` = (k, threshold), as
        :class:`~fluidopt.control.load_balancers.SmallLarge` plans them. All False without a head."""
        q = self.router_queue
        m = self.n
        if not ctx.qlen(q):
            return [False] * m
        if self.groups is None:
            raise ScenarioError("RouterCore: the small-large mask needs groups (small instances, threshold)")
        k, thr = self.groups
        large = BUCKET_TOKENS[self.held[ctx.head(q)][0]] > thr
        lo, hi = (k, m) if large else (0, k)
        if hi <= lo:
            lo, hi = (0, k) if large else (k, m)
        return [lo <= g < hi for g in range(m)]

    def action_mask(self, ctx: Context, mask: str) -> list[bool]:
        """The valid actions now (m instances, then "wait") under ``mask`` (:data:`WAIT_MASKS`)."""
        m = self.n
        if mask == "small-large":
            return self.group_valid(ctx) + [False]
        if mask == "reserve":
            ok = self.reserve_feasible(ctx)
            return ok + [not any(ok)]
        return [True] * m + [self.wait_valid(ctx, mask)]

    def wait_valid(self, ctx: Context, mask: str) -> bool:
        """Whether "wait" is a valid action now under the wait mask ``mask`` (:data:`WAIT_MASKS`)."""
        if mask == "small-large":
            return False
        if mask == "reserve":
            return not any(self.reserve_feasible(ctx))
        return mask == "none" or self.head_fits(ctx) < 0

    # -- state, reward, guidance -----------------------------------------------------------------
    def progress_penalty(self, ctx: Context) -> float:
        """P = sum over unfinished requests of (1 / T_j)(1 - min(1, o_j / d_j)) (per epoch)."""
        done = self.banked
        for g in range(self.n):
            if self.dec[g]:
                V = self._settle(ctx, g)
                done += self.sat[g] + V * self.A[g] - self.C[g]
        return self.sum_invT - done

    def mixing(self, ctx: Context, r: int) -> list[float]:
        """r_mix(l) for sending waiting request r to each instance l."""
        d = self.held[r][1]
        p = ctx.req_prompt(r)
        # RewardConfig.r_mix inlined over the instances (the same arithmetic in the same order)
        rc = self.reward
        g1, eps, g2, al = rc.grad1, rc.eps, rc.grad2, rc.alpha
        be = 1.0 - al
        out = []
        for load in self.load:
            tp = g1 * (p + load)
            out.append(al * (1.0 if tp <= eps else 1.0 - tp / eps) + be * (-g2 * (load + p + d)))
        return out

    def guidance(self, ctx: Context, r: int, a: int) -> float:
        """h = r_mix(a) - max_l r_mix(l) (<= 0) for action a; 0 for 'wait' (a == m)."""
        if a >= self.n:
            return 0.0
        mx = self.mixing(ctx, r)
        return mx[a] - max(mx)

    def observe(self, ctx: Context) -> np.ndarray:
        """The normalised state vector (float32, length 6 m + 3)."""
        return self.observe_with_penalty(ctx)[0]

    def observe_with_penalty(self, ctx: Context) -> tuple[np.ndarray, float]:
        """(state vector, progress penalty P) in one pass over the instances (the environment's step)."""
        B = float(self.B)
        K = self.K
        gpu = self.gpu
        tau0 = gpu.tau_solo
        kvt = gpu.kv_time_per_token or 0.0
        inst = ctx.instance_requests
        kvused = ctx.gpu_kv_used
        gen = ctx.req_generated
        vals = self._vals
        dirty = self._dirty
        qtok = self.qtok
        decs, heaps, refs = self.dec, self.heap, self.ref
        sat, A, C = self.sat, self.A, self.C
        done = self.banked
        i = 0
        for g in range(self.n):
            if dirty[g]:  # the count entries change only with the counters (see setup)
                dirty[g] = False
                c = self.cnt[g]
                if self._log_counts:
                    npf = math.log1p(self.n_prompt[g]) / LOG1P_CAP
                    c0 = math.log1p(c[0]) / LOG1P_CAP
                    c1 = math.log1p(c[1]) / LOG1P_CAP
                    c2 = math.log1p(c[2]) / LOG1P_CAP
                else:
                    npf = self.n_prompt[g] / B
                    c0 = c[0] / B
                    c1 = c[1] / B
                    c2 = c[2] / B
                vals[i] = npf if npf < 1.0 else 1.0
                vals[i + 1] = c0 if c0 < 1.0 else 1.0
                vals[i + 2] = c1 if c1 < 1.0 else 1.0
                vals[i + 3] = c2 if c2 < 1.0 else 1.0
            free = (B - inst(g)) / B
            kvu = kvused(g)
            if K is not None:
                k = (K - kvu - qtok[g]) / K
                if k < free:
                    free = k
            vals[i + 4] = 0.0 if free < 0.0 else (1.0 if free > 1.0 else free)
            est = 0.0
            dec = decs[g]
            if dec:
                ref = refs[g]
                V = gen(ref) + dec[ref][3]  # _settle, inlined
                h = heaps[g]
                if h and h[0][0] <= V:
                    self._saturate(g, V)
                done += sat[g] + V * A[g] - C[g]
                while h:  # drop stale entries (requests gone) from the top
                    top = h[0]
                    e = dec.get(top[2])
                    if e is not None and e[0] == top[1]:
                        est = (top[0] - V) * (tau0 + kvt * kvu) / EST_SCALE
                        break
                    heapq.heappop(h)
            vals[i + 5] = est if est < 1.0 else 1.0
            i += 6
        q = self.router_queue
        ql = ctx.qlen(q)
        if ql:
            hd = ctx.head(q)
            lp = math.log2(1.0 + ctx.req_prompt(hd)) / 12.0
            vals[i] = ql / QUEUE_CAP if ql < QUEUE_CAP else 1.0
            vals[i + 1] = lp if lp < 1.0 else 1.0
            vals[i + 2] = self.held[hd][0] / 2.0
        else:
            vals[i] = vals[i + 1] = vals[i + 2] = 0.0
        return np.array(vals, dtype=np.float32), self.sum_invT - done


def episode_seed(base: int, k: int) -> int:
    """The workload and predictor seed of episode k of a run seeded with ``base`` (training resets and
    evaluations use the same map, so evaluation episode k of seed s is one fixed request sequence)."""
    return int(np.random.SeedSequence([int(base), int(k)]).generate_state(1)[0])


def in_system(ctx) -> int:
    """Requests in the system (waiting anywhere or in service), from the cluster view."""
    s = 0
    for i in range(ctx.n_classes):
        s += ctx.n_prefill(i) + ctx.n_decode_mixed(i) + ctx.n_decode_solo(i) + ctx.n_wait_prefill(i) + ctx.n_wait_decode(i)
    return s


def episode_workload(scenario: Scenario, n_requests: int, seed: int):
    """The first ``n_requests`` arrivals of the scenario's own workload drawn with ``seed``, as a
    replayable :class:`~fluidopt.workloads.TraceWorkload` (one episode; the same seed gives the
    same requests to every router)."""
    import pandas as pd

    from fluidopt.workloads.base import collect
    from fluidopt.workloads.replay import TraceWorkload
    from fluidopt.workloads.workflow import workload_from_scenario

    if isinstance(n_requests, bool) or not isinstance(n_requests, int) or n_requests < 1:
        raise ScenarioError(f"episode: n_requests: expected an integer >= 1, got {n_requests!r}")
    wl = workload_from_scenario(scenario)
    rate = sum(c.rate for c in scenario.classes)
    horizon = 1.2 * n_requests / rate + 10.0
    while True:
        b = collect(wl, np.random.default_rng(seed), horizon)
        if len(b) >= n_requests:
            break
        horizon *= 2.0
    k = n_requests
    frame = pd.DataFrame({"time": b.time[:k], "prompt": b.prompt[:k], "output": b.output[:k], "cls": b.cls[:k]})
    return TraceWorkload(frame, scenario.class_names, name=f"{scenario.name}-episode-{seed}")


def small_large_groups(scenario: Scenario) -> tuple[int, float]:
    """(small instances k, threshold tokens) of Dedicated Small-Large's default plan for ``scenario``
    (:class:`~fluidopt.control.load_balancers.SmallLarge`): the groups of the ``small-large`` mask."""
    from fluidopt.control.load_balancers import SmallLarge

    thr, share = SmallLarge.plan_from_scenario(scenario)
    return SmallLarge(lambda ctx, r: 0.0, threshold=thr, small_share=share).plan_small_gpus(scenario.gpus), thr
