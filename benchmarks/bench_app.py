"""Benchmark the what-if app in a real browser: first paint and the update after an input change.

Not a test. Run from the repository root (needs the app extra, playwright and /usr/bin/chromium):

    python benchmarks/bench_app.py                 # 5 page loads, 20 edits; best and median

Starts ``fluidopt app`` on a free port, then with Playwright:

- first paint: from ``page.goto`` until the operating point's R* is in the page (a fresh browser context
  each time, so nothing is cached in the page);
- update: from setting a class's rate (one ``input`` event, the value typed at once, then the field left
  with Tab) until the header's R* shows the new value, alternating between two rates whose R* differ;
- the server's own LP time for the change (``solved in N ms`` on the Operating point tab).

Prints a markdown table; docs/app.md records the numbers.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    from playwright.sync_api import sync_playwright

    from fluidopt.app import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    proc = subprocess.Popen([sys.executable, "-m", "fluidopt", "app", "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}/"
    while url not in (proc.stdout.readline() or url):
        pass
    paints, updates = [], []
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=os.environ.get("FLUIDOPT_CHROMIUM", "/usr/bin/chromium"),
                                  args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            for _ in range(5):
                ctx = b.new_context()
                page = ctx.new_page()
                t0 = time.perf_counter()
                page.goto(url)
                page.get_by_test_id("rstar-bundled").wait_for()
                paints.append(time.perf_counter() - t0)
                ctx.close()
            page = b.new_page()
            page.goto(url)
            page.get_by_test_id("rstar-bundled").wait_for()
            page.get_by_role("tab", name="Scenario").click()
            field = page.get_by_test_id("field-class0-rate")
            for k in range(20):
                before = page.get_by_test_id("header-rstar").inner_text()
                t0 = time.perf_counter()
                field.fill("100" if k % 2 == 0 else "150")
                field.press("Tab")
                page.wait_for_function(
                    "(v) => document.querySelector('[data-testid=header-rstar]').innerText.trim() !== v",
                    arg=before.strip(), polling=5)
                updates.append(time.perf_counter() - t0)
            page.get_by_role("tab", name="Operating point").click()
            solved = page.get_by_test_id("op-seconds").inner_text()
            b.close()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(10)
    print("| measure | best | median | runs |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| first paint (s) | {min(paints):.2f} | {statistics.median(paints):.2f} | {len(paints)} |")
    print(f"| input change -> new R* shown (ms) | {1000 * min(updates):.0f} | {1000 * statistics.median(updates):.0f} "
          f"| {len(updates)} |")
    print(f"\nserver, last change: {solved}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
