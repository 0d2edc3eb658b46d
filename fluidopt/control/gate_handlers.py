# cython: boundscheck=False, initializedcheck=False
"""The event handlers of the gate-and-route family, written once for both paths (docs/simulator.md
section 9, "One source for a controller's handlers").

:class:`GateHandlers` is a mixin of :class:`~fluidopt.control.gate_and_route.PartitionedController`: its
methods *are* the handlers of Gate-and-Route, Prioritize-and-Route, SLI-aware Gate-and-Route and the
robust variants of :mod:`fluidopt.control.robust`, on any :class:`~fluidopt.control.protocol.Context`
(the Python engine, a router's snapshot, the compiled engine with ``FLUIDOPT_FAST_CONTROLLERS=0``).
setup.py also compiles this very file, with the static types of ``fluidopt/sim/gate_handlers.pxd``,
into ``fluidopt.sim._c_gate_handlers``; on the compiled core :mod:`fluidopt.sim.controller_fastpath`
installs that class's handlers as the engine's callbacks, with the controller's plan (:data:`STATE`)
copied over at setup and again after every change of plan (a re-solve calls ``_sync_fast``). There is
no second copy to keep in step: the compiled module carries the SHA-256 of this file and of its .pxd.

What a controller of the family is, as the handlers see it (set by the controller's planning code,
:mod:`fluidopt.control.gate_and_route` and :mod:`fluidopt.control.robust`):

* the *route* (:data:`ROUTE_GREEDY`: an arrival joins the prefill queue and the gate fills the idle
  reserved slots, a finished prefill goes to a free solo slot, else a free mixed decode slot, else
  the FCFS decode buffer; :data:`ROUTE_SLI`: the decode pool is drawn with the plan's probability
  p_s,i and each pool has its own buffer; :data:`ROUTE_ROBUST`: the greedy route with the robust
  variants' events: re-solve counts, overflow prefills on free solo slots, a value-ordered buffer);
* the *gate* over the classes ``_adm`` (the admissible classes; a priority gate: in priority order):
  the deviation index argmin_i (X_i - n x_i*) / x_i* (ties: the largest Q_p,i - n q_p,i*, then the
  lowest index), or the first waiting class in priority order (``_priority_gate``); a class is skipped
  at its cap (``_cap``; none when ``_uncapped``) and, with backpressure (``_bp``), while no decode slot
  is free and the decodes ahead of it (:meth:`GateHandlers._ahead_of`) fill the slots the plan frees
  during one of its prefills (``_room``). The plain controllers have no caps and no backpressure.

Rules for a handler module compiled this way (as fluidopt/control/fcfs_handlers.py): only the
protocol's reads and actions on ``ctx``, on the pools' GPU sets (``ctx.idle_prefill(pool)`` and
``ctx.free_decode(pool)``, live sets that the controller reads once, at setup, after declaring the
pools) and on the live counts (``ctx.class_counts()``, ``ctx.queue_counts()``, ``ctx.queue_totals()``,
read once at the end of setup; the compiled class reads them as C arrays, where a call of the view
would cost a call through the engine's method table per count); ``s.has(g)`` for a GPU set; one type per local, declared in the
.pxd; no closures, generators or comprehensions; module constants bound by assignment. Per-class plan
data are typed arrays (``array('d')`` / ``array('q')``: the compiled class reads them as C arrays), and
the counts the handlers change during a run are shared with the controller, not copied: the arrival
counts of the re-solve window (``_counts``), the overflow count (``_over``, one element) and the
time-averaged caps' state (``_cap``, ``_avg_int``, ``_avg_x``, ``_avg_t``).

The compiled build indexes these arrays without bounds checks (the directive on the first line: the
checks cost more than the gate's arithmetic), so the binder first checks the state with
:func:`check_state` (every per-class array of length I, every class index below I), at setup and after
every change of plan; the indices the handlers compute come from that state or from the engine's reads.
"""

from __future__ import annotations

from array import array

from fluidopt.control import protocol as _P

