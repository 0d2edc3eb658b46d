"""``simulate``: run a controller on a scenario and get a :class:`~fluidopt.sim.metrics.SimResult`."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from fluidopt.control.protocol import Controller
from fluidopt.control.registry import make_controller
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario
from fluidopt.sim.backend import engine_class
from fluidopt.sim.metrics import RecordsWriter, SimResult
from fluidopt.sim.window import RunWindow

__all__ = ["RunWindow", "check_run", "make_engine", "simulate"]


def check_run(horizon: object, warmup: object, service: object, *, caller: str = "simulate") -> tuple[float, float]:
    """Validate a run's window (seconds) and service; return (horizon, warmup) as floats
    (:class:`~fluidopt.sim.window.RunWindow` checks them: the one check of a run's window)."""
    w = RunWindow(horizon, warmup, service, caller=caller)  # type: ignore[arg-type]
    return w.horizon, w.warmup


def simulate(
    scenario: Scenario | str | os.PathLike,
    controller: Controller | str,
    *,
    horizon: float | None = None,
    warmup: float = 0.0,
    seed: int = 0,
    service: str = "markov",
    workload=None,
    records: str | os.PathLike | None = None,
    sample_interval: float | None = None,
    progress: bool | None = None,
    batches: int = 20,
    controller_options: dict | None = None,
    check: bool = False,
    backend: str = "auto",
    drain: float | None = None,
    window: RunWindow | None = None,
    prefix_cache: bool | None = None,
) -> SimResult:
    """Simulate ``controller`` on ``scenario`` over ``[0, horizon)`` seconds of simulated time.

    ``controller``: a :class:`~fluidopt.control.protocol.Controller` object or a registered policy
    name (:func:`fluidopt.control.registry.available`), built with ``controller_options``.
    ``service``: ``"markov"`` (the paper's exponential model) or ``"tokens"`` (integer token lengths,
    iteration-level timing). ``workload``: replaces the scenario's own Poisson workload (e.g. a
    trace); its class names must be the scenario's. Metrics exclude ``[0, warmup)``; ``batches``
    equal slices of the rest give the 95% confidence intervals. ``records``: a CSV path for one row
    per request (written to a temporary name, renamed when the run ends). ``sample_interval``: sample
    the state every so many seconds into ``result.timeseries``. ``progress``: a progress line on
    stderr (default: when stderr is a terminal). Ctrl-C stops the run and returns the partial result
    with ``interrupted=True``. ``check``: verify every invariant after every event (slow; tests).
    ``backend``: ``"auto"`` (the compiled engine core when installed, else pure Python),
    ``"compiled"`` or ``"python"`` (:mod:`fluidopt.sim.backend`); both give the same numbers bit for bit,
    and ``result.meta["engine"]`` says which ran. Same ``seed``, same numbers, bit for bit.

    ``drain``: seconds (a cap) the run may go on past the horizon so that the requests that
    *arrived* in the window ``[warmup, horizon)`` (its cohort) resolve; arrivals continue as the
    workload has them. It stops once they all have (or at ``horizon + drain``, then a
    :class:`~fluidopt.sim.cohort.CohortWarning`) and adds the cohort's metrics to
    ``result.cluster`` (:data:`fluidopt.sim.cohort.COHORT_KEYS`): ``cohort_revenue_per_gpu`` (the
    value of the cohort's completed requests per GPU per second of the window, directly comparable
    with R*(window), :func:`fluidopt.fluid.realised.realised_bound`), its batch-means half-width,
    the cohort's counts (arrived = completed + abandoned + dropped + unresolved) and
    ``drain_seconds`` (after the horizon, when its last request resolved); the per-class table is
    ``result.meta["cohort"]``. Every other metric is the window's, the same as without ``drain``
    (``events`` and ``wall_seconds`` count the whole run; the records go on to the drain's end).
    Default None: the run stops at the horizon, as before. See :mod:`fluidopt.sim.cohort`.

    ``prefix_cache``: the per-instance prefix (KV) cache (:mod:`fluidopt.sim.prefix_cache`,
    docs/simulator.md section 1.2). None (default): on when the workload carries block hashes and
    ``service="tokens"``; False: off (every prompt token is prefilled, results as without hashes).
    With it on, ``result.totals`` gains ``prompt_tokens`` and ``cached_prompt_tokens``, the per-class
    table the same and ``hit_ratio``, ``result.meta["prefix_cache"]`` the per-instance table, and the
    records a ``cached_prompt`` column.

    ``window``: a :class:`~fluidopt.sim.window.RunWindow` (checked when it was made) in place of
    ``horizon``, ``warmup``, ``service``, ``sample_interval`` and ``drain``, which are then not given:
    the harness checks each scenario's window once and hands it to every run.
    """
    engine = make_engine(
        scenario, controller, horizon=horizon, warmup=warmup, seed=seed, service=service, workload=workload,
        records=records, sample_interval=sample_interval, progress=progress, batches=batches,
        controller_options=controller_options, check=check, backend=backend, drain=drain, window=window,
        prefix_cache=prefix_cache,
    )
    try:
        return engine.run()
    except BaseException:
        if engine._records is not None:
            engine._records.discard()
        raise


def make_engine(
    scenario: Scenario | str | os.PathLike,
    controller: Controller | str,
    *,
    horizon: float | None = None,
    warmup: float = 0.0,
    seed: int = 0,
    service: str = "markov",
    workload=None,
    records: str | os.PathLike | None = None,
    sample_interval: float | None = None,
    progress: bool | None = None,
    batches: int = 20,
    controller_options: dict | None = None,
    check: bool = False,
    backend: str = "auto",
    drain: float | None = None,
    window: RunWindow | None = None,
    prefix_cache: bool | None = None,
):
    """An engine set up for a run, to drive a piece at a time (the stepping API).

    Same arguments and validation as :func:`simulate`, which is ``make_engine(...).run()``. The
    engine is the controller's context; drive it with ``start()``, ``advance(until)`` (process the
    events before time ``until``, seconds; default the horizon), ``pause()`` (from a handler: return
    from ``advance`` after this event), ``done`` and ``finish()`` (the
    :class:`~fluidopt.sim.metrics.SimResult` up to the time reached). Between two ``advance`` calls a
    driver may read the view and act through the engine's actions at time ``now``.
    ``result.meta["engine"]`` says which engine ran.
    """
    if not isinstance(scenario, Scenario):
        from fluidopt.scenario import load_scenario

        if not isinstance(scenario, (str, os.PathLike)):
            raise ScenarioError(f"simulate: scenario: expected a Scenario or a TOML path, got {type(scenario).__name__}")
        scenario = load_scenario(scenario)
    if window is None:
        window = RunWindow(horizon, warmup, service, sample_interval, drain)  # type: ignore[arg-type]
    elif not isinstance(window, RunWindow):
        raise ScenarioError(f"simulate: window: expected a fluidopt.sim.window.RunWindow, got {type(window).__name__}")
    elif (horizon, warmup, service, sample_interval, drain) != (None, 0.0, "markov", None, None):
        raise ScenarioError("simulate: give either a window or horizon, warmup, service, sample_interval and drain")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ScenarioError(f"simulate: seed: expected an integer >= 0, got {seed!r}")
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 2:
        raise ScenarioError(f"simulate: batches: expected an integer >= 2, got {batches!r}")
    Engine, _ = engine_class(backend)
    ctrl = make_controller(controller, scenario, **(controller_options or {}))
    tick = getattr(ctrl, "tick_interval", None)
    if tick is not None and not (isinstance(tick, (int, float)) and math.isfinite(tick) and tick > 0):
        raise ScenarioError(f"controller {ctrl.name!r}: tick_interval: expected seconds > 0 or None, got {tick!r}")
    if workload is None:
        from fluidopt.workloads.workflow import check_workflow, workload_from_scenario

        workload = workload_from_scenario(scenario)
        if scenario.workflow is not None:
            check_workflow(scenario, window.horizon)  # a batch class that never arrives: a WorkflowWarning
    else:
        names = tuple(getattr(workload, "class_names", ()))
        if names != scenario.class_names:
            raise ScenarioError(
                f"simulate: workload: its classes {list(names)} differ from the scenario's {list(scenario.class_names)}; "
                "build the scenario from the workload's classes (e.g. fluidopt.workloads.traces.classes_from_trace)"
            )
    if progress is None:
        progress = bool(getattr(sys.stderr, "isatty", lambda: False)())
    writer = RecordsWriter(Path(records), scenario.class_names) if records is not None else None
    try:
        engine = Engine(scenario, ctrl, workload, window=window, seed=seed, records=writer, progress=progress,
                        batches=batches, check=check, prefix_cache=prefix_cache)
    except BaseException:
        if writer is not None:
            writer.discard()
        raise
    return engine
