"""A real router that embeds a fluidopt gate-and-route controller: no simulator involved.

The router owns its fleet's state. It keeps a snapshot, :class:`fluidopt.control.snapshot.ClusterSnapshot`,
that implements fluidopt's controller protocol (``fluidopt.control.protocol.Context``: the read-only
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

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
import asyncio
import math
import time

import numpy as np

import fluidopt
from fluidopt.control.gate_and_route import MIXED_POOL, GateAndRoute
from fluidopt.control.protocol import (
    DECODE_QUEUE,
    PREFILL_QUEUE,
    WAIT_DECODE,
    WAIT_PREFILL,
    Context,
    Controller,
)
from fluidopt.control.snapshot import ClusterSnapshot
from fluidopt.fluid import solve_fluid


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
        self.state = ClusterSnapshot(scenario.gpus, scenario.gpu.batch, scenario.class_names, clock=self.clock,
                                     seed=seed, service="tokens")
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
        gpu, st = self.gpu, self.state
        if kind == "prefill":  # chunks of C tokens in mixed iterations
            seconds = math.ceil(st.req_prompt(r) / gpu.chunk) * gpu.tau_mix
        else:  # one token per iteration; a mixed-pool GPU mostly runs mixed iterations
            tau = gpu.tau_mix if st.gpu_pool(g) == MIXED_POOL and st.gpu_prefill_allowed(g) else gpu.tau_solo
            seconds = st.req_output(r) * tau
        await asyncio.sleep(seconds * self.time_scale)
        await self.inbox.put((f"{kind}_done", r, g))

    def _flush(self) -> None:
        """Send the decisions the controller just made to the backends."""
        st = self.state
        for kind, r, g in st.outbox:
            if kind not in ("prefill", "decode"):
                continue  # queue moves are the snapshot's own bookkeeping: nothing to send
            self.log.append((self.clock(), kind, r, g))
            name = st.class_names[st.req_class(r)]
            pool = "mixed" if st.gpu_pool(g) == MIXED_POOL and st.gpu_prefill_allowed(g) else "solo"
            self.say(f"req {r:4d} ({name:>12s}) -> {kind:7s} on GPU {g} ({pool} pool)")
            if kind == "decode":
                self.peak_decodes[g] = max(self.peak_decodes[g], st.gpu_decodes(g))
            t = asyncio.create_task(self._backend(kind, r, g))
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)
        st.outbox.clear()

    # -- event handlers: update the snapshot, call the controller, flush ------------------------------
    def on_arrival(self, cls: int, prompt: int, output: int) -> None:
        st = self.state
        r = st.add_request(cls, prompt, output)
        self.ctrl.on_arrival(st, r)
        if st.req_phase(r) == WAIT_PREFILL and st.req_queue(r) < 0:
            st.enqueue(r, PREFILL_QUEUE)  # unplaced: the protocol's default
        if st.req_phase(r) == WAIT_PREFILL:
            self.say(f"req {r:4d} ({st.class_names[cls]:>12s}) waits for a prefill slot "
                     f"(queue: {st.qlen(PREFILL_QUEUE)})")
        self._flush()

    def on_prefill_done(self, r: int, g: int) -> None:
        st = self.state
        st.prefill_finished(r)
        self.ctrl.on_prefill_done(st, r, g)
        if st.req_phase(r) == WAIT_DECODE and st.req_queue(r) < 0:
            st.enqueue(r, DECODE_QUEUE)
            self.say(f"req {r:4d} waits in the decode buffer")
        self.ctrl.on_slot_freed(st, g)
        self._flush()

    def on_decode_done(self, r: int, g: int) -> None:
        st = self.state
        st.decode_finished(r)
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
        st.setup(self.ctrl)  # pools, caps, named queues
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
                "mixed_gpus": [g for g in range(n) if st.gpu_prefill_allowed(g)], "prefills_per_gpu": prefills,
                "decodes_per_gpu": decodes, "peak_decodes_per_gpu": self.peak_decodes,
                "max_decodes_per_gpu": [st.gpu_max_decodes(g) for g in range(n)], "decisions": len(self.log)}


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
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
