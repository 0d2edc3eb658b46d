"""A real router that embeds a fluidopt gate-and-route controller: no simulator involved.

The router owns its fleet's state. It keeps a small snapshot object, :class:`FleetState`, that
implements fluidopt's controller protocol (``fluidopt.control.protocol.Context``: the read-only
``ClusterView`` plus the ``Actions``), and runs its own asyncio event loop:

1. an event arrives (a client request, or a GPU backend reporting a finished prefill or decode);
2. the router updates the snapshot (the request is waiting / the GPU's slot is free);
3. it calls the controller's handler for that event (``on_arrival``, ``on_prefill_done``,
   ``on_decode_done``, then ``on_slot_freed``), which reads the snapshot and takes actions;
4. every action (``start_prefill(r, g)``, ``start_decode(r, g)``) updates the snapshot at once and
   lands in an outbox; the router sends the outbox to the backends.

Snapshot in, decisions out: the controller never sees the backends, and nothing here imports the
simulator. The controller is Gate-and-Route (paper Thm 4.1) built from the bundled fluid LP of the
paper's two-class instance: ``GateAndRoute.from_solution(solve_fluid(scenario))``; it sizes its
static partition to the fleet it is given in ``setup`` (M = ceil(n sum x*) mixed GPUs).

The backends are stand-ins for vLLM servers: asyncio tasks that sleep for the iteration-time law's
duration (scaled by ``--time-scale``: 0.01 replays 100x faster than real time) and report back. In
production they would be HTTP/gRPC calls to the GPU servers and the completions their responses.

    python examples/real_router.py                       # 4 GPUs, 40 requests, every decision printed
    python examples/real_router.py --gpus 8 --requests 200 --quiet
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import time
from collections.abc import Iterator, Sequence

import numpy as np

import fluidopt
from fluidopt.control.gate_and_route import MIXED_POOL, GateAndRoute
from fluidopt.control.protocol import (
    DECODE,
    DECODE_QUEUE,
    PREFILL,
    PREFILL_QUEUE,
    WAIT_DECODE,
    WAIT_PREFILL,
    Context,
    Controller,
)
from fluidopt.errors import ActionError
from fluidopt.fluid import solve_fluid


# =================================================================================================
# The router's state snapshot: fluidopt's controller protocol over plain Python structures
# =================================================================================================
class LiveSet:
    """A live view of the GPUs satisfying a predicate (the protocol's GpuSet); O(n) per call."""

    def __init__(self, state: FleetState, pred):
        self._state, self._pred = state, pred

    def _items(self) -> list[int]:
        return [g for g in range(self._state.n_gpus) if self._pred(g)]

    def __len__(self) -> int:
        return len(self._items())

    def __contains__(self, g: object) -> bool:
        return isinstance(g, int) and 0 <= g < self._state.n_gpus and self._pred(g)

    def __iter__(self) -> Iterator[int]:
        return iter(self._items())

    def choice(self) -> int:
        items = self._items()
        return self._state.rng.choice(items) if items else -1

    def first(self) -> int:
        items = self._items()
        return items[0] if items else -1


class FleetState:
    """What the router knows: GPUs (slots, pools, caps), requests, FCFS queues; actions go to an outbox.

    Request ids are the router's own integers. A router does not know a request's true output
    length: ``req_output`` returns the client's ``max_tokens`` (gate-and-route never reads it).
    """

    def __init__(self, n_gpus: int, batch: int, class_names: Sequence[str], clock, seed: int = 0):
        self.n_gpus, self.batch = n_gpus, batch
        self.class_names = tuple(class_names)
        self.n_classes = len(self.class_names)
        self.service = "tokens"
        self.rng = random.Random(seed)
        self._clock = clock
        self.pool = [0] * n_gpus
        self.prefill_ok = [True] * n_gpus
        self.max_dec = [batch] * n_gpus
        self.prefilling = [-1] * n_gpus
        self.decoding: list[set[int]] = [set() for _ in range(n_gpus)]
        self.queue_names = ["prefill", "decode"]
        self.queues: list[list[int]] = [[], []]
        self.req: dict[int, dict] = {}
        self.outbox: list[tuple[str, int, int]] = []
        self.in_setup = False

    # -- view: time, sizes -------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self._clock()

    @property
    def n_pools(self) -> int:
        return max(self.pool) + 1

    # -- view: per-class counts --------------------------------------------------------------------
    def _count(self, i: int, phase: int, mixed: bool | None = None) -> int:
        return sum(1 for q in self.req.values() if q["cls"] == i and q["phase"] == phase
                   and (mixed is None or (self.prefilling[q["gpu"]] >= 0) == mixed))

    def n_prefill(self, i: int) -> int:
        return self._count(i, PREFILL)

    def n_decode_mixed(self, i: int) -> int:
        return self._count(i, DECODE, True)

    def n_decode_solo(self, i: int) -> int:
        return self._count(i, DECODE, False)

    def n_wait_prefill(self, i: int) -> int:
        return self._count(i, WAIT_PREFILL)

    def n_wait_decode(self, i: int) -> int:
        return self._count(i, WAIT_DECODE)

    # -- view: GPUs -------------------------------------------------------------------------------
    def gpu_prefill(self, g: int) -> int:
        return self.prefilling[g]

    def gpu_decodes(self, g: int) -> int:
        return len(self.decoding[g])

    def gpu_free(self, g: int) -> int:
        return self.batch - len(self.decoding[g]) - (self.prefilling[g] >= 0)

    def gpu_mixed(self, g: int) -> bool:
        return self.prefilling[g] >= 0

    def gpu_pool(self, g: int) -> int:
        return self.pool[g]

    def gpu_max_decodes(self, g: int) -> int:
        return self.max_dec[g]

    def gpu_prefill_allowed(self, g: int) -> bool:
        return self.prefill_ok[g]

    def gpu_decodes_by_class(self, g: int) -> tuple[int, ...]:
        c = [0] * self.n_classes
        for r in self.decoding[g]:
            c[self.req[r]["cls"]] += 1
        return tuple(c)

    def gpu_requests(self, g: int) -> list[int]:
        return ([self.prefilling[g]] if self.prefilling[g] >= 0 else []) + sorted(self.decoding[g])

    def gpu_kv_used(self, g: int) -> int:
        return 0  # this router does not track KV; gpu_kv_free = inf tells controllers so

    def gpu_kv_free(self, g: int) -> float:
        return math.inf

    def idle_prefill(self, pool: int = 0) -> LiveSet:
        return LiveSet(self, lambda g: self.pool[g] == pool and self.prefill_ok[g] and self.prefilling[g] < 0
                       and self.gpu_free(g) > 0)

    def free_decode(self, pool: int = 0) -> LiveSet:
        return LiveSet(self, lambda g: self.pool[g] == pool and self.gpu_free(g) > 0
                       and len(self.decoding[g]) < self.max_dec[g])

    # -- view: queues -----------------------------------------------------------------------------
    def queue_id(self, name: str) -> int:
        return self.queue_names.index(name)

    def instance_queue(self, g: int) -> int:
        raise ActionError("this router has no instance-local queues")

    def qlen(self, q: int, cls: int = -1) -> int:
        return sum(1 for r in self.queues[q] if cls < 0 or self.req[r]["cls"] == cls)

    def head(self, q: int, cls: int = -1) -> int:
        return next((r for r in self.queues[q] if cls < 0 or self.req[r]["cls"] == cls), -1)

    def queue_requests(self, q: int) -> list[int]:
        return list(self.queues[q])

    def instance_requests(self, g: int) -> int:
        return len(self.gpu_requests(g))

    def instance_tokens(self, g: int) -> int:
        return 0

    # -- view: requests ---------------------------------------------------------------------------
    def req_class(self, r: int) -> int:
        return self.req[r]["cls"]

    def req_prompt(self, r: int) -> int:
        return self.req[r]["prompt"]

    def req_output(self, r: int) -> int:
        return self.req[r]["max_tokens"]

    def req_arrival(self, r: int) -> float:
        return self.req[r]["t"]

    def req_phase(self, r: int) -> int:
        return self.req[r]["phase"]

    def req_gpu(self, r: int) -> int:
        return self.req[r]["gpu"]

    def req_queue(self, r: int) -> int:
        return self.req[r]["q"]

    def req_generated(self, r: int) -> int:
        return 0

    def req_preemptions(self, r: int) -> int:
        return 0

    # -- actions (validated: an impossible one raises ActionError and changes nothing) -------------
    def _unqueue(self, r: int) -> None:
        q = self.req[r]["q"]
        if q >= 0:
            self.queues[q].remove(r)
            self.req[r]["q"] = -1

    def start_prefill(self, r: int, g: int) -> None:
        q = self.req.get(r)
        if q is None or q["phase"] != WAIT_PREFILL:
            raise ActionError(f"start_prefill({r}, {g}): request {r} is not waiting for a prefill")
        if not self.prefill_ok[g] or self.prefilling[g] >= 0 or self.gpu_free(g) <= 0:
            raise ActionError(f"start_prefill({r}, {g}): GPU {g} cannot take a prefill now")
        self._unqueue(r)
        q.update(phase=PREFILL, gpu=g)
        self.prefilling[g] = r
        self.outbox.append(("prefill", r, g))

    def start_decode(self, r: int, g: int) -> None:
        q = self.req.get(r)
        if q is None or q["phase"] != WAIT_DECODE:
            raise ActionError(f"start_decode({r}, {g}): request {r} is not waiting for a decode")
        if self.gpu_free(g) <= 0 or len(self.decoding[g]) >= self.max_dec[g]:
            raise ActionError(f"start_decode({r}, {g}): GPU {g} has no free decode slot")
        self._unqueue(r)
        q.update(phase=DECODE, gpu=g)
        self.decoding[g].add(r)
        self.outbox.append(("decode", r, g))

    def enqueue(self, r: int, q: int, front: bool = False) -> None:
        rq = self.req[r]
        if rq["phase"] not in (WAIT_PREFILL, WAIT_DECODE):
            raise ActionError(f"enqueue({r}, {q}): request {r} is not waiting")
        self._unqueue(r)
        if front:
            self.queues[q].insert(0, r)
        else:
            self.queues[q].append(r)
        rq["q"] = q

    def set_pool(self, gpus, pool: int, *, prefill: bool = True, max_decodes: int | None = None) -> None:
        if not self.in_setup:
            raise ActionError("set_pool: setup only")
        for g in gpus:
            self.pool[g], self.prefill_ok[g] = pool, bool(prefill)
            self.max_dec[g] = self.batch if max_decodes is None else max_decodes

    def add_queue(self, name: str) -> int:
        if not self.in_setup:
            raise ActionError("add_queue: setup only")
        self.queue_names.append(name)
        self.queues.append([])
        return len(self.queues) - 1


# =================================================================================================
# The router: its own event loop around the snapshot and the controller
# =================================================================================================
class Router:
    """Events in, controller decisions out to the backends. ``time_scale``: wall seconds per model second."""

    def __init__(self, controller: Controller, scenario: fluidopt.Scenario, *, time_scale: float, seed: int,
                 quiet: bool):
        self.ctrl, self.scenario = controller, scenario
        self.gpu = scenario.gpu
        self.time_scale, self.quiet = time_scale, quiet
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.t0 = time.monotonic()
        self.state = FleetState(scenario.gpus, scenario.gpu.batch, scenario.class_names, self.clock, seed)
        self.tasks: set[asyncio.Task] = set()
        self.log: list[tuple[float, str, int, int]] = []  # (time, action, request, gpu)
        self.peak_decodes = [0] * scenario.gpus
        self.completed = 0
        self._next_id = 0

    def clock(self) -> float:
        return (time.monotonic() - self.t0) / self.time_scale

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"{self.clock():9.3f} s  {text}")

    # -- backends (stand-ins for vLLM servers) ----------------------------------------------------
    async def _backend(self, kind: str, r: int, g: int) -> None:
        gpu, q = self.gpu, self.state.req[r]
        if kind == "prefill":  # chunks of C tokens in mixed iterations
            seconds = math.ceil(q["prompt"] / gpu.chunk) * gpu.tau_mix
        else:  # one token per iteration; a mixed-pool GPU mostly runs mixed iterations
            tau = gpu.tau_mix if self.state.pool[g] == MIXED_POOL and self.state.prefill_ok[g] else gpu.tau_solo
            seconds = q["output"] * tau
        await asyncio.sleep(seconds * self.time_scale)
        await self.inbox.put((f"{kind}_done", r, g))

    def _flush(self) -> None:
        """Send the decisions the controller just made to the backends."""
        st = self.state
        for kind, r, g in st.outbox:
            self.log.append((self.clock(), kind, r, g))
            name = st.class_names[st.req[r]["cls"]]
            pool = "mixed" if st.pool[g] == MIXED_POOL and st.prefill_ok[g] else "solo"
            self.say(f"req {r:4d} ({name:>12s}) -> {kind:7s} on GPU {g} ({pool} pool)")
            if kind == "decode":
                self.peak_decodes[g] = max(self.peak_decodes[g], len(st.decoding[g]))
            t = asyncio.create_task(self._backend(kind, r, g))
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)
        st.outbox.clear()

    # -- event handlers: update the snapshot, call the controller, flush ------------------------------
    def on_arrival(self, cls: int, prompt: int, output: int) -> None:
        st = self.state
        r = self._next_id
        self._next_id += 1
        st.req[r] = {"cls": cls, "prompt": prompt, "output": output, "max_tokens": output, "t": st.now,
                     "phase": WAIT_PREFILL, "q": -1, "gpu": -1}
        self.ctrl.on_arrival(st, r)
        if st.req[r]["phase"] == WAIT_PREFILL and st.req[r]["q"] < 0:
            st.enqueue(r, PREFILL_QUEUE)  # unplaced: the protocol's default
        if st.req[r]["phase"] == WAIT_PREFILL:
            self.say(f"req {r:4d} ({st.class_names[cls]:>12s}) waits for a prefill slot "
                     f"(queue: {st.qlen(PREFILL_QUEUE)})")
        self._flush()

    def on_prefill_done(self, r: int, g: int) -> None:
        st = self.state
        st.prefilling[g] = -1
        st.req[r].update(phase=WAIT_DECODE, gpu=-1)
        self.ctrl.on_prefill_done(st, r, g)
        if st.req[r]["phase"] == WAIT_DECODE and st.req[r]["q"] < 0:
            st.enqueue(r, DECODE_QUEUE)
            self.say(f"req {r:4d} waits in the decode buffer")
        self.ctrl.on_slot_freed(st, g)
        self._flush()

    def on_decode_done(self, r: int, g: int) -> None:
        st = self.state
        st.decoding[g].discard(r)
        del st.req[r]
        self.completed += 1
        self.ctrl.on_decode_done(st, r, g)
        self.ctrl.on_slot_freed(st, g)
        self._flush()

    async def clients(self, arrivals: list[tuple[float, int, int, int]]) -> None:
        for t, cls, prompt, output in arrivals:
            delay = t - self.clock()
            if delay > 0:
                await asyncio.sleep(delay * self.time_scale)
            await self.inbox.put(("arrival", cls, prompt, output))

    async def run(self, arrivals: list[tuple[float, int, int, int]]) -> dict:
        self.t0 = time.monotonic()
        st = self.state
        st.in_setup = True
        self.ctrl.setup(st)
        st.in_setup = False
        feeder = asyncio.create_task(self.clients(arrivals))
        while self.completed < len(arrivals):
            msg = await self.inbox.get()
            if msg[0] == "arrival":
                self.on_arrival(*msg[1:])
            elif msg[0] == "prefill_done":
                self.on_prefill_done(*msg[1:])
            else:
                self.on_decode_done(*msg[1:])
        await feeder
        return self.summary(len(arrivals))

    def summary(self, n_requests: int) -> dict:
        st = self.state
        n = st.n_gpus
        prefills = [sum(1 for _, k, _, h in self.log if k == "prefill" and h == g) for g in range(n)]
        decodes = [sum(1 for _, k, _, h in self.log if k == "decode" and h == g) for g in range(n)]
        return {"requests": n_requests, "completed": self.completed, "end_time_s": self.clock(),
                "mixed_gpus": [g for g in range(n) if st.prefill_ok[g]], "prefills_per_gpu": prefills,
                "decodes_per_gpu": decodes, "peak_decodes_per_gpu": self.peak_decodes,
                "max_decodes_per_gpu": list(st.max_dec), "decisions": len(self.log)}


