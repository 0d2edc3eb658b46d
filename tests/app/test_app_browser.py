"""The what-if app in a real browser: Playwright for Python driving the system's headless Chromium.

The app runs as ``fluidopt app`` in a subprocess on a free port; each test opens the page, moves inputs
and checks the numbers shown against the library's for the same inputs (not only that elements exist).
Skips where Playwright or a Chromium is missing, unless ``FLUIDOPT_REQUIRE=browser``. With
``FLUIDOPT_APP_SCREENSHOTS=DIR`` the tests also save the screenshots docs/app.md shows.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fluidopt
from fluidopt.app import free_port
from fluidopt.app.page import fmt
from fluidopt.core.errors import ScenarioError
from fluidopt.fluid.lp import solve_fluid
from fluidopt.scenario import loads_scenario

pytestmark = [pytest.mark.integration, pytest.mark.waits]  # the app's server and a browser, in real time
try:
    import playwright.sync_api as playwright_api
except ImportError:  # skipped per test below (so FLUIDOPT_REQUIRE=browser can turn the skip into a failure)
    playwright_api = None

REPO = Path(__file__).resolve().parents[2]
CHROME_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
SHOTS = os.environ.get("FLUIDOPT_APP_SCREENSHOTS")


def _chromium() -> str | None:
    for c in (os.environ.get("FLUIDOPT_CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser"),
              "/usr/bin/chromium"):
        if c and Path(c).is_file():
            return c
    return None


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    try:
        import nicegui  # noqa: F401
    except ImportError:
        pytest.skip("browser not available: the app extra (nicegui) is not installed")
    port = free_port()
    log = tmp_path_factory.mktemp("app") / "app.log"
    # (NiceGUI takes PYTEST_CURRENT_TEST as a sign that it runs under its own test harness)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    proc = subprocess.Popen([sys.executable, "-m", "fluidopt", "app", "--port", str(port), "--workers", "1"], cwd=REPO,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 90:
        if proc.poll() is not None:
            pytest.fail(f"fluidopt app exited: {log.read_text()}")
        if url in log.read_text():
            break
        time.sleep(0.1)
    yield url
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def browser():
    if playwright_api is None:
        pytest.skip("browser not available: playwright is not installed (pip install -e '.[dev]')")
    exe = _chromium()
    if exe is None:
        pytest.skip("browser not available: no chromium on this machine (apt install chromium)")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=CHROME_FLAGS)
        yield b
        b.close()
    # Playwright's driver (a Node process) exits after the context manager returns, and asyncio's thread
    # that waits for it ends only then: join it, so that the next test on this worker finds the process as
    # the module found it (test_faults.py's in-process runs check that no thread came or went)
    for t in threading.enumerate():
        if t.name.startswith("asyncio-waitpid"):
            t.join(10)


@pytest.fixture
def page(browser, app_url):
    ctx = browser.new_context(viewport={"width": 1400, "height": 950}, accept_downloads=True)
    pg = ctx.new_page()
    pg.set_default_timeout(20_000)
    pg.goto(app_url)
    pg.get_by_test_id("rstar-bundled").wait_for()
    yield pg
    ctx.close()


def _text(page, testid: str) -> str:
    return page.get_by_test_id(testid).inner_text().strip()


def _shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"app-{name}.png"), full_page=True)


def _tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def _fill(page, testid: str, value: str) -> None:
    f = page.get_by_test_id(testid)
    f.fill(value)
    f.press("Tab")


def test_first_paint_is_the_librarys_operating_point(page):
    sc = fluidopt.default_scenario()
    for pricing in ("bundled", "separate"):
        sol = solve_fluid(sc, pricing=pricing)
        assert _text(page, f"rstar-{pricing}") == fmt(sol.objective_per_gpu)
        assert _text(page, f"mixed-{pricing}") == str(sol.mixed_gpus)
        assert _text(page, f"solo-{pricing}") == str(sol.solo_gpus)
        assert _text(page, f"occupancy-{pricing}") == fmt(sol.prefill_occupancy)
    assert _text(page, "header-rstar") == fmt(solve_fluid(sc, pricing="bundled").objective_per_gpu) == "297.7032"
    # the binding rows and their shadow prices, as the library reports them
    duals = page.get_by_test_id("op-duals").inner_text()
    sol = solve_fluid(sc, pricing="bundled")
    assert f"{sol.duals['mixed_decode_capacity']:.4f}" in duals and "prefill_balance[long-prompt]" in duals
    _shot(page, "operating-point")


def test_moving_a_rate_updates_the_operating_point(page):
    _tab(page, "Scenario")
    before = _text(page, "header-rstar")
    t0 = time.perf_counter()
    _fill(page, "field-class0-rate", "100")  # (above 250 the short class is rationed: R* stays put)
    page.wait_for_function("(v) => document.querySelector('[data-testid=header-rstar]').innerText.trim() !== v", arg=before)
    took = time.perf_counter() - t0
    edited = fluidopt.default_scenario()
    from dataclasses import replace

    edited = replace(edited, classes=(replace(edited.classes[0], rate=100.0), edited.classes[1]))
    want = solve_fluid(edited, pricing="bundled")
    assert _text(page, "header-rstar") == fmt(want.objective_per_gpu)
    _tab(page, "Operating point")
    assert _text(page, "rstar-separate") == fmt(solve_fluid(edited, pricing="separate").objective_per_gpu)
    assert _text(page, "mixed-bundled") == str(want.mixed_gpus)
    print(f"input change -> operating point shown: {took * 1000:.0f} ms")


@pytest.mark.parametrize("testid, value, path", [
    ("field-class0-rate", "-1", ("classes", 0, "rate")),
    ("field-class1-name", "", ("classes", 1, "name")),
    ("field-gpus", "0", ("cluster", "gpus")),
])
def test_bad_input_shows_the_loaders_message_beside_the_field(page, testid, value, path):
    from fluidopt.app import logic
    from fluidopt.scenario import default_scenario, scenario_to_dict

    _tab(page, "Scenario")
    before = _text(page, "header-rstar")
    _fill(page, testid, value)
    kind = str if path[-1] == "name" else (int if path[-1] == "gpus" else float)
    data = scenario_to_dict(default_scenario())
    # the loader's own message for the same value (what fluidopt solve says of a TOML file with it)
    want = logic.field_error(data, path, kind(value)) if value != "" else None
    messages = page.get_by_test_id(testid).locator("xpath=ancestor::label[1]").locator("[role=alert]")
    if want is not None:
        playwright_api.expect(messages).to_have_text(want)  # (the server validates: a round trip)
        with pytest.raises(ScenarioError, match=re.escape(want.split(": ", 1)[1])):
            logic.build(logic.set_field(data, path, kind(value)))
    else:  # an empty field: "expected a value"
        playwright_api.expect(messages).to_have_text("expected a value")
    assert _text(page, "header-rstar") == before  # the last valid scenario stays in force
    if testid == "field-class0-rate":
        _shot(page, "bad-input")


def test_a_bad_toml_upload_says_what_the_cli_says(page, tmp_path, cli_here):
    bad = tmp_path / "bad.toml"
    good = (REPO / "examples" / "scenarios" / "paper-two-class.toml").read_text()
    bad.write_text("colour = 'red'\n" + good)
    cli = cli_here("solve", str(bad))  # (in this process: the subject is the message, not the process)
    assert cli.returncode == 2
    cli_msg = cli.stderr.strip().split("error: ", 1)[1]
    _tab(page, "Scenario")
    page.get_by_test_id("upload").locator("input[type=file]").set_input_files(str(bad))
    page.wait_for_function("() => document.querySelector('[data-testid=upload-error]').innerText.length > 0")
    shown = _text(page, "upload-error")
    assert shown == f"bad.toml: {cli_msg}" or cli_msg in shown
    assert "unknown key 'colour'" in shown


def test_download_gives_the_edited_scenario(page):
    _tab(page, "Scenario")
    _fill(page, "field-gpus", "200")
    page.wait_for_function("() => document.querySelector('[data-testid=header-rstar]').innerText.length > 0")
    with page.expect_download() as d:
        page.get_by_test_id("download").click()
    text = Path(d.value.path()).read_text()
    sc = loads_scenario(text)
    assert sc.gpus == 200 and sc == fluidopt.default_scenario().with_gpus(200).__class__(**{**sc.__dict__})
    assert [c.rate for c in sc.classes] == [250.0, 250.0]


def test_capacity_shows_the_fluid_bound_against_growth(page):
    from fluidopt.app import logic

    _tab(page, "Capacity")
    page.get_by_test_id("cap-table").wait_for()
    want = logic.capacity(fluidopt.default_scenario(), [1.0, 1.5, 2.0], 0.99)
    table = page.get_by_test_id("cap-table").inner_text()
    for v in want["n_fluid"]:
        assert fmt(v) in table
    _shot(page, "capacity")


def test_pricing_curve_matches_the_library(page):
    import numpy as np

    from fluidopt.app import logic

    _tab(page, "Pricing")
    page.get_by_test_id("pr-table").wait_for()
    want = logic.price_curve(fluidopt.default_scenario(), "decode", np.linspace(0.0, 0.6, 13))
    table = page.get_by_test_id("pr-table").inner_text()
    for v in want["revenue_per_gpu"]:
        assert fmt(v) in table
    _shot(page, "pricing")


def _set_select(page, testid: str, names: list[str]) -> None:
    sel = page.get_by_test_id(testid)
    # clear the chips, then pick each name from the menu
    for chip in sel.locator(".q-chip__icon--remove").all()[::-1]:
        chip.click()
    for n in names:
        sel.click()
        page.get_by_role("option", name=n, exact=True).click()
    page.keyboard.press("Escape")


def test_run_a_comparison_and_its_numbers_are_the_harness(page):
    from fluidopt.harness import compare

    _tab(page, "Scenario")
    _fill(page, "field-gpus", "20")
    _tab(page, "Controllers")
    _fill(page, "ct-horizon", "120")
    _fill(page, "ct-warmup", "20")
    _fill(page, "ct-seeds", "1")
    page.get_by_test_id("run-compare").click()
    page.get_by_test_id("ct-table").wait_for(timeout=120_000)
    assert "done" in _text(page, "status-compare")
    from dataclasses import replace

    # the page edits the file: 20 GPUs, the same cluster arrival rates (an overloaded fleet)
    comp = compare(replace(fluidopt.default_scenario(), gpus=20), ["gate-and-route", "fi-wsp"], seeds=[0],
                   horizon=120.0, warmup=20.0, workers=1)
    table = page.get_by_test_id("ct-table").inner_text()
    for r in comp.summary().itertuples():
        assert fmt(r.ratio) in table and fmt(r.revenue) in table
    _shot(page, "controllers")


def test_cancel_a_long_comparison(page):
    _tab(page, "Controllers")
    _fill(page, "ct-horizon", "20000")
    page.get_by_test_id("run-compare").click()
    page.get_by_test_id("cancel-compare").wait_for(state="visible")
    time.sleep(1.0)
    page.get_by_test_id("cancel-compare").click()
    page.wait_for_function(
        "() => document.querySelector('[data-testid=status-compare]').innerText.includes('cancelled')", timeout=10_000)
    assert "cancelled" in _text(page, "status-compare")
    # the page still answers: the operating point is there
    _tab(page, "Operating point")
    assert _text(page, "rstar-bundled") == fmt(solve_fluid(fluidopt.default_scenario(), pricing="bundled").objective_per_gpu)


def test_optimal_prices_of_an_uploaded_demand_scenario_match_the_library(page):
    from fluidopt.pricing import optimize_prices

    path = REPO / "examples" / "scenarios" / "paper-two-class-demand.toml"
    _tab(page, "Pricing")
    assert "no class has a demand model" in _text(page, "pr-opt-note")  # the default scenario: fixed rates
    _tab(page, "Scenario")
    page.get_by_test_id("upload").locator("input[type=file]").set_input_files(str(path))
    page.wait_for_function("() => document.querySelector('[data-testid=scenario-name]') !== null")
    _tab(page, "Pricing")
    # the page's program (about 3 CPU-s, more with the page's own work) can outlast the 20 s default on a loaded 2-core machine
    page.get_by_test_id("pr-opt-table").wait_for(timeout=120_000)
    res = optimize_prices(fluidopt.load_scenario(path))
    assert _text(page, "pr-opt-revenue") == fmt(res.revenue_per_gpu)
    table = page.get_by_test_id("pr-opt-table").inner_text()
    for p in res.to_frame()["price"]:
        assert fmt(p) in table
    _shot(page, "optimal-prices")
