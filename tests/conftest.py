"""Suite-wide settings.

``FLUIDOPT_REQUIRE`` (comma-separated: ``compiled``, ``trace``, ``docs``) turns the skips that a missing
compiled simulator core or a missing shared workload trace (or the Vidur operator profiles in
../shared/data/vidur-profiling, also under ``trace``) would cause into failures, so that a
run which must exercise them (CI: .ci/run sets it) cannot be green by skipping. Without it those
tests skip, as a contributor without a C compiler or without ../shared expects.
"""

from __future__ import annotations

import os

import pytest

# LiteLLM fetches a model-price table from the internet when it is imported, unless told to use the copy
# it ships: the suite reaches no network, and a failed fetch costs seconds of retries per process
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

_REQUIRE = {x.strip() for x in os.environ.get("FLUIDOPT_REQUIRE", "").split(",") if x.strip()}
_UNKNOWN = _REQUIRE - {"compiled", "trace", "docs", "browser"}
if _UNKNOWN:
    raise pytest.UsageError(f"FLUIDOPT_REQUIRE: unknown {sorted(_UNKNOWN)}; expected any of 'compiled', 'trace', 'docs', "
                            "'browser'")

# what a skip's reason says when the compiled core or the shared trace is missing
_MARKERS = {"compiled": ("compiled core", "backend='compiled'"),
            "trace": ("trace not", "Azure trace not found", "Vidur profiling data not found",
                      "shared DistServe data not found"),
            "docs": ("docs extra is not installed",), "browser": ("browser not available",)}