# =================================================================================================
# Putting it together
# =================================================================================================
def poisson_arrivals(scenario: fluidopt.Scenario, n_requests: int, seed: int) -> list[tuple[float, int, int, int]]:
    """(time s, class, prompt tokens, output tokens): Poisson arrivals, exponential lengths (the clients)."""
    rng = np.random.default_rng(seed)
    rates = np.array([c.rate for c in scenario.classes])
    times = np.cumsum(rng.exponential(1.0 / rates.sum(), n_requests))
    cls = rng.choice(len(rates), size=n_requests, p=rates / rates.sum())
    out = []
    for t, i in zip(times, cls):
        c = scenario.classes[i]
        out.append((float(t), int(i), max(1, round(rng.exponential(c.prompt))), max(1, round(rng.exponential(c.decode)))))
    return out


def run(gpus: int = 4, requests: int = 40, load: float = 0.4, time_scale: float = 0.01, seed: int = 0,
        quiet: bool = False) -> dict:
    """Plan with the fluid LP, build Gate-and-Route, serve ``requests`` requests; a summary dict."""
    scenario = fluidopt.paper_scenario(gpus=gpus, lam=(load, load))
    solution = solve_fluid(scenario)  # bundled pricing, per-GPU targets x*
    controller = GateAndRoute.from_solution(solution)
    print(f"plan: x* = {np.round(solution.x, 4).tolist()} per GPU -> {controller.plan_mixed_gpus(gpus)} of {gpus} "
          f"GPUs mixed; LP revenue {solution.objective_per_gpu:.2f} per GPU per s")
    router = Router(controller, scenario, time_scale=time_scale, seed=seed, quiet=quiet)
    assert isinstance(router.state, Context)  # the snapshot speaks the controller protocol
    return asyncio.run(router.run(poisson_arrivals(scenario, requests, seed)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=4, help="GPUs in the fleet (default 4)")
    ap.add_argument("--requests", type=int, default=40, help="client requests to serve (default 40)")
    ap.add_argument("--load", type=float, default=0.4, help="arrivals per GPU per second and class (default 0.4)")
    ap.add_argument("--time-scale", type=float, default=0.01,
                    help="wall seconds per model second (default 0.01: 100x faster than real time)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="print the summary only")
    a = ap.parse_args(argv)
    s = run(a.gpus, a.requests, a.load, a.time_scale, a.seed, a.quiet)
    print(f"served {s['completed']} of {s['requests']} requests by t = {s['end_time_s']:.1f} s "
          f"({s['decisions']} decisions)")
    print(f"mixed GPUs {s['mixed_gpus']}; prefills per GPU {s['prefills_per_gpu']}; decodes per GPU "
          f"{s['decodes_per_gpu']}; peak concurrent decodes {s['peak_decodes_per_gpu']} (caps {s['max_decodes_per_gpu']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
