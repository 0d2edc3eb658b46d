"""The interactive what-if app: a local web page over one scenario (``fluidopt app``).

Built on NiceGUI (FastAPI + Vue/Quasar in the browser): the page is Python event handlers, so every
number it shows comes from the library (:mod:`fluidopt.app.logic`), long work runs on a background
thread through the project's executor (a local process pool, cancellable), and the elements are plain
DOM that Playwright drives in the browser tests. See docs/app.md.
"""

from __future__ import annotations

import socket
import sys

from fluidopt.core.model import Scenario

__all__ = ["serve", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve(scenario: Scenario, *, host: str = "127.0.0.1", port: int = 0, workers: int = 2) -> None:
    """Serve the app for ``scenario`` until Ctrl-C; ``port=0`` takes a free port. Prints the URL."""
    from nicegui import app, ui

    from fluidopt.app import logic
    from fluidopt.app.page import build_page
    from fluidopt.scenario import scenario_to_dict

    data = scenario_to_dict(scenario)
    logic.operating_point(logic.build(data))  # warm the LP stack (pyomo, HiGHS) before the first page
    port = port or free_port(host)
    # the URL once the server listens (so a script or a test that waits for it can connect at once)
    app.on_startup(lambda: print(f"fluidopt app: {scenario.name} at http://{host}:{port}/ (Ctrl-C to stop)",
                                 file=sys.stdout, flush=True))
    ui.run(lambda: build_page(data, workers=workers), host=host, port=port, title="fluidopt what-if", reload=False,
           show=False, show_welcome_message=False, uvicorn_logging_level="warning")