__all__ = ["STATE", "GateHandlers", "ROUTE_GREEDY", "ROUTE_SLI", "ROUTE_ROBUST", "check_state", "doubles", "ints",
           "plain_state"]

# the protocol's queues and the family's pools, bound by assignment (gate_handlers.pxd types them as C integers)
PREFILL_QUEUE = _P.PREFILL_QUEUE
DECODE_QUEUE = _P.DECODE_QUEUE
COUNTS_PER_CLASS = _P.COUNTS_PER_CLASS
COUNT_PREFILL = _P.COUNT_PREFILL
COUNT_DECODE_MIXED = _P.COUNT_DECODE_MIXED
COUNT_DECODE_SOLO = _P.COUNT_DECODE_SOLO
MIXED_POOL = 0
SOLO_POOL = 1
ROUTE_GREEDY = 0
ROUTE_SLI = 1
ROUTE_ROBUST = 2
INF = float("inf")

# The controller's attributes the handlers read (copied to the compiled handlers at bind and at every
# _sync_fast; the arrays among them are shared, not copied).
STATE = (
    # the fleet and the route; the pools' idle-prefill and free-decode sets (None for a pool not declared); the
    # live counts (ClusterView.class_counts, queue_counts, queue_totals) and the number of classes
    "_kv", "_has_mixed", "_has_solo", "mixed_gpus", "n_gpus", "_route", "_idle_mixed", "_idle_solo", "_free_mixed",
    "_free_solo", "_class_counts", "_queue_counts", "_queue_totals", "_n_cls",
    # the gate
    "_priority_gate", "_adm", "_nx", "_inv_x", "_nqp", "_bp", "_uncapped", "_cap", "_room", "_fcfs_buffer",
    "_t_off", "_t_j", "_t_p",
    # the robust events: re-solve counts, the value-ordered buffer, overflow and its floating capacity
    "resolve", "_counts", "_all_decodable", "_decodable", "_value_order", "_dorder", "_may_overflow",
    "_max_overflow", "_over", "_overflow_caps", "_elastic_on", "_ovcap_el", "_slots_on", "_decode_slots",
    "_float_room", "_float_cls", "_ovcap_now",
    # the SLI route, and its time-averaged caps
    "_p", "_buf", "_avg_on", "_avg", "_avg_is", "_avg_lo", "_avg_floor", "_avg_int", "_avg_x", "_avg_t",
    # scratch: whether a decode slot is free, asked once per gate call (_held_back)
    "_free_now",
)
# which caps the gate applies (_gate): none, the controller's own (_cap), or the overflow caps now in use
# (_ovcap_now, which the caller fills)
NO_CAPS = 0
OWN_CAPS = 1
OVERFLOW_CAPS = 2


def doubles(values) -> array:
    """Per-class numbers as the handlers read them (64-bit floats)."""
    return array("d", [float(v) for v in values])


def ints(values) -> array:
    """Per-class integers or flags as the handlers read them (64-bit integers)."""
    return array("q", [int(v) for v in values])


def plain_state(n_classes: int) -> dict:
    """The handlers' state of a controller without the robust mechanisms, for ``n_classes`` classes (every
    attribute of :data:`STATE` but the fleet's, the live counts, the gate's targets and order, which the
    controller sets):
    the greedy route, no caps, no backpressure, an FCFS buffer, no overflow, the SLI route's buffers as
    the one decode buffer, no time-averaged caps."""
    I = int(n_classes)
    return {
        "_idle_mixed": None, "_idle_solo": None, "_free_mixed": None, "_free_solo": None, "_class_counts": None,
        "_queue_counts": None, "_queue_totals": None, "_n_cls": I, "_route": ROUTE_GREEDY, "_priority_gate": False,
        "_bp": False, "_uncapped": True, "_fcfs_buffer": True,
        "_cap": doubles([INF] * I), "_room": doubles([0.0] * I),
        "_t_off": ints([0] * (I + 1)), "_t_j": ints([]), "_t_p": doubles([]),
        "resolve": False, "_counts": ints([0] * I), "_all_decodable": True, "_decodable": ints([1] * I),
        "_value_order": False, "_dorder": ints(range(I)), "_may_overflow": ints([0] * I), "_max_overflow": 0,
        "_over": ints([0]), "_overflow_caps": doubles([INF] * I), "_elastic_on": False, "_ovcap_el": doubles([INF] * I),
        "_slots_on": False, "_decode_slots": 0, "_float_room": doubles([0.0] * I), "_float_cls": ints([0] * I),
        "_ovcap_now": doubles([INF] * I),
        "_p": doubles([1.0] * I), "_buf": ints([DECODE_QUEUE, DECODE_QUEUE]), "_avg_on": False, "_avg": ints([]),
        "_avg_is": ints([0] * I), "_avg_lo": ints([0] * I), "_avg_floor": doubles([0.0] * I),
        "_avg_int": doubles([0.0] * I), "_avg_x": ints([0] * I), "_avg_t": doubles([0.0]), "_free_now": -1,
    }


