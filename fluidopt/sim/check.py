"""``check_controller``: run a user's controller through the checks every built-in one passes.

Like Gymnasium's ``check_env``: call it once on a new controller before trusting its numbers::

    from fluidopt.sim.check import check_controller
    report = check_controller(MyController)       # a class, a factory f(scenario), an object or a name
    print(report)

What it checks, each on a small fleet so the whole call takes a few seconds:

1. **Protocol**: the object is a :class:`~fluidopt.control.protocol.Controller` with a ``name``.
2. **Invariants under simulation**: a run in ``markov`` service and one in ``tokens`` service with a
   KV-cache limit, both with ``check=True`` (every engine invariant verified after every event: slot
   counts, queue membership, pool caps, KV use); an impossible action is reported with the engine's
   own message.
3. **Conservation**: every arrival is completed, abandoned, dropped or still in the system.
4. **Liveness**: requests complete (a controller that never starts work fails here).
5. **Determinism**: the same seed twice gives the same summary, bit for bit.
6. **Snapshot**: the controller drives a :class:`~fluidopt.control.snapshot.ClusterSnapshot` (the
   real-router interface, no simulator) through a scripted stream of arrivals and completions, and
   every decision it leaves in the outbox is valid there too.

A failure raises :class:`ControllerCheckError` naming the check, the service and what went wrong.
A controller is rebuilt for every run (a class or factory is called again; an object is deep-copied
first), since ``setup`` binds it to one fleet.
"""

from __future__ import annotations

import copy
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fluidopt.control.protocol import Controller
from fluidopt.core.errors import FluidoptError, UsageError
from fluidopt.core.model import GPUProfile, RequestClass, Scenario

__all__ = ["CheckReport", "ControllerCheckError", "check_controller", "check_scenario"]


class ControllerCheckError(FluidoptError):
    """A controller failed one of :func:`check_controller`'s checks; the message says which and why."""


@dataclass(frozen=True)
class CheckReport:
    """What :func:`check_controller` ran: the checks passed and per-run facts."""

    controller: str
    checks: tuple[str, ...]
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"check_controller({self.controller!r}): {len(self.checks)} checks passed"]
        lines += [f"  ok  {c}" for c in self.checks]
        for k, v in self.runs.items():
            lines.append(f"  run {k}: " + ", ".join(f"{a} {b}" for a, b in v.items()))
        return "\n".join(lines)


def check_scenario(gpus: int = 4) -> Scenario:
    """The small two-class fleet the checks run on: short and long prompts, impatient customers."""
    gpu = GPUProfile(alpha=0.0174, beta=6.2e-5, tau_solo=0.022, chunk=64, batch=4, name="check")
    classes = (
        RequestClass("short", prompt=120.0, decode=40.0, rate=2.0 * gpus, patience=0.5),
        RequestClass("long", prompt=600.0, decode=20.0, rate=0.8 * gpus, patience=0.5),
    )
    return Scenario(gpu=gpu, gpus=gpus, classes=classes, prefill_price=0.1, decode_price=0.2, name="check")


def _builder(policy: Any, options: dict[str, Any]) -> tuple[str, Callable[[Scenario], Controller]]:
    from fluidopt.control.registry import make_controller

    if isinstance(policy, str):
        return policy, lambda sc: make_controller(policy, sc, **options)
    if isinstance(policy, Controller):
        return getattr(policy, "name", type(policy).__name__), lambda sc: copy.deepcopy(policy)
    if isinstance(policy, type):
        if not issubclass(policy, Controller):
            raise ControllerCheckError(f"protocol: {policy.__name__} does not subclass fluidopt.control.protocol.Controller")
        return getattr(policy, "name", policy.__name__), lambda sc: policy(**options)
    if callable(policy):
        return getattr(policy, "__name__", "factory"), lambda sc: policy(sc, **options)
    raise ControllerCheckError(
        f"protocol: expected a Controller object or class, a factory f(scenario) or a registered name, got {policy!r}"
    )


