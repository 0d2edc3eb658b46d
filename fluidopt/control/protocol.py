"""The controller protocol: what a controller sees and what it may decide.

A controller is pure decision logic. The simulator (or a real router, from its own event loop and its
own state snapshot) calls it on events and hands it a :class:`Context`: a read-only
:class:`ClusterView` of the state plus the :class:`Actions` it may take. Actions take effect at once
(the view reflects them immediately, so a controller may loop "while an idle prefill slot and a
waiting request exist: admit"), and every action is validated: an impossible one raises
:class:`fluidopt.core.errors.ActionError` naming the request, the GPU and the reason, before any state
changes.

Vocabulary (docs/model.md):

* GPU ``g`` in ``0..n_gpus-1`` has ``batch`` (B) slots; at most one of them runs a prefill, the others
  decode. A GPU is *mixed* while a prefill runs on it, *solo* otherwise.
* Request ids ``r`` are small integers valid only while the request is in the system (they are
  recycled afterwards); :data:`NO_REQUEST` (-1) means "none".
* Phases: :data:`WAIT_PREFILL` (waiting for a prefill: just arrived, queued, or preempted and waiting
  to be recomputed), :data:`PREFILL`, :data:`WAIT_DECODE` (prefill done, waiting for a decode slot:
  the decode buffer), :data:`DECODE`.
* Waiting places are FCFS queues owned by the engine (so that abandonment, Exp(theta_i) patience
  while waiting anywhere, is handled exactly): :data:`PREFILL_QUEUE` and :data:`DECODE_QUEUE` always
  exist, ``instance_queue(g)`` is GPU g's instance-local queue, and a controller may add named queues
  in :meth:`Controller.setup` (e.g. one decode buffer per pool). Each queue is FCFS overall and per
  class. A request waits in at most one queue.
* Pools: in :meth:`Controller.setup` a controller may split the GPUs into pools and give each GPU a
  decode cap (``max_decodes``) and a prefill permission; the engine then keeps, per pool, the set of
  GPUs with an idle prefill slot and the set with a free decode slot (O(1) random choice), and it
  rejects actions that break the declared caps. Gate-and-Route's static partition is two pools:
  mixed GPUs (prefill allowed, at most B-1 decodes) and solo GPUs (no prefill, B decodes).

Events (all optional to implement; the defaults do nothing):

* ``on_arrival(ctx, r)``: r arrived and is waiting, in no queue yet. If the controller neither starts
  nor enqueues it, the engine appends it to :data:`PREFILL_QUEUE`.
* ``on_prefill_done(ctx, r, g)``: r's prefill finished on g (g's prefill slot is free); r now waits
  for a decode slot. If the controller does not place it, the engine appends it to
  :data:`DECODE_QUEUE`.
* ``on_decode_done(ctx, r, g)``: r completed (left the system); its slot on g is free.
* ``on_abandon(ctx, r, q)``: r ran out of patience while waiting in queue q (already removed).
* ``on_preempt(ctx, r, g)``: ``service="tokens"`` with a KV capacity only: r was evicted from g to
  make room (vLLM's recompute preemption); it waits for a new prefill of its prompt plus the tokens
  it had generated. Unplaced, it goes to the front of :data:`PREFILL_QUEUE`.
* ``on_drop(ctx, r, g)``: ``service="tokens"`` with a KV capacity only: r was evicted from g and its
  context alone no longer fits any GPU's KV cache, so it leaves the system unserved (vLLM aborts
  such requests); counted as ``dropped``. Called instead of ``on_preempt``.
* ``on_slot_freed(ctx, g)``: called once after every decode or prefill completion on g, after the
  event's own callback and default placement. This is where a controller pulls waiting work onto g.
  (Not after a preemption: like vLLM, no new work is admitted in an iteration that had to preempt.)
* ``on_tick(ctx)``: every ``tick_interval`` seconds of simulated time, if the controller sets it.

Live counts. Besides the one-number reads (``n_prefill(i)``, ``qlen(q, i)``, ...), the view hands out
the same numbers as three live, read-only vectors, for a controller that reads many of them on every
event (the gate-and-route family's compiled handlers, docs/simulator.md section 9, read these instead of
calling the view): ``class_counts()[COUNTS_PER_CLASS * i + k]`` is class i's count k
(:data:`COUNT_WAIT_PREFILL` = ``n_wait_prefill(i)``, :data:`COUNT_PREFILL` = ``n_prefill(i)``,
:data:`COUNT_WAIT_DECODE`, :data:`COUNT_DECODE_MIXED`, :data:`COUNT_DECODE_SOLO`),
``queue_counts()[q * n_classes + i]`` is ``qlen(q, i)`` and ``queue_totals()[q]`` is ``qlen(q)``
(``class_counts()`` may hold more numbers after the per-class ones: the engine's cluster-wide ones).
*Live*: the object a call returns shows every later change, so a controller asks once, at the end of
its ``setup`` (after its last ``add_queue``, which makes new vectors); it must not write into them.

Fleet actions (:class:`FleetView` and :class:`FleetActions`; docs/simulator.md section 11). The
simulator's context also lets a controller change the fleet while the run goes on; a scenario with a
``[fleet]`` table has offline GPUs to add (``cluster.gpus`` is the maximum, ``fleet.initial`` are
online at t = 0). They are not part of :class:`Context` (a router's snapshot,
:mod:`fluidopt.control.snapshot`, has no fleet to change): check ``isinstance(ctx, FleetActions)``
or the scenario's ``fleet`` before using them. Every one validates its arguments and raises
:class:`fluidopt.core.errors.ActionError` (naming the GPU or request, the time and what was expected)
before changing anything; a GPU index outside ``0..n_gpus-1`` is always an error.

* ``add_gpu(g=None, startup_delay=None) -> int``: an offline GPU (g, or the lowest-numbered offline one)
  joins the fleet. It counts in GPU-hours at once and takes work after ``startup_delay`` seconds (None:
  ``fleet.startup_delay``, also read as ``ctx.startup_delay()``), when
  ``on_slot_freed(g)`` announces it (at once during setup or with no delay); it keeps the pool and
  caps it was given in setup. Errors: every GPU already in the fleet (g None), g not offline.
* ``drain_gpu(g)``: g takes no new work (its decode cap becomes 0), finishes what runs on it and goes
  offline when empty (at once if idle); a starting GPU is cancelled at once. Errors: g offline or
  already draining (the fleet cannot shrink below its online GPUs).
* ``remove_gpu(g, host=True) -> list[int]``: ``drain_gpu(g)`` and evict its running requests now
  (as ``evict``); returns them (none is lost: each is placed by ``on_preempt``). Errors: as
  ``drain_gpu``.
* ``set_max_decodes(g, m)``: g's batch limit, an integer in 1..B concurrent decodes, while running
  (on a GPU not online it applies when it comes online). Lowering it below the running decodes
  evicts none; it only stops new ones. Errors: m not an integer in 1..B (0 included).
* ``evict(r, host=True) -> bool``: take running request r off its GPU; it waits again
  (``on_preempt``) and counts a preemption. tokens mode: at the GPU's next iteration boundary; False
  (nothing done) when r's prefill or decode ends at that boundary. ``host=True`` keeps a decode's KV
  cache in host memory: its restart restores it at ``fleet.kv_swap_time_per_token`` seconds per
  context token (whole mixed iterations in the prefill slot, at least one) instead of a re-prefill.
  Errors: r not in the system, or not running (waiting).
* Views: ``gpu_state(g)`` ('online', 'starting', 'draining' or 'offline'), ``gpu_online(g)``,
  ``fleet_size()`` (GPUs counted in GPU-hours now: online, starting and draining), ``fleet_online()``
  (the online GPUs, index order, O(n)), ``gpu_hours()`` (GPU-hours from t = 0 to now).

Class attributes a controller may set: ``name``; ``tick_interval`` (seconds or None);
``chunked_prefill`` (True: a prefill runs in chunks of C tokens alongside the GPU's decodes, the
paper's and Sarathi's mixed iterations; False: vLLM's prefill-first scheduling without chunking,
where a prefill runs as one iteration of alpha + beta * prompt seconds during which the GPU's
decodes stall).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

__all__ = [
    "DECODE",
    "DECODE_QUEUE",
    "NO_REQUEST",
    "PREFILL",
    "PREFILL_QUEUE",
    "WAIT_DECODE",
    "WAIT_PREFILL",
    "COUNTS_PER_CLASS",
    "COUNT_DECODE_MIXED",
    "COUNT_DECODE_SOLO",
    "COUNT_PREFILL",
    "COUNT_WAIT_DECODE",
    "COUNT_WAIT_PREFILL",
    "Actions",
    "ClusterView",
    "Context",
    "Controller",
    "FleetActions",
    "FleetView",
    "GpuSet",
]

NO_REQUEST = -1
PREFILL_QUEUE = 0  # central per-class FCFS prefill queues (Q_p,i)
DECODE_QUEUE = 1  # central FCFS decode buffer (Q_d,i)

WAIT_PREFILL = 0
PREFILL = 1
WAIT_DECODE = 2
DECODE = 3

# the layout of ClusterView.class_counts(): COUNTS_PER_CLASS numbers per class, in this order
COUNT_WAIT_PREFILL, COUNT_PREFILL, COUNT_WAIT_DECODE, COUNT_DECODE_MIXED, COUNT_DECODE_SOLO = range(5)
COUNTS_PER_CLASS = 5


@runtime_checkable
class GpuSet(Protocol):
    """A read-only set of GPU indices maintained by the engine (O(1) size, membership, random pick)."""

    def __len__(self) -> int: ...

    def __contains__(self, g: object) -> bool: ...

    def has(self, g: int) -> bool:
        """``g in self`` for a GPU id ``g`` (an int): on the compiled engine core a C-level call, which a
        compiled handler (docs/simulator.md section 9) makes without boxing ``g``."""
        ...

    def __iter__(self) -> Iterator[int]: ...

    def choice(self) -> int:
        """A uniformly random member (from the context's controller stream), or -1 when empty."""
        ...

    def first(self) -> int:
        """Some member (deterministic, O(1)), or -1 when empty."""
        ...


@runtime_checkable
class ClusterView(Protocol):
    """Read-only state. Counts are of requests; times in seconds; per-class arguments are indices."""

    @property
    def now(self) -> float: ...
    @property
    def n_gpus(self) -> int: ...
    @property
    def batch(self) -> int: ...
    @property
    def n_classes(self) -> int: ...
    @property
    def class_names(self) -> tuple[str, ...]: ...
    @property
    def service(self) -> str: ...
    @property
    def rng(self) -> random.Random:
        """The controller's own random stream (seeded from the run's seed)."""
        ...

    # per-class counts (whole cluster)
    def n_prefill(self, i: int) -> int: ...  # X_i
    def n_decode_mixed(self, i: int) -> int: ...  # Y_m,i
    def n_decode_solo(self, i: int) -> int: ...  # Y_s,i
    def n_wait_prefill(self, i: int) -> int: ...  # Q_p,i (all waiting places)
    def n_wait_decode(self, i: int) -> int: ...  # Q_d,i (all waiting places)
    def class_counts(self) -> Sequence[int]:
        """Live: ``[COUNTS_PER_CLASS * i + k]`` is class i's count k (COUNT_PREFILL: n_prefill(i), ...)."""
        ...

    # GPUs
    def gpu_prefill(self, g: int) -> int: ...  # request in prefill on g, or -1
    def gpu_decodes(self, g: int) -> int: ...
    def gpu_free(self, g: int) -> int: ...  # free slots: B - decodes - (1 if a prefill runs)
    def gpu_mixed(self, g: int) -> bool: ...
    def gpu_pool(self, g: int) -> int: ...
    def gpu_max_decodes(self, g: int) -> int: ...
    def gpu_prefill_allowed(self, g: int) -> bool: ...
    def gpu_decodes_by_class(self, g: int) -> tuple[int, ...]: ...
    def gpu_requests(self, g: int) -> list[int]: ...  # prefill first, then decodes (O(B))
    # tokens of KV cache committed on g (tokens mode); includes the token each running decode is
    # producing in the current iteration, which req_generated() counts only once it is done
    def gpu_kv_used(self, g: int) -> int: ...
    def gpu_kv_free(self, g: int) -> float: ...  # inf without a KV capacity
    def idle_prefill(self, pool: int = 0) -> GpuSet: ...  # prefill allowed, none running, a free slot
    def free_decode(self, pool: int = 0) -> GpuSet: ...  # a free slot and decodes < max_decodes
    @property
    def n_pools(self) -> int: ...

    # queues
    def queue_id(self, name: str) -> int: ...
    def instance_queue(self, g: int) -> int: ...
    def qlen(self, q: int, cls: int = -1) -> int: ...
    def head(self, q: int, cls: int = -1) -> int: ...  # FCFS head (of class cls), or -1
    def queue_requests(self, q: int) -> list[int]: ...  # FCFS order, O(length)
    def queue_counts(self) -> Sequence[int]:
        """Live: ``[q * n_classes + i]`` is ``qlen(q, i)`` (ask again after an add_queue)."""
        ...
    def queue_totals(self) -> Sequence[int]:
        """Live: ``[q]`` is ``qlen(q)`` (ask again after an add_queue)."""
        ...

    # instances (architecture b): work routed to g, waiting in its queue or in service on g
    def instance_requests(self, g: int) -> int: ...
    def instance_tokens(self, g: int) -> int: ...  # prompt (if not yet prefilled) + output tokens

    # requests
    def req_class(self, r: int) -> int: ...
    def req_prompt(self, r: int) -> int: ...
    def req_output(self, r: int) -> int: ...  # oracle output length (tokens)
    def req_arrival(self, r: int) -> float: ...
    def req_phase(self, r: int) -> int: ...
    def req_gpu(self, r: int) -> int: ...  # GPU serving it, or -1
    def req_queue(self, r: int) -> int: ...  # queue it waits in, or -1
    def req_generated(self, r: int) -> int: ...  # output tokens produced so far (tokens mode)
    def req_preemptions(self, r: int) -> int: ...

    # prefix (KV) cache: leading tokens of r's prompt cached on instance g now (0 without a cache or
    # block hashes); the simulator reads its per-instance caches, a router its own index (snapshot)
    def cached_prefix_tokens(self, r: int, g: int) -> int: ...
    def req_blocks(self, r: int) -> Sequence[int]: ...  # r's prompt KV block ids (chained), empty if unknown


@runtime_checkable
class Actions(Protocol):
    """Decisions. Each is validated; an impossible one raises ActionError and changes nothing."""

    def start_prefill(self, r: int, g: int) -> None:
        """Start r's prefill on g: r waits for a prefill; g allows prefills, runs none, has a free slot."""
        ...

    def start_decode(self, r: int, g: int) -> None:
        """Start r's decode on g: r waits for a decode; g has a free slot and fewer than max_decodes."""
        ...

    def enqueue(self, r: int, q: int, front: bool = False) -> None:
        """Put waiting request r at the back (or front) of queue q (moving it from its current queue)."""
        ...

    # setup only (inside Controller.setup)
    def set_pool(
        self, gpus: Sequence[int], pool: int, *, prefill: bool = True, max_decodes: int | None = None
    ) -> None: ...

    def add_queue(self, name: str) -> int: ...


@runtime_checkable
class Context(ClusterView, Actions, Protocol):
    """What a controller receives with every event."""


@runtime_checkable
class FleetView(Protocol):
    """The fleet's state (the simulator's context; see "Fleet actions" in the module docstring)."""

    def gpu_state(self, g: int) -> str:
        """'online', 'starting' (added, within its start-up delay), 'draining' or 'offline'."""
        ...

    def gpu_online(self, g: int) -> bool:
        """Whether g is online (takes new work)."""
        ...

    def fleet_size(self) -> int:
        """GPUs counted in GPU-hours now: online, starting and draining."""
        ...

    def startup_delay(self) -> float:
        """The fleet's start-up delay (s): what :meth:`FleetActions.add_gpu` uses when given none."""
        ...

    def fleet_online(self) -> list[int]:
        """The online GPUs in index order (O(n))."""
        ...

    def gpu_hours(self) -> float:
        """GPU-hours from t = 0 to now (each GPU counted from being added to going offline)."""
        ...


@runtime_checkable
class FleetActions(FleetView, Protocol):
    """Changing the fleet during a run. Each raises ActionError and changes nothing when impossible."""

    def add_gpu(self, g: int | None = None, startup_delay: float | None = None) -> int:
        """Add offline GPU g (None: the lowest-numbered offline one); online after ``startup_delay`` seconds
        (None: the fleet's, :meth:`FleetView.startup_delay`). Returns its index. ActionError: all GPUs in
        the fleet, g not offline, or a delay that is not a finite number >= 0."""
        ...

    def drain_gpu(self, g: int) -> None:
        """No new work on g; offline once its running requests finish (a starting GPU: cancelled).
        ActionError: g offline or already draining."""
        ...

    def remove_gpu(self, g: int, host: bool = True) -> list[int]:
        """Drain g and evict its running requests now (see evict); returns them. ActionError: as drain_gpu."""
        ...

    def set_max_decodes(self, g: int, m: int) -> None:
        """g's batch limit: at most m concurrent decodes, an integer in 1..B. ActionError otherwise."""
        ...

    def evict(self, r: int, host: bool = True) -> bool:
        """Take running r off its GPU (tokens mode: at the next iteration boundary; False and nothing
        done when its work ends there); host=True restores a decode's KV at kv_swap_time_per_token s per
        context token instead of recomputing. ActionError: r not running."""
        ...


class Controller:
    """Base class of controllers: every event handler is optional (see the module docstring)."""

    name: str = "controller"
    tick_interval: float | None = None
    chunked_prefill: bool = True

    def setup(self, ctx: Context) -> None:
        """Called once at time 0, before any event: declare pools, caps and named queues here."""

    def on_arrival(self, ctx: Context, r: int) -> None:
        """r arrived. Unplaced, it joins the back of PREFILL_QUEUE."""

    def on_prefill_done(self, ctx: Context, r: int, g: int) -> None:
        """r finished its prefill on g. Unplaced, it joins the back of DECODE_QUEUE."""

    def on_decode_done(self, ctx: Context, r: int, g: int) -> None:
        """r completed on g (it has left the system; do not use r afterwards)."""

    def on_abandon(self, ctx: Context, r: int, q: int) -> None:
        """r abandoned from queue q (it has left the system)."""

    def on_preempt(self, ctx: Context, r: int, g: int) -> None:
        """r was evicted from g (tokens mode, KV overflow). Unplaced, it joins the front of PREFILL_QUEUE."""

    def on_drop(self, ctx: Context, r: int, g: int) -> None:
        """r was evicted from g and can never fit again (tokens mode, KV); it leaves the system."""

    def on_slot_freed(self, ctx: Context, g: int) -> None:
        """Capacity freed on g (after a decode or prefill completion and its own callback)."""

    def on_tick(self, ctx: Context) -> None:
        """Periodic decision point every ``tick_interval`` seconds."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