_PER_CLASS = ("_nx", "_inv_x", "_nqp", "_cap", "_room", "_counts", "_decodable", "_may_overflow", "_overflow_caps",
              "_ovcap_el", "_ovcap_now", "_float_room", "_float_cls", "_p", "_avg_is", "_avg_lo", "_avg_floor",
              "_avg_int", "_avg_x")
_CLASS_LISTS = ("_adm", "_dorder", "_avg", "_t_j")


def check_state(ctrl) -> None:
    """Raise ValueError unless ``ctrl``'s handler state (:data:`STATE`) is consistent: the live counts are
    read (setup has run) and cover every class and queue the handlers index, every per-class array has
    one value per class, every class index is a class, the backpressure terms' offsets run from 0 to the
    number of terms, the SLI route has its two buffers. The compiled handlers rely on it."""
    who = type(ctrl).__name__
    I = len(ctrl._nx)
    if ctrl._class_counts is None or ctrl._queue_counts is None or ctrl._queue_totals is None:
        raise ValueError(f"{who}: the live counts are not read yet (setup reads them)")
    nq = len(ctrl._queue_totals)
    if ctrl._n_cls != I or len(ctrl._class_counts) < COUNTS_PER_CLASS * I or len(ctrl._queue_counts) != nq * I:
        raise ValueError(f"{who}: the live counts do not match {I} classes and {nq} queues: "
                         f"{len(ctrl._class_counts)} class counts, {len(ctrl._queue_counts)} queue counts")
    bad = [int(q) for q in ctrl._buf if not 0 <= q < nq] + ([] if nq >= 2 else [DECODE_QUEUE])
    if bad:
        raise ValueError(f"{who}._buf: expected queue ids 0..{nq - 1}, got {bad}")
    for name in _PER_CLASS:
        n = len(getattr(ctrl, name))
        if n != I:
            raise ValueError(f"{who}.{name}: expected {I} values (one per class), got {n}")
    for name in _CLASS_LISTS:
        bad = [int(v) for v in getattr(ctrl, name) if not 0 <= v < I]
        if bad:
            raise ValueError(f"{who}.{name}: expected class indices 0..{I - 1}, got {bad}")
    off = list(ctrl._t_off)
    if (len(off) != I + 1 or off[0] != 0 or off[I] != len(ctrl._t_j) or len(ctrl._t_p) != len(ctrl._t_j)
            or any(b < a for a, b in zip(off, off[1:]))):
        raise ValueError(f"{who}._t_off: expected {I + 1} nondecreasing offsets from 0 to {len(ctrl._t_j)}, got {off}")
    for name, n in (("_buf", 2), ("_over", 1), ("_avg_t", 1)):
        if len(getattr(ctrl, name)) != n:
            raise ValueError(f"{who}.{name}: expected {n} values, got {len(getattr(ctrl, name))}")


