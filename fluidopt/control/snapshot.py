"""A cluster snapshot in plain Python: the controller protocol for a real router (no simulator).

:class:`ClusterSnapshot` implements the whole :class:`fluidopt.control.protocol.Context` over plain
lists and dicts. A router keeps one in sync with its fleet through the router-side mutators
(:meth:`~ClusterSnapshot.add_request`, :meth:`~ClusterSnapshot.prefill_finished`,
:meth:`~ClusterSnapshot.decode_finished`, :meth:`~ClusterSnapshot.abandon`,
:meth:`~ClusterSnapshot.preempted`), calls the controller's handlers with it, and executes the
decisions the controller's actions left in :attr:`~ClusterSnapshot.outbox`:

* ``("prefill", r, g)``: send r's prompt to GPU g;
* ``("decode", r, g)``: run r's decode on GPU g;
* ``("enqueue", r, q)`` / ``("enqueue_front", r, q)``: r now waits at the back / front of queue q
  (bookkeeping only: nothing to send).

Actions are validated with the simulator engine's conditions and messages (an impossible one raises
:class:`fluidopt.core.errors.ActionError` naming the request, the GPU and the reason, and changes nothing).

Cost: per-class counts, queue lengths and the GPU sets are recomputed on each call, O(requests) or
O(GPUs). That is fine at a router's decision rate (thousands per second for hundreds of GPUs); the
simulator's engine keeps them incrementally instead. Queue ids follow the engine: 0 = PREFILL_QUEUE,
1 = DECODE_QUEUE, ``2 + g`` = GPU g's instance queue, then named queues in order of ``add_queue``.
The snapshot does not track KV caches (``gpu_kv_free`` is ``inf``) nor generated tokens (0).

Prefix caches: a router that knows its requests' block hashes (``add_request(..., blocks=...)``,
``block_size`` at construction) keeps its own index of the blocks each GPU has computed: a prefill
that finishes adds its request's blocks to its GPU's index, :meth:`~ClusterSnapshot.evict_blocks`
removes blocks the engine reports evicted, and :meth:`~ClusterSnapshot.cached_prefix_tokens` answers
the protocol's query from it (the longest run of the request's leading blocks in the GPU's index,
``min(k * block_size, prompt)`` tokens), as SGLang's cache-aware router answers from its approximate tree.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from fluidopt.control import action_errors as _ae
from fluidopt.control.action_errors import PHASE_NAMES as _PHASE_NAMES
from fluidopt.control.protocol import (
    COUNTS_PER_CLASS,
    DECODE,
    NO_REQUEST,
    PREFILL,
    WAIT_DECODE,
    WAIT_PREFILL,
    Controller,
)
from fluidopt.core.errors import ActionError

__all__ = ["ClusterSnapshot", "SnapshotCounts", "SnapshotGpuSet"]


@dataclass
class _Req:
    cls: int
    prompt: int  # tokens
    output: int  # tokens (oracle length, or the client's max_tokens)
    arrival: float  # seconds
    phase: int = WAIT_PREFILL
    gpu: int = NO_REQUEST
    queue: int = -1
    blocks: tuple = ()  # its prompt's chained KV block ids (prefix caching), if the router knows them


class SnapshotCounts(Sequence):
    """A live, read-only vector of counts (the protocol's ``class_counts``, ``queue_counts`` and
    ``queue_totals``): element k is ``read(k)``, recomputed on each read (O(requests))."""

    def __init__(self, size: Callable[[], int], read: Callable[[int], int]):
        self._size, self._read = size, read

    def __len__(self) -> int:
        return self._size()

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return [self._read(j) for j in range(*k.indices(len(self)))]
        n = len(self)
        if isinstance(k, bool) or not isinstance(k, int) or not -n <= k < n:
            raise IndexError(f"count index {k!r} out of range for a vector of {n}")
        return self._read(k % n)


class SnapshotGpuSet:
    """A live view of the GPUs of one pool satisfying a predicate (the protocol's GpuSet); O(n) per call."""

    def __init__(self, snap: ClusterSnapshot, pred: Callable[[int], bool]):
        self._snap, self._pred = snap, pred

    def _items(self) -> list[int]:
        return [g for g in range(self._snap.n_gpus) if self._pred(g)]

    def __len__(self) -> int:
        return len(self._items())

    def __contains__(self, g: object) -> bool:
        return (isinstance(g, int) and not isinstance(g, bool) and 0 <= g < self._snap.n_gpus
                and self._pred(g))

    def has(self, g: int) -> bool:
        return g in self

    def __iter__(self) -> Iterator[int]:
        return iter(self._items())

    def choice(self) -> int:
        """A uniformly random member (from the snapshot's rng), or -1 when empty."""
        items = self._items()
        return self._snap.rng.choice(items) if items else -1

    def first(self) -> int:
        """The lowest-numbered member, or -1 when empty."""
        return next((g for g in range(self._snap.n_gpus) if self._pred(g)), -1)


class ClusterSnapshot:
    """n GPUs of ``batch`` slots, classes, requests, FCFS queues and pools: the protocol's Context.

    ``classes``: the class names, or their number (names ``c0, c1, ...``). ``clock``: the time in
    seconds, either a float (then :attr:`now` is a settable attribute) or a callable returning the
    router's clock. ``seed`` seeds :attr:`rng` (the controller's random stream). ``service`` is
    reported to controllers as is (``"markov"`` or ``"tokens"``).
    """

    def __init__(self, n_gpus: int, batch: int, classes: int | Sequence[str], *,
                 clock: float | Callable[[], float] = 0.0, seed: int = 0, service: str = "markov",
                 block_size: int | None = None):
        if isinstance(n_gpus, bool) or not isinstance(n_gpus, int) or n_gpus < 1:
            raise ActionError(f"ClusterSnapshot: n_gpus: expected an integer >= 1, got {n_gpus!r}")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ActionError(f"ClusterSnapshot: batch: expected an integer >= 1, got {batch!r}")
        names = tuple(f"c{i}" for i in range(classes)) if isinstance(classes, int) else tuple(classes)
        if not names:
            raise ActionError("ClusterSnapshot: classes: expected at least one class")
        if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1):
            raise ActionError(f"ClusterSnapshot: block_size: expected an integer >= 1 (tokens) or None, got {block_size!r}")
        self.block_size = block_size
        self._cached: list[set] = [set() for _ in range(n_gpus)]  # the router's index of each GPU's KV blocks
        self.n_gpus, self.batch = n_gpus, batch
        self.class_names: tuple[str, ...] = names
        self.n_classes = len(names)
        self.service = service
        self.rng = random.Random(seed)
        self._clock: Callable[[], float] | None = clock if callable(clock) else None
        self._now = 0.0 if callable(clock) else float(clock)
        self._pool = [0] * n_gpus
        self._pok = [True] * n_gpus
        self._maxd = [batch] * n_gpus
        self._pre = [NO_REQUEST] * n_gpus
        self._dec: list[list[int]] = [[] for _ in range(n_gpus)]
        self._n_pools = 1
        self._qnames: list[str] = ["prefill", "decode"] + [f"instance[{g}]" for g in range(n_gpus)]
        self._queues: list[list[int]] = [[] for _ in self._qnames]  # FCFS lists of request ids
        self._req: dict[int, _Req] = {}
        self._next_id = 0
        self.in_setup = False
        #: decisions not yet executed by the router: (kind, request, GPU or queue); the router clears it
        self.outbox: list[tuple[str, int, int]] = []

    # -- time ------------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        """Seconds: the clock callable's value, or the last value assigned."""
        return self._clock() if self._clock is not None else self._now

    @now.setter
    def now(self, t: float) -> None:
        if self._clock is not None:
            raise ActionError("now: this snapshot reads a clock callable; it cannot be set")
        self._now = float(t)

    # -- view: counts (O(requests)) ----------------------------------------------------------------
    @property
    def n_pools(self) -> int:
        return self._n_pools

    def _count(self, i: int, phase: int, mixed: bool | None = None) -> int:
        return sum(1 for q in self._req.values() if q.cls == i and q.phase == phase
                   and (mixed is None or (self._pre[q.gpu] >= 0) == mixed))

    def n_prefill(self, i: int) -> int:
        return self._count(i, PREFILL)

    def n_decode_mixed(self, i: int) -> int:
        """Class-i decodes on GPUs currently running a prefill."""
        return self._count(i, DECODE, True)

    def n_decode_solo(self, i: int) -> int:
        return self._count(i, DECODE, False)

    def n_wait_prefill(self, i: int) -> int:
        return self._count(i, WAIT_PREFILL)

    def n_wait_decode(self, i: int) -> int:
        return self._count(i, WAIT_DECODE)

    def class_counts(self) -> SnapshotCounts:
        """Live: ``[COUNTS_PER_CLASS * i + k]`` is class i's count k (the protocol's COUNT_* layout)."""
        reads = (self.n_wait_prefill, self.n_prefill, self.n_wait_decode, self.n_decode_mixed, self.n_decode_solo)
        return SnapshotCounts(lambda: COUNTS_PER_CLASS * self.n_classes,
                              lambda k: reads[k % COUNTS_PER_CLASS](k // COUNTS_PER_CLASS))

    # -- view: GPUs --------------------------------------------------------------------------------
    def gpu_prefill(self, g: int) -> int:
        return self._pre[g]

    def gpu_decodes(self, g: int) -> int:
        return len(self._dec[g])

    def gpu_free(self, g: int) -> int:
        return self.batch - len(self._dec[g]) - (self._pre[g] >= 0)

    def gpu_mixed(self, g: int) -> bool:
        return self._pre[g] >= 0

    def gpu_pool(self, g: int) -> int:
        return self._pool[g]

    def gpu_max_decodes(self, g: int) -> int:
        return self._maxd[g]

    def gpu_prefill_allowed(self, g: int) -> bool:
        return self._pok[g]

    def gpu_decodes_by_class(self, g: int) -> tuple[int, ...]:
        c = [0] * self.n_classes
        for r in self._dec[g]:
            c[self._req[r].cls] += 1
        return tuple(c)

    def gpu_requests(self, g: int) -> list[int]:
        return ([self._pre[g]] if self._pre[g] >= 0 else []) + sorted(self._dec[g])

    def gpu_kv_used(self, g: int) -> int:
        return 0  # KV caches are not tracked

    def gpu_kv_free(self, g: int) -> float:
        return math.inf  # tells controllers to skip their KV checks

    def idle_prefill(self, pool: int = 0) -> SnapshotGpuSet:
        """Live set: GPUs of ``pool`` allowing prefills, running none, with a free slot."""
        return SnapshotGpuSet(self, lambda g: self._pool[g] == pool and self._pok[g] and self._pre[g] < 0
                              and self.gpu_free(g) > 0)

    def free_decode(self, pool: int = 0) -> SnapshotGpuSet:
        """Live set: GPUs of ``pool`` with a free slot and fewer decodes than their cap."""
        return SnapshotGpuSet(self, lambda g: self._pool[g] == pool and self.gpu_free(g) > 0
                              and len(self._dec[g]) < self._maxd[g])

    # -- view: queues ------------------------------------------------------------------------------
    def queue_id(self, name: str) -> int:
        try:
            return self._qnames.index(name)
        except ValueError:
            raise ActionError(f"queue_id: no queue named {name!r}; known: {', '.join(self._qnames)}") from None

    def instance_queue(self, g: int) -> int:
        self._check_gpu("instance_queue", g)
        return 2 + g

    def qlen(self, q: int, cls: int = -1) -> int:
        return sum(1 for r in self._queues[q] if cls < 0 or self._req[r].cls == cls)

    def head(self, q: int, cls: int = -1) -> int:
        return next((r for r in self._queues[q] if cls < 0 or self._req[r].cls == cls), NO_REQUEST)

    def queue_requests(self, q: int) -> list[int]:
        return list(self._queues[q])

    def queue_counts(self) -> SnapshotCounts:
        """Live: ``[q * n_classes + i]`` is ``qlen(q, i)`` (queues added later included)."""
        I = self.n_classes
        return SnapshotCounts(lambda: I * len(self._queues), lambda k: self.qlen(k // I, k % I))

    def queue_totals(self) -> SnapshotCounts:
        """Live: ``[q]`` is ``qlen(q)``."""
        return SnapshotCounts(lambda: len(self._queues), self.qlen)

    def instance_requests(self, g: int) -> int:
        """Requests waiting in g's instance queue or in service on g."""
        return len(self._queues[2 + g]) + len(self.gpu_requests(g))

    def instance_tokens(self, g: int) -> int:
        """Tokens routed to g: prompt (if not yet prefilled) + output, over instance_requests(g)."""
        rs = self._queues[2 + g] + self.gpu_requests(g)
        return sum(self._req[r].output + (self._req[r].prompt if self._req[r].phase in (WAIT_PREFILL, PREFILL)
                                          else 0) for r in rs)

    # -- view: requests ----------------------------------------------------------------------------
    def req_class(self, r: int) -> int:
        return self._req[r].cls

    def req_prompt(self, r: int) -> int:
        return self._req[r].prompt

    def req_output(self, r: int) -> int:
        """Output tokens as given to add_request (a router passes the client's max_tokens)."""
        return self._req[r].output

    def req_arrival(self, r: int) -> float:
        return self._req[r].arrival

    def req_phase(self, r: int) -> int:
        return self._req[r].phase

    def req_gpu(self, r: int) -> int:
        return self._req[r].gpu

    def req_queue(self, r: int) -> int:
        return self._req[r].queue

    def req_generated(self, r: int) -> int:
        return 0  # not tracked

    def req_preemptions(self, r: int) -> int:
        return 0  # not tracked

    def req_blocks(self, r: int) -> tuple[int, ...]:
        """r's prompt KV block ids as given to :meth:`add_request` (empty if none)."""
        return self._req[r].blocks

    def cached_prefix_tokens(self, r: int, g: int) -> int:
        """Leading tokens of r's prompt in GPU g's index (0 without blocks): the protocol's prefix query."""
        self._check_req("cached_prefix_tokens", r)
        self._check_gpu("cached_prefix_tokens", g)
        rq, index = self._req[r], self._cached[g]
        k = 0
        for b in rq.blocks:
            if b not in index:
                break
            k += 1
        return min(k * (self.block_size or 0), rq.prompt)

    def evict_blocks(self, g: int, blocks: Sequence[int] | None = None) -> None:
        """The engine of GPU g evicted ``blocks`` (None: all) from its prefix cache; the index forgets them."""
        self._check_gpu("evict_blocks", g)
        if blocks is None:
            self._cached[g].clear()
        else:
            self._cached[g].difference_update(int(b) for b in blocks)

    def requests(self) -> list[int]:
        """Ids of the requests in the system, in arrival order."""
        return list(self._req)

    # -- validation (the engine's conditions and wording: fluidopt.control.action_errors) ----------
    def _check_gpu(self, what: str, g: object) -> None:
        _ae.check_gpu(what, g, self.n_gpus)

    def _check_req(self, what: str, r: object) -> None:
        _ae.check_request(what, r, self.now, self._req.__contains__)

    def _check_queue(self, what: str, q: object) -> None:
        _ae.check_queue(what, q, len(self._queues))

    def _unqueue(self, r: int) -> None:
        rq = self._req[r]
        if rq.queue >= 0:
            self._queues[rq.queue].remove(r)
            rq.queue = -1

    # -- actions -----------------------------------------------------------------------------------
    def start_prefill(self, r: int, g: int) -> None:
        """Start r's prefill on g; outbox ``("prefill", r, g)``."""
        w = _ae.action("start_prefill", r, g, self.now)
        self._check_req(w, r)
        self._check_gpu(w, g)
        rq = self._req[r]
        _ae.check_prefill(w, r, g, phase=rq.phase, prefill_allowed=self._pok[g], pool=self._pool[g],
                          running=self._pre[g], used=self.batch - self.gpu_free(g), batch=self.batch)
        self._unqueue(r)
        rq.phase, rq.gpu = PREFILL, g
        self._pre[g] = r
        self.outbox.append(("prefill", r, g))

    def start_decode(self, r: int, g: int) -> None:
        """Start r's decode on g; outbox ``("decode", r, g)``."""
        w = _ae.action("start_decode", r, g, self.now)
        self._check_req(w, r)
        self._check_gpu(w, g)
        rq = self._req[r]
        _ae.check_decode(w, r, g, phase=rq.phase, used=self.batch - self.gpu_free(g), batch=self.batch,
                         decodes=len(self._dec[g]), max_decodes=self._maxd[g])
        self._unqueue(r)
        rq.phase, rq.gpu = DECODE, g
        self._dec[g].append(r)
        self.outbox.append(("decode", r, g))

    def enqueue(self, r: int, q: int, front: bool = False) -> None:
        """Put waiting r at the back (front) of q; outbox ``("enqueue", r, q)`` (``"enqueue_front"``)."""
        w = _ae.action("enqueue", r, q, self.now, key="q")
        self._check_req(w, r)
        self._check_queue(w, q)
        rq = self._req[r]
        _ae.check_enqueue(w, r, rq.phase)
        if rq.queue == q and not front:
            return  # already there: keeps its FCFS position, like the engine
        self._unqueue(r)
        if front:
            self._queues[q].insert(0, r)
        else:
            self._queues[q].append(r)
        rq.queue = q
        self.outbox.append(("enqueue_front" if front else "enqueue", r, q))

    def set_pool(self, gpus: Sequence[int], pool: int, *, prefill: bool = True, max_decodes: int | None = None) -> None:
        """Put ``gpus`` in ``pool``, allow or forbid prefills there, cap their decodes (setup only)."""
        if not self.in_setup:
            raise ActionError("set_pool: pools can only be declared in Controller.setup")
        if isinstance(pool, bool) or not isinstance(pool, int) or pool < 0:
            raise ActionError(f"set_pool: pool: expected an integer >= 0, got {pool!r}")
        md = self.batch if max_decodes is None else max_decodes
        if isinstance(md, bool) or not isinstance(md, int) or not 0 <= md <= self.batch:
            raise ActionError(f"set_pool: max_decodes: expected an integer in 0..{self.batch} (B), got {max_decodes!r}")
        gl = list(gpus)
        for g in gl:
            self._check_gpu("set_pool", g)
        self._n_pools = max(self._n_pools, pool + 1)
        for g in gl:
            self._pool[g], self._pok[g], self._maxd[g] = pool, bool(prefill), md

    def add_queue(self, name: str) -> int:
        """Declare a named FCFS queue (setup only); returns its id."""
        if not self.in_setup:
            raise ActionError("add_queue: queues can only be declared in Controller.setup")
        if not isinstance(name, str) or not name:
            raise ActionError(f"add_queue: name: expected a non-empty string, got {name!r}")
        if name in self._qnames:
            raise ActionError(f"add_queue: a queue named {name!r} already exists")
        self._qnames.append(name)
        self._queues.append([])
        return len(self._queues) - 1

    # -- router side: keep the snapshot in sync with the fleet -------------------------------------
    def setup(self, ctrl: Controller) -> None:
        """Run ``ctrl.setup(self)`` with the setup-only actions enabled."""
        self.in_setup = True
        try:
            ctrl.setup(self)
        finally:
            self.in_setup = False

    def add_request(self, cls: int, prompt: int, output: int = 1, arrival: float | None = None, *,
                    prefilled: bool = False, blocks: Sequence[int] | None = None) -> int:
        """A new request waiting, in no queue; returns its id (never reused).

        ``prompt``, ``output``: tokens (a router passes the client's max_tokens as output);
        ``arrival``: seconds, default :attr:`now`. ``prefilled=True``: it already has its KV cache
        and waits for a decode (a state handed over, e.g. on a router restart), else for a prefill.
        ``blocks``: its prompt's chained KV block ids (needs ``block_size``; prefix caching).
        """
        if blocks is not None and self.block_size is None:
            raise ActionError("add_request: blocks: the snapshot has no block_size (give it at construction)")
        if isinstance(cls, bool) or not isinstance(cls, int) or not 0 <= cls < self.n_classes:
            raise ActionError(f"add_request: cls: expected an integer in 0..{self.n_classes - 1}, got {cls!r}")
        r = self._next_id
        self._next_id += 1
        self._req[r] = _Req(cls, int(prompt), int(output), self.now if arrival is None else float(arrival),
                            WAIT_DECODE if prefilled else WAIT_PREFILL, blocks=tuple(map(int, blocks or ())))
        return r

    def prefill_finished(self, r: int) -> int:
        """r's prefill finished: its GPU's prefill slot is free, r waits for a decode. Returns the GPU."""
        self._check_req("prefill_finished", r)
        rq = self._req[r]
        if rq.phase != PREFILL:
            raise ActionError(f"prefill_finished: request {r} is {_PHASE_NAMES[rq.phase]}, not in prefill")
        g = rq.gpu
        self._pre[g] = NO_REQUEST
        rq.phase, rq.gpu = WAIT_DECODE, NO_REQUEST
        self._cached[g].update(rq.blocks)  # computed there: the router's index now has them
        return g

    def decode_finished(self, r: int) -> int:
        """r completed: it leaves the system and its slot is free. Returns the GPU."""
        self._check_req("decode_finished", r)
        rq = self._req[r]
        if rq.phase != DECODE:
            raise ActionError(f"decode_finished: request {r} is {_PHASE_NAMES[rq.phase]}, not decoding")
        self._dec[rq.gpu].remove(r)
        del self._req[r]
        return rq.gpu

    def abandon(self, r: int) -> int:
        """Waiting r gave up: it leaves the system. Returns the queue it waited in (-1 if none)."""
        self._check_req("abandon", r)
        rq = self._req[r]
        if rq.phase not in (WAIT_PREFILL, WAIT_DECODE):
            raise ActionError(f"abandon: request {r} is {_PHASE_NAMES[rq.phase]}, not waiting")
        q = rq.queue
        self._unqueue(r)
        del self._req[r]
        return q

    def preempted(self, r: int) -> int:
        """r was evicted from its GPU (prefill or decode): it waits for a new prefill, in no queue.

        Returns the GPU it left.
        """
        self._check_req("preempted", r)
        rq = self._req[r]
        if rq.phase not in (PREFILL, DECODE):
            raise ActionError(f"preempted: request {r} is {_PHASE_NAMES[rq.phase]}, not in service")
        g = rq.gpu
        if rq.phase == PREFILL:
            self._pre[g] = NO_REQUEST
        else:
            self._dec[g].remove(r)
        rq.phase, rq.gpu = WAIT_PREFILL, NO_REQUEST
        return g
