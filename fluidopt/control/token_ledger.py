"""The token ledger and output predictions that several load balancers route by.

:class:`TokenLedgerScheduler` keeps, per instance, the prompt tokens whose prefill has not finished and
the predicted output tokens of the requests routed to it and not finished; a predictor
(:func:`resolve_predictor`: ``"mean"``, ``"oracle"`` or a callable) says how many output tokens a
request will have. The rules are in :mod:`fluidopt.control.load_balancers` (its *Token ledger* and
*Predictions* paragraphs) and docs/routing.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from fluidopt.control.instance import InstanceScheduler
from fluidopt.control.protocol import ClusterView, Context
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import GPUProfile, Scenario

__all__ = ["ClassMeanOutput", "OutputPredictor", "TokenLedgerScheduler", "oracle_output", "resolve_predictor"]

OutputPredictor = Callable[[ClusterView, int], float]
"""``f(ctx, r) -> predicted output tokens of request r`` (called once, when r is routed)."""

INF = math.inf


def oracle_output(ctx: ClusterView, r: int) -> float:
    """The request's true output length in tokens (an oracle; the Decode Balancer's definition)."""
    return float(ctx.req_output(r))


class ClassMeanOutput:
    """Predict a request's output as its class's mean output D_i (tokens)."""

    def __init__(self, means: Sequence[float]):
        vals = [float(v) for v in means]
        if not vals or any(not math.isfinite(v) or v < 0 for v in vals):
            raise ScenarioError(f"predictor: class-mean outputs: expected finite numbers >= 0, got {list(means)!r}")
        self.means = tuple(vals)

    @classmethod
    def from_scenario(cls, scenario: Scenario) -> ClassMeanOutput:
        return cls([c.decode for c in scenario.classes])

    def __call__(self, ctx: ClusterView, r: int) -> float:
        return self.means[ctx.req_class(r)]

    def __repr__(self) -> str:
        return f"ClassMeanOutput({list(self.means)})"


def resolve_predictor(spec: str | OutputPredictor | None, scenario: Scenario | None) -> OutputPredictor:
    """``"mean"`` (or None) -> :class:`ClassMeanOutput` of ``scenario``; ``"oracle"``; or a callable."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "mean"):
        if scenario is None:
            raise ScenarioError("predictor: 'mean' needs the scenario's class means; pass a Scenario or a callable")
        return ClassMeanOutput.from_scenario(scenario)
    if isinstance(spec, str):
        if spec.strip().lower() == "oracle":
            return oracle_output
        raise ScenarioError(f"predictor: expected 'mean', 'oracle' or a callable f(ctx, r) -> tokens, got {spec!r}")
    if not callable(spec):
        raise ScenarioError(f"predictor: expected 'mean', 'oracle' or a callable f(ctx, r) -> tokens, got {spec!r}")
    return spec


def _no_output(ctx: ClusterView, r: int) -> float:
    return 0.0


def _chunk_name(obj: InstanceScheduler) -> None:
    if obj.chunked_prefill:
        obj.name = f"{type(obj).name}-chunked"