def _build(make: Callable[[Scenario], Controller], sc: Scenario) -> Controller:
    try:
        ctrl = make(sc)
    except UsageError:
        raise
    except FluidoptError as e:
        raise ControllerCheckError(f"protocol: building the controller failed: {e}") from None
    if not isinstance(ctrl, Controller):
        raise ControllerCheckError(f"protocol: the factory returned {type(ctrl).__name__}, not a Controller")
    if not isinstance(getattr(ctrl, "name", None), str) or not ctrl.name:
        raise ControllerCheckError("protocol: the controller needs a non-empty string attribute 'name'")
    return ctrl


def _run(make, sc: Scenario, service: str, seed: int, horizon: float) -> Any:
    from fluidopt.sim.api import simulate

    try:
        return simulate(sc, _build(make, sc), horizon=horizon, warmup=0.0, seed=seed, service=service, check=True,
                        progress=False, batches=2)
    except ControllerCheckError:
        raise
    except FluidoptError as e:
        raise ControllerCheckError(f"invariants ({service} service): {type(e).__name__}: {e}") from None
    except AssertionError as e:
        raise ControllerCheckError(f"invariants ({service} service): {e}") from None


def _snapshot_drive(make, sc: Scenario, seed: int, arrivals: int = 60) -> int:
    """A scripted router around a ClusterSnapshot (the contract of docs/routing.md: unplaced arrivals join
    PREFILL_QUEUE, unplaced prefilled requests DECODE_QUEUE), fixed service times. Returns completions."""
    from fluidopt.control.protocol import DECODE_QUEUE, PREFILL_QUEUE, WAIT_DECODE, WAIT_PREFILL
    from fluidopt.control.snapshot import ClusterSnapshot
    from fluidopt.core.errors import ActionError

    ctrl = _build(make, sc)
    snap = ClusterSnapshot(sc.gpus, sc.gpu.batch, sc.class_names, seed=seed, service="tokens")
    events: list[tuple[float, int, str, int]] = []  # (time, tiebreak, kind, request)
    tie = 0

    def dispatch() -> None:
        nonlocal tie
        while snap.outbox:
            kind, r, g = snap.outbox.pop(0)
            if kind == "prefill":
                tie += 1
                heapq.heappush(events, (snap.now + 0.02, tie, "prefill_done", r))
            elif kind == "decode":
                tie += 1
                heapq.heappush(events, (snap.now + 0.05, tie, "decode_done", r))

    def unplaced(r: int, phase: int, q: int) -> None:
        if snap.req_phase(r) == phase and snap.req_queue(r) < 0:
            snap.enqueue(r, q)

    done = 0
    tick = getattr(ctrl, "tick_interval", None)
    # One event loop: arrivals every 4 ms, service completions, and the controller's timer if it has one
    # (a router calls on_tick on its own clock). Order at equal times: completions, then ticks, then arrivals.
    for k in range(arrivals):
        tie += 1
        heapq.heappush(events, (0.004 * (k + 1), tie, "arrival", k))
    if tick:
        tie += 1
        heapq.heappush(events, (float(tick), tie, "tick", -1))
    last_arrival = 0.004 * arrivals
    try:
        snap.setup(ctrl)
        dispatch()
        while events:
            tt, _, kind, r = heapq.heappop(events)
            if kind == "tick":
                if done >= arrivals or tt > last_arrival + 30.0:
                    continue  # everything served, or a controller that never will: stop ticking
                snap.now = tt
                ctrl.on_tick(snap)
                dispatch()
                tie += 1
                heapq.heappush(events, (tt + float(tick), tie, "tick", -1))
                continue
            snap.now = tt
            if kind == "arrival":
                cls = r % sc.n_classes
                q = snap.add_request(cls, int(sc.classes[cls].prompt), int(sc.classes[cls].decode))
                ctrl.on_arrival(snap, q)
                unplaced(q, WAIT_PREFILL, PREFILL_QUEUE)
                dispatch()
            elif kind == "prefill_done":
                g = snap.prefill_finished(r)
                ctrl.on_prefill_done(snap, r, g)
                unplaced(r, WAIT_DECODE, DECODE_QUEUE)
                dispatch()
                ctrl.on_slot_freed(snap, g)
                dispatch()
            else:
                g = snap.decode_finished(r)
                done += 1
                ctrl.on_decode_done(snap, r, g)
                dispatch()
                ctrl.on_slot_freed(snap, g)
                dispatch()
    except ActionError as e:
        raise ControllerCheckError(f"snapshot: an impossible decision in the real-router interface: {e}") from None
    except (AttributeError, NotImplementedError) as e:
        raise ControllerCheckError(
            f"snapshot: the controller used something the real-router interface (ClusterSnapshot) lacks: "
            f"{type(e).__name__}: {e}") from None
    return done