class GateHandlers:
    """The gate-and-route family's gate, routers and event handlers (see the module docstring)."""

    # -- the live counts ---------------------------------------------------------------------------
    def _qlen(self, q, i):
        """``ctx.qlen(q, i)``, from the live queue counts."""
        return self._queue_counts[q * self._n_cls + i]

    def _qtot(self, q):
        """``ctx.qlen(q)``, from the live queue totals."""
        return self._queue_totals[q]

    def _class_count(self, i, k):
        """Class i's count k (COUNT_PREFILL: ``ctx.n_prefill(i)``), from the live class counts."""
        return self._class_counts[COUNTS_PER_CLASS * i + k]

    # -- the gate -----------------------------------------------------------------------------------
    def gate_class(self, ctx, capped=True):
        """The class the gate admits next, or -1. ``capped``: the controller's own caps (none for the
        plain controllers); else the overflow caps (the classes allowed on a free solo slot)."""
        if not capped:
            for i in range(len(self._ovcap_now)):
                self._ovcap_now[i] = self._overflow_caps[i]
            return self._gate(ctx, OVERFLOW_CAPS)
        caps = NO_CAPS if self._uncapped else OWN_CAPS
        if self._avg_on:
            # time-averaged caps (robust.BackpressureSLIGateAndRoute): integrate, then gate
            self._avg_cap(ctx)
            i = self._gate(ctx, caps)
            if i >= 0 and self._avg_is[i]:
                self._avg_x[i] += 1  # the caller starts it now: X_i is one higher from here on
            return i
        return self._gate(ctx, caps)

    def _gate(self, ctx, caps):
        """The gate with the caps ``caps`` (NO_CAPS, OWN_CAPS or OVERFLOW_CAPS)."""
        if self._priority_gate:
            return self._gate_priority(ctx, caps)
        return self._gate_deviation(ctx, caps)

    def _over_cap(self, caps, i, X):
        """Class i, with X_i = X, is at its cap."""
        if caps == OWN_CAPS:
            return X >= self._cap[i]
        return caps == OVERFLOW_CAPS and X >= self._ovcap_now[i]

    def _gate_deviation(self, ctx, caps):
        """argmin_i (X_i - n x_i*) / x_i* over the waiting admissible classes below their cap and, with
        backpressure, with room for their decode. O(I)."""
        # (the plan is read as self._nx[i], not through local aliases: a compiled alias of an array costs a
        # reference count, atomically, per call)
        best = -1
        best_dev = 0.0
        best_tie = 0.0
        self._free_now = -1
        for k in range(len(self._adm)):
            i = self._adm[k]
            q = self._qlen(PREFILL_QUEUE, i)
            if q == 0:
                continue
            X = self._class_count(i, COUNT_PREFILL)
            if caps and self._over_cap(caps, i, X):
                continue
            if self._bp and self._held_back(ctx, i):
                continue
            dev = (X - self._nx[i]) * self._inv_x[i]
            tie = q - self._nqp[i]
            if best < 0 or dev < best_dev or (dev == best_dev and tie > best_tie):
                best = i
                best_dev = dev
                best_tie = tie
        return best

    def _gate_priority(self, ctx, caps):
        """The first waiting class in priority order (``_adm``) below its cap and, with backpressure, with
        room for its decode. O(I)."""
        self._free_now = -1
        for k in range(len(self._adm)):
            i = self._adm[k]
            if not self._qlen(PREFILL_QUEUE, i) or (caps and self._over_cap(caps, i, self._class_count(i, COUNT_PREFILL))):
                continue
            if self._bp and self._held_back(ctx, i):
                continue
            return i
        return -1

    def _held_back(self, ctx, i):
        """Backpressure holds class i back: no decode slot is free now, and the decodes ahead of it fill the
        slots the plan frees during one of its prefills. Whether a slot is free (``_free_now``: -1 not
        asked yet, 0 or 1) is asked once per gate call."""
        if self._free_now < 0:
            self._free_now = 1 if self._decode_slot_free_now(ctx) else 0
        return not self._free_now and self._ahead_of(i) >= self._room[i]

    def _decode_slot_free_now(self, ctx):
        """The decode buffer is empty and some GPU has a free decode slot."""
        return self._qtot(DECODE_QUEUE) == 0 and self._free_decode_slot(ctx)

    def _free_decode_slot(self, ctx):
        """Some GPU has a free decode slot (a fleet too small for one of the pools declares only the other)."""
        return bool((self._has_solo and len(self._free_solo) > 0) or (self._has_mixed and len(self._free_mixed) > 0))

    def _ahead_of(self, i):
        """The decodes that will want a slot within one mean class-i prefill before a class-i decode: those
        waiting ahead of it in the buffer (FCFS: all; value order: its own class and higher ones) plus
        the prefills in flight of those classes expected to finish by then (the terms ``_t_j`` /
        ``_t_p`` from ``_t_off[i]`` to ``_t_off[i + 1]``: class j, probability), from the live counts."""
        if self._fcfs_buffer:
            tot = float(self._qtot(DECODE_QUEUE))
            for k in range(self._t_off[i], self._t_off[i + 1]):
                tot += self._class_count(self._t_j[k], COUNT_PREFILL) * self._t_p[k]
        else:
            tot = 0.0
            for k in range(self._t_off[i], self._t_off[i + 1]):
                j = self._t_j[k]
                tot += self._qlen(DECODE_QUEUE, j) + self._class_count(j, COUNT_PREFILL) * self._t_p[k]
        return tot

    def _avg_cap(self, ctx):
        """Time-averaged caps: integrate X_i - n x_i* up to now (X_i constant since the last update, the
        integral bounded below by ``_avg_floor``) and set class i's cap to floor(n x_i*) + 1 while the
        integral is negative, else floor(n x_i*)."""
        now = ctx.now
        dt = now - self._avg_t[0]
        self._avg_t[0] = now
        for k in range(len(self._avg)):
            i = self._avg[k]
            v = self._avg_int[i] + (self._avg_x[i] - self._nx[i]) * dt
            if self._avg_floor[i] > v:
                v = self._avg_floor[i]
            self._avg_int[i] = v
            self._avg_x[i] = self._class_count(i, COUNT_PREFILL)
            lo = self._avg_lo[i]
            self._cap[i] = lo + 1 if (v < 0 and lo < self._nx[i]) else lo  # (an array of doubles: stored as float)

    # -- admission --------------------------------------------------------------------------------
    def _fits(self, ctx, r, g):
        """KV capacity (tokens mode only): r's context (prompt + generated tokens) fits in g's free cache."""
        return not self._kv or ctx.gpu_kv_free(g) >= ctx.req_prompt(r) + ctx.req_generated(r)

    def _admit_on(self, ctx, g):
        """Start the gate's choice on GPU g (which must have an idle prefill slot); False if none starts."""
        i = self.gate_class(ctx)
        if i < 0:
            return False
        r = ctx.head(PREFILL_QUEUE, i)
        if self._kv and not self._fits(ctx, r, g):
            return False  # KV full: the slot waits for the next freed capacity
        ctx.start_prefill(r, g)
        return True

    def _admit_all(self, ctx):
        """Fill the mixed pool's idle prefill slots (a random GPU each time) while the gate admits a class."""
        idle = self._idle_mixed
        while len(idle):
            if not self._admit_on(ctx, idle.choice()):
                return

    def _prefill_slot_idle(self, ctx, g):
        return ctx.gpu_prefill_allowed(g) and ctx.gpu_prefill(g) < 0 and ctx.gpu_free(g) > 0

    def _try_overflow(self, ctx, g=-1):
        """Start gate-admitted prefills on solo GPUs with a free slot (on g if g >= 0, else random ones),
        up to the churn bound ``_max_overflow``. A free solo slot means the decode pool has room now: the
        overflow caps apply instead of the caps, and backpressure still does."""
        if self._over[0] >= self._max_overflow:
            return
        idle = self._idle_solo
        while self._over[0] < self._max_overflow:
            h = g if g >= 0 else idle.choice()
            if h < 0 or not idle.has(h):
                return
            if self._slots_on:
                self._slots_caps(ctx)
            else:  # the floating GPU (elastic): its caps while no solo GPU runs a prefill
                elastic = self._elastic_on and self._over[0] < 1
                for j in range(len(self._ovcap_now)):
                    self._ovcap_now[j] = self._ovcap_el[j] if elastic else self._overflow_caps[j]
            i = self._gate(ctx, OVERFLOW_CAPS)
            if i < 0:
                return
            r = ctx.head(PREFILL_QUEUE, i)
            if self._kv and not self._fits(ctx, r, h):
                return
            ctx.start_prefill(r, h)
            self._over[0] += 1
            if g >= 0:
                return

    def _slots_caps(self, ctx):
        """The overflow caps with the floating capacity that follows the idle decode slots (into
        ``_ovcap_now``): a floating class may overflow while the decode slots free now (not held by an
        overflow prefill) plus ``_float_room`` exceed the decodes ahead of it."""
        used = self._over[0]
        for j in range(len(self._float_cls)):
            used += self._class_count(j, COUNT_DECODE_MIXED) + self._class_count(j, COUNT_DECODE_SOLO)
        free = self._decode_slots - used
        for i in range(len(self._float_cls)):
            if self._float_cls[i] and self._ahead_of(i) < self._float_room[i] + free:
                self._ovcap_now[i] = INF
            else:
                self._ovcap_now[i] = self._overflow_caps[i]

    # -- routing ----------------------------------------------------------------------------------
    def _greedy_place(self, ctx, r):
        """Greedy router: a random solo GPU with a free slot, else a random mixed GPU with a free decode slot."""
        kv = self._kv
        if self._has_solo:
            g = self._free_solo.choice()
            if g >= 0 and (not kv or self._fits(ctx, r, g)):
                ctx.start_decode(r, g)
                return True
        if self._has_mixed:
            g = self._free_mixed.choice()
            if g >= 0 and (not kv or self._fits(ctx, r, g)):
                ctx.start_decode(r, g)
                return True
        return False

    def _pool_for(self, ctx, i):
        """The SLI route's decode pool for class i: solo with probability p_s,i (drawn only when the split
        is random, so that deterministic splits do not consume the stream)."""
        if not self._has_solo:
            return MIXED_POOL
        if not self._has_mixed:
            return SOLO_POOL
        p = self._p[i]
        if p >= 1.0:
            return SOLO_POOL
        if p <= 0.0:
            return MIXED_POOL
        return SOLO_POOL if ctx.rng.random() < p else MIXED_POOL

    def _pull_decodes(self, ctx, g, queue):
        """Fill g's free decode slots from ``queue``: its FCFS head across classes, or with the value order
        (``_value_order``), the head of the first class in ``_dorder`` that waits."""
        free = self._free_mixed if ctx.gpu_pool(g) == MIXED_POOL else self._free_solo
        kv = self._kv
        while free.has(g):
            if self._value_order:
                r = -1
                for k in range(len(self._dorder)):
                    r = ctx.head(queue, self._dorder[k])
                    if r >= 0:
                        break
            else:
                r = ctx.head(queue)
            if r < 0 or (kv and not self._fits(ctx, r, g)):
                return
            ctx.start_decode(r, g)

    # -- events -----------------------------------------------------------------------------------
    def on_arrival(self, ctx, r):
        if self._route != ROUTE_ROBUST:
            # Queue first, then let the gate choose among everything waiting (by the invariant "no idle
            # reserved slot while an admissible class waits" that is r itself, but the gate stays exact
            # even if a real router hands over a state that breaks the invariant).
            ctx.enqueue(r, PREFILL_QUEUE)
            if self._has_mixed:
                self._admit_all(ctx)
            return
        i = ctx.req_class(r)
        if self.resolve:
            self._counts[i] += 1
        ctx.enqueue(r, PREFILL_QUEUE)
        if self._qlen(PREFILL_QUEUE, i) > 1:
            # Class i already waited, so the gate has judged this state: every other change that can open a
            # slot (a completion, a drained buffer, a re-solve) re-runs it.
            return
        if self._has_mixed:
            self._admit_all(ctx)
        if self._max_overflow and self._may_overflow[i] and self._qlen(PREFILL_QUEUE, i):
            self._try_overflow(ctx, -1)

    def on_prefill_done(self, ctx, r, g):
        route = self._route
        if route == ROUTE_GREEDY:
            self._greedy_place(ctx, r)  # unplaced: the engine appends r to DECODE_QUEUE (FCFS buffer)
        elif route == ROUTE_ROBUST:
            if g >= self.mixed_gpus:
                self._over[0] -= 1  # the overflow GPU is solo again
            if self._all_decodable or self._decodable[ctx.req_class(r)]:
                self._greedy_place(ctx, r)  # a class the plan never decodes waits in the buffer, as planned
        else:
            if self._avg_on:
                self._avg_cap(ctx)
            pool = self._pool_for(ctx, ctx.req_class(r))
            h = (self._free_mixed if pool == MIXED_POOL else self._free_solo).choice()
            if h >= 0 and self._fits(ctx, r, h):
                ctx.start_decode(r, h)
            else:
                ctx.enqueue(r, self._buf[pool])

    def on_slot_freed(self, ctx, g):
        route = self._route
        if route == ROUTE_GREEDY:
            # Mixed GPU: its prefill slot goes to the gate, its decode slots to the buffer head; solo GPU:
            # its slots go to the buffer head.
            if (self._idle_mixed if ctx.gpu_pool(g) == MIXED_POOL else self._idle_solo).has(g):
                self._admit_on(ctx, g)
            if self._qtot(DECODE_QUEUE):
                self._pull_decodes(ctx, g, DECODE_QUEUE)
            return
        if route == ROUTE_SLI:
            if self._prefill_slot_idle(ctx, g):
                self._admit_on(ctx, g)
            self._pull_decodes(ctx, g, self._buf[MIXED_POOL if ctx.gpu_pool(g) == MIXED_POOL else SOLO_POOL])
            return
        if self._qtot(DECODE_QUEUE):
            self._pull_decodes(ctx, g, DECODE_QUEUE)
        if not self._qtot(PREFILL_QUEUE):
            return  # nothing waits for a prefill: the gate would refuse, and no overflow can start
        mixed = g < self.mixed_gpus  # the pools are the ranges declared at setup
        judged = False
        pending = True  # prefills wait: asked above, and asked again only after one may have started
        if mixed and self._idle_mixed.has(g):
            judged = not self._admit_on(ctx, g)  # the gate refused this very state: no need to ask again
            pending = judged or self._qtot(PREFILL_QUEUE) != 0
        if not judged and pending and self._bp and self._has_mixed and len(self._idle_mixed) > 0:
            # a freed or drained decode slot may lift the backpressure on reserved slots held idle
            self._admit_all(ctx)
            pending = self._qtot(PREFILL_QUEUE) != 0
        if self._max_overflow and not mixed and pending and self._idle_solo.has(g):
            self._try_overflow(ctx, g)

    def on_abandon(self, ctx, r, q):
        if q == DECODE_QUEUE and self._holding(ctx):
            self._admit_all(ctx)  # the buffer shrank: backpressure may lift

    def _holding(self, ctx):
        """Backpressure may be holding idle reserved slots while prefills wait."""
        return (self._bp and self._has_mixed and self._qtot(PREFILL_QUEUE) != 0
                and len(self._idle_mixed) > 0)

    def on_preempt(self, ctx, r, g):
        if self._route == ROUTE_ROBUST:
            # KV preemption (tokens mode) may evict an overflow prefill: recount the solo GPUs running one
            # (O(n), rare) so that the churn bound stays exact
            k = 0
            for h in range(self.mixed_gpus, self.n_gpus):
                if ctx.gpu_prefill(h) >= 0:
                    k += 1
            self._over[0] = k
        elif self._avg_on:
            self._avg_cap(ctx)  # X_i may have dropped

    def on_drop(self, ctx, r, g):
        self.on_preempt(ctx, r, g)
