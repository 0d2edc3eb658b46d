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

_REQUIRE = {x.strip() for x in os.environ.get("FLUIDOPT_REQUIRE", "").split(",") if x.strip()}
_UNKNOWN = _REQUIRE - {"compiled", "trace", "docs", "browser"}
if _UNKNOWN:
    raise pytest.UsageError(f"FLUIDOPT_REQUIRE: unknown {sorted(_UNKNOWN)}; expected any of 'compiled', 'trace', 'docs', "
                            "'browser'")

# what a skip's reason says when the compiled core or the shared trace is missing
_MARKERS = {"compiled": ("compiled core", "backend='compiled'"),
            "trace": ("trace not", "Azure trace not found", "Vidur profiling data not found"),
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



@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the mark into the node id's @group
def pytest_collection_modifyitems(config, items):
    # The suite runs on parallel workers (pytest-xdist, --dist loadgroup in pyproject.toml). A module- or
    # class-scoped fixture is set up once per worker that runs a test needing it: for the expensive ones
    # (an uninterrupted reference sweep, the app's server and browser, a Dask cluster, an engine run read
    # by many tests) that would double the work. Such tests are grouped by module so that one worker runs
    # them all and the fixture is built once, as in a serial run; the other tests balance freely.
    for item in items:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        if any(d.scope in ("module", "class") for ds in defs.values() for d in ds):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))

# =================================================================================================
# Shared builders as factory fixtures (the functions live in tests/builders.py)
# =================================================================================================
from builders import hand_scenario, replay_trace, run_cli  # noqa: E402


@pytest.fixture
def make_scenario():
    return hand_scenario


@pytest.fixture
def replay():
    return replay_trace


@pytest.fixture
def cli():
    return run_cli


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