def check_controller(policy: Any, scenario: Scenario | None = None, *, seed: int = 0, horizon: float = 15.0,
                     snapshot: bool = True, **options: Any) -> CheckReport:
    """Run ``policy`` through the checks above; raise :class:`ControllerCheckError` on the first failure.

    ``policy``: a Controller object or class, a factory ``f(scenario) -> Controller``, or a registered
    name (``options`` go to the class, factory or registry). ``scenario``: the fleet to check on
    (default :func:`check_scenario`, 4 GPUs, two classes); the tokens run adds a KV-cache limit of
    ``4 x batch x mean prompt`` tokens per GPU if the scenario has none. ``horizon``: simulated
    seconds per run. ``snapshot=False`` skips the real-router check (for controllers that need the
    engine's KV or generated-token state, which the snapshot does not track).
    """
    sc = check_scenario() if scenario is None else scenario
    label, make = _builder(policy, options)
    passed: list[str] = ["protocol"]
    _build(make, sc)
    runs: dict[str, dict[str, Any]] = {}
    kv = sc.gpu.kv_capacity
    if kv is None:
        mean_prompt = sum(c.prompt for c in sc.classes) / len(sc.classes)
        kv = float(math.ceil(4 * sc.gpu.batch * mean_prompt))
    sc_tokens = replace(sc, gpu=replace(sc.gpu, kv_capacity=kv))
    # the markov service has no KV-cache model: check it on the same fleet without one
    sc_markov = replace(sc, gpu=replace(sc.gpu, kv_capacity=None, kv_time_per_token=0.0))
    for service, s in (("markov", sc_markov), ("tokens", sc_tokens)):
        res = _run(make, s, service, seed, horizon)
        t = res.totals
        passed.append(f"invariants ({service})")
        lhs = t["requests"]
        rhs = t["completed"] + t["abandoned"] + t["dropped"] + t["in_system"]
        if lhs != rhs:
            raise ControllerCheckError(
                f"conservation ({service} service): {lhs} arrivals but {t['completed']} completed + {t['abandoned']} "
                f"abandoned + {t['dropped']} dropped + {t['in_system']} in system = {rhs}")
        passed.append(f"conservation ({service})")
        if t["requests"] > 0 and t["completed"] == 0:
            raise ControllerCheckError(
                f"liveness ({service} service): {t['requests']} requests arrived in {horizon:g} s and none completed")
        passed.append(f"liveness ({service})")
        again = _run(make, s, service, seed, horizon)
        a, b = dict(res.summary()), dict(again.summary())
        for d in (a, b):
            for k in ("wall_seconds", "requests_per_wall_second"):
                d.pop(k, None)
        if a != b:
            diff = sorted(k for k in a if a.get(k) != b.get(k))
            raise ControllerCheckError(
                f"determinism ({service} service): two runs with seed {seed} differ in {', '.join(diff[:5])}; draw "
                f"randomness only from ctx.rng")
        passed.append(f"determinism ({service})")
        runs[service] = {"requests": t["requests"], "completed": t["completed"], "abandoned": t["abandoned"]}
    if snapshot:
        done = _snapshot_drive(make, sc, seed)
        if done < 60:
            raise ControllerCheckError(f"snapshot: driven through a ClusterSnapshot, {done} of 60 requests completed "
                                       f"(none abandon there; the rest were never served)")
        passed.append("snapshot")
        runs["snapshot"] = {"completed": done}
    return CheckReport(label, tuple(passed), runs)