def prefill_seconds(gpu: GPUProfile, tokens: int, chunked: bool, cached: int = 0) -> float:
    """Seconds one instance takes to prefill ``tokens`` prompt tokens: ``alpha + beta * tokens`` prefill
    first, ``ceil(tokens / C) * tau_mix`` with chunked prefill. With the GPU's ``timemodel`` (the generalised
    law, docs/simulator.md section 1.3), that law's time for ``tokens`` computed over ``cached`` tokens already
    in the cache: ``n a + b u + c ((o + u)^2 - o^2)`` for u tokens over o, n chunks (1 prefill first)."""
    law = gpu.timemodel
    if law is not None:
        u, o = int(tokens), int(cached)
        n = -(-u // gpu.chunk) if chunked else 1
        return n * law.prefill.a + law.prefill.b * u + law.prefill.c * ((o + u) * (o + u) - o * o)
    if chunked:
        return -(-int(tokens) // gpu.chunk) * gpu.tau_mix
    return gpu.alpha + gpu.beta * tokens


def backlog_seconds(gpu: GPUProfile, k: int, tokens: float, chunked: bool) -> float:
    """Seconds of k queued prefills of ``tokens`` prompt tokens in all, run one after another: ``k * alpha +
    beta * tokens`` prefill first (each its own iteration); ``(tokens / C + k / 2) * tau_mix`` with chunked
    prefill (half a chunk of rounding a prompt). With the GPU's ``timemodel``, as many prefill intercepts
    plus ``b * tokens`` and the quadratic term of k equal prompts (a lower bound for unequal ones)."""
    law = gpu.timemodel
    if law is not None:
        if k <= 0:
            return 0.0
        iters = tokens / gpu.chunk + 0.5 * k if chunked else k
        return iters * law.prefill.a + law.prefill.b * tokens + law.prefill.c * tokens * tokens / k
    if chunked:
        return (tokens / gpu.chunk + 0.5 * k) * gpu.tau_mix
    return k * gpu.alpha + gpu.beta * tokens


class _CyclicArg:
    """argmin/argmax scans with cyclic tie-breaking (start just after the last choice)."""

    _start = 0

    def _pick_min(self, n: int, score: Callable[[int], float]) -> int:
        s = self._start if self._start < n else 0
        best, bv = s, score(s)
        g = s
        for _ in range(n - 1):
            g = g + 1 if g + 1 < n else 0
            v = score(g)
            if v < bv:
                best, bv = g, v
        self._start = best + 1 if best + 1 < n else 0
        return best


# =================================================================================================
# Stateless balancers (only the engine's view)
# =================================================================================================


class TokenLedgerScheduler(_CyclicArg, InstanceScheduler):
    """An instance scheduler that keeps per-instance outstanding work in tokens (see the module doc).

    Per instance g: :meth:`pending_prefill_tokens` (prompt tokens routed to g whose prefill has not
    finished, the running one included), :meth:`pending_prefills` (their number),
    :meth:`outstanding_output` (predicted output tokens of its unfinished requests, minus those
    generated when ``live``) and
    :meth:`outstanding_tokens` (the sum of the first and the last).
    """

    name = "token-ledger"

    def __init__(self, predictor: OutputPredictor, *, live: bool | None = None, **kw):
        super().__init__(**kw)
        if not callable(predictor):
            raise ScenarioError(f"{type(self).__name__}: predictor: expected a callable f(ctx, r) -> tokens, got {predictor!r}")
        self.predictor = predictor
        # Subtracting generated tokens is exact only when predictions are true lengths: a request that
        # outlives its prediction would otherwise offset the others' outstanding work on its instance.
        self.live = (predictor is oracle_output) if live is None else bool(live)

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        n = self.n
        self._start = 0
        self._tok = ctx.service == "tokens"
        self._pp = [0] * n  # prompt tokens of unfinished prefills
        self._pk = [0] * n  # number of unfinished prefills
        self._out = [0.0] * n  # predicted output tokens of unfinished requests
        self._dprompt = [0] * n  # prompts of the requests decoding on g (their KV, net of output)
        self._bank = [0] * n  # output generated by routed requests not decoding now (preempted)
        # r -> [g, pending prefill tokens (0 once prefilled), predicted output, prompt decoding on g, banked]
        self._rec: dict[int, list] = {}
        self._pred_r, self._pred_v = -1, 0.0

    def predict(self, ctx: Context, r: int) -> float:
        """The predictor's output tokens for arrival r, computed once per routing (route and ledger share it)."""
        if r == self._pred_r:
            return self._pred_v
        v = self.predictor(ctx, r)
        try:
            v = float(v)
        except (TypeError, ValueError):
            v = math.nan
        if not (math.isfinite(v) and v >= 0):
            raise ScenarioError(f"{self.name}: predictor returned {v!r} output tokens for request {r}; expected a finite number >= 0")
        self._pred_r, self._pred_v = r, v
        return v

    # -- ledger queries (O(1)) --------------------------------------------------------------------
    def pending_prefill_tokens(self, g: int) -> int:
        return self._pp[g]

    def pending_prefills(self, g: int) -> int:
        return self._pk[g]

    def generated(self, ctx: Context, g: int) -> int:
        """Output tokens generated so far by the unfinished requests routed to g (tokens mode; 0 in markov).

        Read from g's KV cache: resident tokens minus the running prefill's context minus the prompts
        of the requests decoding on g, plus what preempted requests had generated before eviction.
        """
        if not self._tok:
            return 0
        kv = ctx.gpu_kv_used(g)
        p = ctx.gpu_prefill(g)
        if p >= 0:
            kv -= ctx.req_prompt(p) + ctx.req_generated(p)
        kv -= self._dprompt[g]
        return max(0, kv) + self._bank[g]

    def outstanding_output(self, ctx: Context, g: int) -> float:
        """Output tokens still to come on g: the predicted outputs of its unfinished requests; with
        ``live`` (default: oracle predictor) minus the tokens they have generated (clipped at 0)."""
        if self.live and self._tok:
            return max(0.0, self._out[g] - self.generated(ctx, g))
        return self._out[g]

    def outstanding_tokens(self, ctx: Context, g: int) -> float:
        """Prompt tokens not yet prefilled + predicted output tokens not yet generated, on instance g."""
        return self._pp[g] + self.outstanding_output(ctx, g)

    # -- ledger updates ---------------------------------------------------------------------------
    def _drop(self, g: int, rec: list) -> None:
        pend = rec[1]
        if pend:
            self._pp[g] -= pend
            self._pk[g] -= 1
        self._out[g] -= rec[2]
        self._dprompt[g] -= rec[3]
        self._bank[g] -= rec[4]

    def dispatch(self, ctx: Context, r: int, g: int) -> None:
        old = self._rec.pop(r, None)
        if old is not None:
            # r's id was recycled: its previous holder left without a callback (dropped by the engine
            # after a preemption because its context outgrew the KV cache); forget that one now.
            self._drop(old[0], old)
        gen = ctx.req_generated(r)
        pend = ctx.req_prompt(r) + gen
        out = self.predict(ctx, r)
        self._pred_r = -1  # ids are recycled: the cache holds for this routing only
        self._rec[r] = [g, pend, out, 0, gen]
        self._pp[g] += pend
        self._pk[g] += 1
        self._out[g] += out
        self._bank[g] += gen
        super().dispatch(ctx, r, g)

    def on_arrival(self, ctx: Context, r: int) -> None:
        try:
            super().on_arrival(ctx, r)
        finally:
            self._pred_r = -1  # a held request (route None) is predicted afresh when dispatched

    def on_prefill_done(self, ctx: Context, r: int, g: int) -> None:
        rec = self._rec.get(r)
        if rec is not None:
            h = rec[0]
            self._pp[h] -= rec[1]
            self._pk[h] -= 1
            rec[1] = 0
        super().on_prefill_done(ctx, r, g)  # decodes in place, on g
        if rec is not None:
            h = rec[0]
            p = ctx.req_prompt(r)
            self._dprompt[h] += p
            rec[3] = p
            self._bank[h] -= rec[4]  # its earlier output is resident KV again
            rec[4] = 0

    def on_decode_done(self, ctx: Context, r: int, g: int) -> None:
        rec = self._rec.pop(r, None)
        if rec is not None:
            self._drop(rec[0], rec)

    def on_abandon(self, ctx: Context, r: int, q: int) -> None:
        rec = self._rec.pop(r, None)
        if rec is not None:
            self._drop(rec[0], rec)

    def on_drop(self, ctx: Context, r: int, g: int) -> None:
        rec = self._rec.pop(r, None)
        if rec is not None:
            self._drop(rec[0], rec)

    def on_preempt(self, ctx: Context, r: int, g: int) -> None:
        rec = self._rec.get(r)
        if rec is not None:
            h = rec[0]
            gen = ctx.req_generated(r)
            pend = ctx.req_prompt(r) + gen
            if rec[1]:
                self._pp[h] += pend - rec[1]
            else:
                self._pp[h] += pend
                self._pk[h] += 1
            rec[1] = pend
            self._dprompt[h] -= rec[3]
            rec[3] = 0
            self._bank[h] += gen - rec[4]
            rec[4] = gen
        super().on_preempt(ctx, r, g)