def pytest_runtest_setup(item):
    # A test run on the compiled core (parametrized backend="compiled") skips where the core is not built
    # (no C compiler: the README promises the pure-Python engine there); FLUIDOPT_REQUIRE=compiled makes
    # that skip a failure.
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("backend") == "compiled":
        from fluidopt.sim.backend import compiled_status

        ok, why = compiled_status()
        if not ok:
            pytest.skip(f"compiled core not available: {why}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not rep.skipped or not _REQUIRE:
        return
    reason = str(rep.longrepr[-1]) if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    for need in _REQUIRE:
        if any(m in reason for m in _MARKERS[need]):
            rep.outcome = "failed"
            rep.longrepr = f"FLUIDOPT_REQUIRE={need} but the test was skipped: {reason}"


# -------------------------------------------------------------------------------------------------
# Parallel workers (pytest-xdist: -n auto --dist loadgroup in pyproject.toml)
# -------------------------------------------------------------------------------------------------
# A module- or class-scoped fixture is set up once per worker that runs a test needing it: for the
# expensive ones (an uninterrupted reference sweep, the app's server and browser, a Dask cluster, an
# engine run read by many tests) that doubles the work. The tests that need one are sent together to
# one worker, grouped by module, so each such fixture is built once, as in a serial run; every other
# test is balanced on its own. xdist's own grouping (the xdist_group mark, which it appends to the node
# id) has no effect under pytest 9.2, whose node ids are no longer strings, so the workers write the
# groups they collected to a folder the controller names, and the controller's scheduler reads them.
_GROUPS_DIR = "fluidopt_fixture_groups"


def _fixture_group(item) -> str | None:
    """The module of ``item`` if it uses a module- or class-scoped fixture (directly or through another)."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(d.scope in ("module", "class") for ds in defs.values() for d in ds):
        return item.nodeid.split("::", 1)[0]
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):  # the controller, once per worker it starts
    import tempfile

    if not hasattr(node.config, "_fluidopt_groups"):
        node.config._fluidopt_groups = tempfile.mkdtemp(prefix="fluidopt-xdist-groups-")
    node.workerinput[_GROUPS_DIR] = node.config._fluidopt_groups


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):  # on a worker: before it reports its collection
    where = getattr(config, "workerinput", {}).get(_GROUPS_DIR)
    if where:
        import json
        from pathlib import Path

        groups = {item.nodeid: g for item in items if (g := _fixture_group(item))}
        waits = [item.nodeid for item in items if item.get_closest_marker("waits")]
        part = Path(where, f"{config.workerinput['workerid']}.json")
        part.with_suffix(".tmp").write_text(json.dumps({"groups": groups, "waits": waits}), encoding="utf-8")
        part.with_suffix(".tmp").replace(part)


# The tests marked ``waits`` spend much of their time waiting in real time (servers, a browser, signal drills,
# a Dask cluster): on a worker per CPU they leave a CPU idle while they wait. With -n auto the suite starts
# one worker more than xdist would (one per CPU), the *wait lane*; the scheduler gives it the waiting tests
# first and the other workers everything else first, so the lane's waits overlap the others' computing. Each
# side takes the other's work once its own is done. (LiteLLM's other tests are marked too: one process then
# pays its 5 CPU-s import.)
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    from xdist.plugin import pytest_xdist_auto_num_workers as per_cpu

    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # the user's own count: xdist's hook reads it
    config._fluidopt_wait_lane = True
    return per_cpu(config) + 1


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None  # another --dist: xdist's own scheduler
    import json
    from pathlib import Path

    from xdist.scheduler import LoadGroupScheduling

    class FixtureGroupScheduling(LoadGroupScheduling):
        """loadgroup, with the tests that share a module fixture as one group (read after collection), and
        the tests marked ``waits`` sent first to the wait lane (the last worker) when -n auto started one."""

        _groups: dict[str, str] | None = None

        def _read(self) -> None:  # first called when every worker has reported its collection
            where = getattr(config, "_fluidopt_groups", None)
            self._groups, self._waits, self._wait_scopes = {}, set(), set()
            for part in sorted(Path(where).glob("*.json")) if where else ():
                got = json.loads(part.read_text(encoding="utf-8"))
                self._groups.update(got["groups"])
                self._waits.update(got["waits"])

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._read()
            group = self._groups.get(nodeid)
            scope = f"fixture-group:{group}" if group else super()._split_scope(nodeid)
            if nodeid in self._waits:
                self._wait_scopes.add(scope)
            return scope

        def _lane(self):
            if not getattr(config, "_fluidopt_wait_lane", False) or len(self.nodes) < 2:
                return None
            return max(self.nodes, key=lambda n: int(n.gateway.id.lstrip("gw")))

        def _assign_work_unit(self, node) -> None:
            # the base class pops the queue's first unit: put this node's kind of unit first, if any is left
            want = node is self._lane()
            scope = next((s for s in self.workqueue if (s in self._wait_scopes) == want), None)
            if scope is not None:
                self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return FixtureGroupScheduling(config, log)


def pytest_unconfigure(config):
    where = getattr(config, "_fluidopt_groups", None)
    if where:
        import shutil

        shutil.rmtree(where, ignore_errors=True)


# =================================================================================================
# Shared builders as factory fixtures (the functions live in tests/builders.py)
# =================================================================================================
from builders import ROOT, hand_scenario, replay_trace, run_cli, run_cli_here  # noqa: E402


@pytest.fixture
def make_scenario():
    return hand_scenario


@pytest.fixture
def replay():
    return replay_trace


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def cli_here(capfd):
    """``cli_here("run", ...)``: the command in this process, with run_cli's result (builders.run_cli_here)."""
    return lambda *argv, cwd=ROOT: run_cli_here(capfd, *argv, cwd=cwd)


@pytest.fixture(scope="session")
def paper():
    """The built-in paper two-class instance on 500 GPUs."""
    import fluidopt

    return fluidopt.default_scenario()


@pytest.fixture(scope="session")
def bundled(paper):
    """The paper instance's bundled LP solution (R* = 297.70 per GPU per s)."""
    from fluidopt.fluid.lp import solve_fluid

    return solve_fluid(paper, "bundled")
