"""Routing policies of the disaggregated engine, one per pool (issue 44, "3. The simulator"; docs/fidelity.md,
"Disaggregated replay", "Policies").

The engine (:func:`fluidopt.engines.disaggregated.replay_disaggregated`) asks two questions and nothing
else, so a real router can drive the same logic from its own state:

* **Prefill pool** (:class:`PrefillPolicy`): where an arriving prompt goes. A *push* policy names a
  prefill instance at once (:meth:`PrefillPolicy.admit`); the prompt joins that instance's FCFS queue.
  A *gate* policy (``gate = True``) holds every arrival at a central gate (one FCFS queue per class)
  and, whenever a prefill instance can start a batch, says which held prompts form it
  (:meth:`PrefillPolicy.pull`).
* **Decode pool** (:class:`DecodePolicy`): which decode instance takes a prefilled request
  (:meth:`DecodePolicy.route`); the request joins that instance's FCFS migration queue.

Both read a :class:`PoolsView`: the engine's own counters, kept up to date by the engine, read-only to
a policy. A policy holds only its own bookkeeping (a round-robin pointer) and never changes the view.

Named policies (:data:`POLICIES`; ``"X"`` uses X in both pools, ``"X/Y"`` X for prefill and Y for decode):

=================  ==================================================  ==========================================
name               prefill pool                                        decode pool
=================  ==================================================  ==========================================
``distserve-fcfs`` fewest queued prompt tokens (ties: lowest index)    round robin over the decode instances
                   -- DistServe's rule and the engine's default
``round-robin``    round robin                                         round robin
``least-load``     fewest prompt tokens queued *or in the running      fewest requests routed there and not
                   batch* (ties: lowest index)                         finished (ties: fewest of their prompt
                                                                       tokens, then lowest index)
``gate-and-route`` gate: held per class; an instance able to start a   the instance whose load, counted against
                   batch takes the class with the smallest deviation   the LP's per-class targets, is the lowest
                   index (X_i - n_p x_i) / x_i first, then the others  (sum_i Y_d,i / y_i; ties: lowest index)
=================  ==================================================  ==========================================

Gate-and-route's targets come from the disaggregated LP (:func:`targets_from_lp`, on
:func:`fluidopt.fluid.disaggregated.solve_disaggregated`'s solution), as the colocated gate-and-route
(:mod:`fluidopt.control.gate_and_route`) reads its x_i* from the colocated LP:

* ``x_i = P_i / sum_j P_j``: the share of the prefill pool's busy instances that serve class i. ``X_i``
  is the same share now, summed over the running batches (a batch counts as one instance, split between
  classes by its prompt tokens), and ``n_p x_i`` is the target in a pool of ``n_p`` instances. The class
  furthest below its target is admitted first; ties (every index equal, as in a pool of one idle
  instance) go to the class whose head arrived first. Within a class the gate is FCFS, and the batch
  takes the chosen class's heads first (the LP's batches are single-class), then the other classes'
  in index order, while the batch limits and the instance's free KV allow.
* ``y_i = (D_i / N_d) * b_i``: class-i requests one decode instance holds at the LP's optimum (the
  share of decode instances on class i times its mean batch). One class-i request fills ``1 / y_i`` of
  an instance; a prefilled request goes where the fill ``sum_i Y_d,i / y_i`` is lowest (``Y_d,i``:
  class-i requests routed to instance d and not finished). With one class this is least-load.

Lengths in tokens; a class is an index ``0..n_classes-1`` (the engine's ``cls`` argument).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from fluidopt.core.errors import UsageError, did_you_mean

__all__ = ["DecodePolicy", "DisaggTargets", "POLICIES", "PoolsView", "PrefillPolicy", "make_policy",
           "targets_from_lp"]


class PoolsView:
    """What the engine knows, per instance and per class, read by the policies (never written by them).

    Per request ``r`` (engine index): ``prompt[r]``, ``output[r]`` tokens and ``cls[r]``. Prefill instance
    ``p``: ``prefill_queue[p]`` (its FCFS queue, push policies), ``prefill_queued_tokens[p]`` (prompt
    tokens in it), ``prefill_batch_tokens[p]`` (prompt tokens of its running batch, 0 when idle),
    ``prefill_busy[p]``, ``prefill_free_kv[p]`` (tokens; inf: unlimited). Gate: ``gate[i]`` (class i's
    held prompts, FCFS) and ``prefill_share[i]`` (class i's share of the busy prefill instances, X_i).
    Decode instance ``d``: ``decode_assigned[d]`` (requests routed to it and not finished),
    ``decode_assigned_tokens[d]`` (their prompt tokens), ``decode_class[d][i]`` (of them, class i's),
    ``decode_free_blocks[d]``. Limits: ``max_tokens``, ``max_batch`` of a prefill batch, ``block_size``
    of the decode KV."""

    __slots__ = ("n_prefill", "n_decode", "n_classes", "prompt", "output", "cls", "prefill_queue",
                 "prefill_queued_tokens", "prefill_batch_tokens", "prefill_busy", "prefill_free_kv", "gate",
                 "prefill_share", "decode_assigned", "decode_assigned_tokens", "decode_class", "decode_free_blocks",
                 "max_tokens", "max_batch", "block_size")

    def __init__(self, n_prefill: int, n_decode: int, n_classes: int, prompt: list[int], output: list[int],
                 cls: list[int], *, max_tokens: int, max_batch: int, block_size: int) -> None:
        self.n_prefill, self.n_decode, self.n_classes = n_prefill, n_decode, n_classes
        self.prompt, self.output, self.cls = prompt, output, cls
        self.prefill_queue = [deque() for _ in range(n_prefill)]
        self.prefill_queued_tokens = [0] * n_prefill
        self.prefill_batch_tokens = [0] * n_prefill
        self.prefill_busy = [False] * n_prefill
        self.prefill_free_kv = [math.inf] * n_prefill
        self.gate = [deque() for _ in range(n_classes)]
        self.prefill_share = [0.0] * n_classes
        self.decode_assigned = [0] * n_decode
        self.decode_assigned_tokens = [0] * n_decode
        self.decode_class = [[0] * n_classes for _ in range(n_decode)]
        self.decode_free_blocks = [math.inf] * n_decode
        self.max_tokens, self.max_batch, self.block_size = max_tokens, max_batch, block_size


class PrefillPolicy:
    """Where arriving prompts go. Push (``gate = False``): :meth:`admit` names an instance. Gate
    (``gate = True``): arrivals wait in ``view.gate``; :meth:`pull` forms instance ``p``'s next batch."""

    name = "prefill"
    gate = False

    def setup(self, view: PoolsView) -> None:
        """Called once before the first arrival."""

    def admit(self, view: PoolsView, r: int) -> int:
        """The prefill instance (0..n_prefill-1) whose queue request ``r`` joins."""
        raise NotImplementedError

    def pull(self, view: PoolsView, p: int) -> list[int]:
        """Gate policies: held requests for idle instance ``p``'s next batch, in batch order, each the head
        of its class's gate queue when taken; the batch must keep to ``max_tokens`` (a first prompt longer
        goes alone), ``max_batch`` and ``prefill_free_kv[p]`` (use :func:`fill_batch`). Empty: wait."""
        raise NotImplementedError


class DecodePolicy:
    """Which decode instance takes a prefilled request."""

    name = "decode"

    def setup(self, view: PoolsView) -> None:
        """Called once before the first arrival."""

    def route(self, view: PoolsView, r: int) -> int:
        """The decode instance (0..n_decode-1) whose migration queue request ``r`` joins."""
        raise NotImplementedError


def fill_batch(view: PoolsView, p: int, classes: Sequence[int]) -> list[int]:
    """A batch for instance ``p`` from the gate, taking whole classes' heads in the order ``classes``:
    FCFS within a class, while the prompt-token limit (a first prompt may exceed it), the prompt limit and
    the instance's free KV allow; the first head that does not fit ends its class's turn."""
    batch: list[int] = []
    tok = 0
    free = view.prefill_free_kv[p]
    P = view.prompt
    for i in classes:
        for r in view.gate[i]:
            if len(batch) >= view.max_batch or (batch and tok + P[r] > view.max_tokens) or tok + P[r] > free:
                break
            batch.append(r)
            tok += P[r]
    return batch


# ------------------------------------------------------------------------------------------------ prefill


class FewestQueuedTokens(PrefillPolicy):
    """DistServe's: the instance with the fewest queued prompt tokens (ties: the lowest index)."""

    name = "distserve-fcfs"

    def admit(self, view: PoolsView, r: int) -> int:
        q = view.prefill_queued_tokens
        best = 0
        for i in range(1, view.n_prefill):
            if q[i] < q[best]:  # strictly: a tie keeps the lower index
                best = i
        return best


class PrefillRoundRobin(PrefillPolicy):
    """Instances in turn, 0, 1, ..., whatever their load."""

    name = "round-robin"

    def setup(self, view: PoolsView) -> None:
        self.k = 0

    def admit(self, view: PoolsView, r: int) -> int:
        p = self.k % view.n_prefill
        self.k += 1
        return p


class PrefillLeastLoad(PrefillPolicy):
    """The instance with the fewest prompt tokens queued or in its running batch (ties: lowest index)."""

    name = "least-load"

    def admit(self, view: PoolsView, r: int) -> int:
        q, b = view.prefill_queued_tokens, view.prefill_batch_tokens
        return min(range(view.n_prefill), key=lambda i: (q[i] + b[i], i))


class PrefillGate(PrefillPolicy):
    """Gate-and-route's gate (module docstring): class order by the deviation index from the LP's shares."""

    name = "gate-and-route"
    gate = True

    def __init__(self, shares: Sequence[float]) -> None:
        self.shares = tuple(float(x) for x in shares)

    def setup(self, view: PoolsView) -> None:
        if len(self.shares) != view.n_classes:
            raise UsageError(f"gate-and-route: the LP has {len(self.shares)} classes, the requests "
                             f"{view.n_classes}; expected one target per class")

    def order(self, view: PoolsView) -> list[int]:
        """The classes with held prompts, most below target first (ties: the oldest head first)."""
        n = view.n_prefill
        X = view.prefill_share

        def key(i: int) -> tuple[float, int]:
            x = self.shares[i]
            # a class the LP gives no prefill time goes after every class it does, FCFS among them
            dev = (X[i] - n * x) / x if x > 0 else math.inf
            return dev, view.gate[i][0]
        return sorted((i for i in range(view.n_classes) if view.gate[i]), key=key)

    def pull(self, view: PoolsView, p: int) -> list[int]:
        return fill_batch(view, p, self.order(view))


# ------------------------------------------------------------------------------------------------ decode


class DecodeRoundRobin(DecodePolicy):
    """Instances in turn, 0, 1, ... (DistServe's rule)."""

    name = "round-robin"

    def setup(self, view: PoolsView) -> None:
        self.k = 0

    def route(self, view: PoolsView, r: int) -> int:
        d = self.k % view.n_decode
        self.k += 1
        return d


class DecodeLeastLoad(DecodePolicy):
    """The instance with the fewest unfinished requests routed to it (ties: fewest of their prompt tokens,
    then the lowest index)."""

    name = "least-load"

    def route(self, view: PoolsView, r: int) -> int:
        a, t = view.decode_assigned, view.decode_assigned_tokens
        return min(range(view.n_decode), key=lambda d: (a[d], t[d], d))


class DecodeByTargets(DecodePolicy):
    """Gate-and-route's router (module docstring): the lowest fill ``sum_i Y_d,i / y_i``."""

    name = "gate-and-route"

    def __init__(self, per_instance: Sequence[float]) -> None:
        self.per_instance = tuple(float(y) for y in per_instance)

    def setup(self, view: PoolsView) -> None:
        if len(self.per_instance) != view.n_classes:
            raise UsageError(f"gate-and-route: the LP has {len(self.per_instance)} classes, the requests "
                             f"{view.n_classes}; expected one target per class")
        # a class without decode in the plan weighs like the heaviest one (it is only reached if prefilled)
        pos = [y for y in self.per_instance if y > 0]
        floor = min(pos) if pos else 1.0
        self.weight = tuple(1.0 / (y if y > 0 else floor) for y in self.per_instance)

    def route(self, view: PoolsView, r: int) -> int:
        w = self.weight
        best, arg = math.inf, 0
        for d in range(view.n_decode):
            row = view.decode_class[d]
            fill = sum(row[i] * w[i] for i in range(view.n_classes))
            if fill < best:
                best, arg = fill, d
        return arg


# ------------------------------------------------------------------------------------------------ names


@dataclass(frozen=True)
class DisaggTargets:
    """The LP's per-class targets for gate-and-route: ``prefill_share[i]`` (x_i, shares summing to 1) and
    ``decode_per_instance[i]`` (y_i, class-i requests per decode instance)."""

    prefill_share: tuple[float, ...]
    decode_per_instance: tuple[float, ...]


def targets_from_lp(solution) -> DisaggTargets:
    """:class:`DisaggTargets` of a :class:`~fluidopt.fluid.disaggregated.DisaggSolution` (classes in its
    order): ``x_i = P_i / sum P``, ``y_i = D_i / N_d * b_i`` (0 where the class has no decode)."""
    P = [float(v) for v in solution.prefill_instances]
    tot = sum(P)
    if not tot > 0 or not solution.decode_instances_total > 0:
        raise UsageError("gate-and-route: the LP solution serves nothing (no prefill or decode instances)")
    y = [float(D) / solution.decode_instances_total * float(b) if D > 0 and b == b else 0.0
         for D, b in zip(solution.decode_instances, solution.decode_batch)]
    return DisaggTargets(tuple(p / tot for p in P), tuple(y))


_PREFILL = {"distserve-fcfs": FewestQueuedTokens, "round-robin": PrefillRoundRobin, "least-load": PrefillLeastLoad,
            "gate-and-route": PrefillGate}
_DECODE = {"distserve-fcfs": DecodeRoundRobin, "round-robin": DecodeRoundRobin, "least-load": DecodeLeastLoad,
           "gate-and-route": DecodeByTargets}
POLICIES = tuple(_PREFILL)


def make_policy(name: str = "distserve-fcfs", *, targets: DisaggTargets | None = None
                ) -> tuple[PrefillPolicy, DecodePolicy]:
    """The (prefill, decode) policies named ``name``: one of :data:`POLICIES` for both pools, or
    ``"PREFILL/DECODE"``. ``gate-and-route`` needs the LP's ``targets`` (:func:`targets_from_lp`).
    An unknown name or missing targets raise :class:`UsageError`."""
    parts = str(name).split("/")
    if len(parts) > 2:
        raise UsageError(f"policy {name!r}: expected NAME or PREFILL/DECODE, one of {', '.join(POLICIES)} each")
    pre_name, dec_name = (parts[0], parts[0]) if len(parts) == 1 else parts
    for n in (pre_name, dec_name):
        if n not in _PREFILL:
            raise UsageError(f"policy {n!r}: no such policy{did_you_mean(n, POLICIES)}; expected one of "
                             f"{', '.join(POLICIES)}")
    if "gate-and-route" in (pre_name, dec_name) and not isinstance(targets, DisaggTargets):
        raise UsageError("policy gate-and-route: needs the disaggregated LP's targets (targets_from_lp(solution))")

    def build(table, n, arg):
        return table[n](arg) if n == "gate-and-route" else table[n]()
    return (build(_PREFILL, pre_name, targets and targets.prefill_share),
            build(_DECODE, dec_name, targets and targets.decode_per_instance))
