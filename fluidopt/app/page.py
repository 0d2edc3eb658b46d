"""The what-if page (NiceGUI): five tabs over one edited scenario.

The page holds the edited scenario per browser tab and says so in its header (a reload restores the
loaded file; "Download TOML" keeps the edits). Every number comes from :mod:`fluidopt.app.logic`;
every element a test reads carries a ``data-testid``.
"""

from __future__ import annotations

import math
from typing import Any

import fluidopt.app.logic as L
from fluidopt.core.errors import FluidoptError

CLASS_FIELDS = (("name", "name", str), ("rate", "rate (1/s, cluster)", float), ("prompt", "prompt tokens", float),
                ("decode", "output tokens", float), ("patience", "patience (1/s)", float))


def fmt(v: Any, digits: int = 4) -> str:
    """How the page prints a number (the browser tests format the library's value the same way)."""
    if isinstance(v, (int,)) and not isinstance(v, bool):
        return str(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return "-" if not math.isfinite(f) else f"{f:.{digits}f}"


def tid(element, name: str):
    element.props(f'data-testid="{name}"')
    return element


class State:
    """One browser tab's scenario: the TOML-shaped dict being edited and the last valid scenario."""

    def __init__(self, data: dict) -> None:
        self.data = data
        self.scenario = L.build(data)
        self.listeners: list = []
        self._op: tuple | None = None

    def op(self):
        """The operating point of the current scenario, solved once per change (the header and the tab share it)."""
        if self._op is None or self._op[0] is not self.scenario:
            self._op = (self.scenario, L.operating_point(self.scenario))
        return self._op[1]

    def set(self, path: tuple, value: Any) -> str | None:
        err = L.field_error(self.data, path, value)
        if err is None:
            self.data = L.set_field(self.data, path, value)
            self.scenario = L.build(self.data)
            self.changed()
        return err

    def replace(self, data: dict) -> None:
        self.data = data
        self.scenario = L.build(data)
        self.changed()

    def changed(self) -> None:
        for f in self.listeners:
            f()


def build_page(initial: dict, *, workers: int = 2) -> None:
    """Build the page for one client (NiceGUI root function)."""
    from nicegui import ui

    state = State(initial)
    ui.page_title(f"fluidopt what-if: {state.scenario.name}")
    with ui.header().classes("items-center"):
        ui.label("fluidopt what-if").classes("text-lg font-bold")
        tid(ui.label(state.scenario.name), "scenario-name")
        ui.label("R* (bundled) per GPU per s:").classes("ml-8")
        head = tid(ui.label(""), "header-rstar").classes("font-bold")
        ui.space()
        ui.label("Edits live in this browser tab only: a reload restores the loaded scenario. "
                 "Download the TOML to keep them.").classes("text-xs")
    with ui.tabs() as tabs:
        t_sc = ui.tab("Scenario")
        t_op = ui.tab("Operating point")
        t_cap = ui.tab("Capacity")
        t_pr = ui.tab("Pricing")
        t_ct = ui.tab("Controllers")
    def headline() -> None:
        try:
            head.text = fmt(state.op().headline.set_index("pricing").loc["bundled", "revenue_per_gpu"])
        except FluidoptError as e:
            head.text = f"- ({e})"

    state.listeners.append(headline)
    headline()
    # The operating point paints first; the other tabs are built when first opened (a fast first paint).
    builders = {"Scenario": lambda: _scenario_panel(state), "Operating point": lambda: _operating_panel(state),
                "Capacity": lambda: _capacity_panel(state, workers), "Pricing": lambda: _pricing_panel(state),
                "Controllers": lambda: _controllers_panel(state, workers)}
    panels = {}
    with ui.tab_panels(tabs, value=t_op).classes("w-full"):
        for t in (t_sc, t_op, t_cap, t_pr, t_ct):
            panels[t._props["name"]] = ui.tab_panel(t)

    def open_tab(name: str) -> None:
        panel = panels[name]
        if not getattr(panel, "_built", False):
            panel._built = True
            with panel:
                builders[name]()

    open_tab("Operating point")
    tabs.on_value_change(lambda e: open_tab(e.value if isinstance(e.value, str) else e.value._props["name"]))


# -- Scenario ------------------------------------------------------------------------------------------
def _field(state: State, path: tuple, label: str, kind: type, value: Any, testid: str):
    from nicegui import ui

    def validate(v):
        if v is None or v == "":
            return "expected a value"
        try:
            return L.field_error(state.data, path, kind(v))
        except (TypeError, ValueError):
            return f"expected a {kind.__name__}"

    def on_change(e):
        if validate(e.value) is None:
            state.set(path, kind(e.value))

    if kind is str:
        el = ui.input(label, value=value, validation=validate, on_change=on_change)
    else:
        el = ui.number(label, value=value, validation=validate, on_change=on_change)
    el.props("lazy-rules=false").classes("w-40")
    return tid(el, testid)


def _scenario_panel(state: State) -> None:
    from nicegui import ui

    box = ui.column()

    def render() -> None:
        box.clear()
        d = state.data
        with box:
            with ui.row().classes("items-end"):
                _field(state, ("cluster", "gpus"), "GPUs", int, d["cluster"]["gpus"], "field-gpus")
                _field(state, ("pricing", "prefill"), "prefill price per token", float, d["pricing"]["prefill"],
                       "field-prefill-price")
                _field(state, ("pricing", "decode"), "decode price per token", float, d["pricing"]["decode"],
                       "field-decode-price")
                gpu = d["gpu"] if isinstance(d["gpu"], dict) else {}
                if isinstance(d["gpu"], dict):
                    _field(state, ("gpu", "price_per_hour"), "GPU price per hour", float,
                           gpu.get("price_per_hour"), "field-gpu-price")
            ui.label("Classes").classes("font-bold")
            for i, c in enumerate(d["classes"]):
                with ui.row().classes("items-end"):
                    for key, label, kind in CLASS_FIELDS:
                        _field(state, ("classes", i, key), label, kind, c.get(key), f"field-class{i}-{key}")
            g = state.scenario.gpu
            ui.label(f"GPU {g.name or '(scenario)'}: tau = {g.alpha:g} + {g.beta:g} C s per iteration, "
                     f"chunk {g.chunk}, batch {g.batch}; SLIs: {', '.join(state.scenario.meta.get('slis', ())) or 'none'}")

    render()
    with ui.row().classes("items-center"):
        upload_error = tid(ui.label("").classes("text-negative"), "upload-error")

        async def on_upload(e) -> None:
            try:
                raw = await e.file.read()
                text = raw.decode("utf-8-sig")
                _, data = L.from_toml(text, source=e.file.name)
            except FluidoptError as err:
                upload_error.text = f"{e.file.name}: {err}"
                return
            except UnicodeDecodeError:
                upload_error.text = f"{e.file.name}: not a UTF-8 text file"
                return
            upload_error.text = ""
            state.replace(data)
            render()

        tid(ui.upload(label="Load a scenario TOML", auto_upload=True, on_upload=on_upload).props("accept=.toml"),
            "upload")
        tid(ui.button("Download TOML",
                      on_click=lambda: ui.download.content(L.to_toml(state.data), f"{state.scenario.name}.toml")),
            "download")


# -- Operating point ---------------------------------------------------------------------------------------
def _operating_panel(state: State) -> None:
    from nicegui import ui

    box = ui.column().classes("w-full")

    def render() -> None:
        box.clear()
        with box:
            try:
                op = state.op()
            except FluidoptError as e:
                tid(ui.label(str(e)).classes("text-negative"), "op-error")
                return
            with ui.row():
                for _, h in op.headline.iterrows():
                    p = h["pricing"]
                    with ui.card():
                        ui.label(f"{p} pricing").classes("font-bold")
                        with ui.row():
                            ui.label("R* per GPU per s:")
                            tid(ui.label(fmt(h["revenue_per_gpu"])), f"rstar-{p}")
                        with ui.row():
                            ui.label("mixed GPUs M:")
                            tid(ui.label(str(int(h["mixed_gpus"]))), f"mixed-{p}")
                            ui.label("solo:")
                            tid(ui.label(str(int(h["solo_gpus"]))), f"solo-{p}")
                        with ui.row():
                            ui.label("prefill occupancy sum x*:")
                            tid(ui.label(fmt(h["prefill_occupancy"])), f"occupancy-{p}")
            ui.label("Per class (rates and occupancies per GPU)").classes("font-bold")
            _table(op.classes, "op-classes")
            ui.label("Binding rows and shadow prices (revenue per GPU per s per unit of the row)").classes("font-bold")
            _table(op.duals, "op-duals")
            tid(ui.label(f"solved in {op.seconds * 1000:.0f} ms"), "op-seconds").classes("text-xs")

    state.listeners.append(render)
    render()


def _table(df, testid: str):
    from nicegui import ui

    cols = [{"name": c, "label": c, "field": c, "align": "left"} for c in df.columns]
    rows = [{c: (fmt(v) if isinstance(v, float) else v) for c, v in r.items()} for r in df.to_dict(orient="records")]
    return tid(ui.table(columns=cols, rows=rows).props("dense flat"), testid)


# -- background job display ------------------------------------------------------------------------------------
def _job_view(start_job, on_done, name: str) -> None:
    """A run button, a progress bar with a cancel button, and the job's message."""
    from nicegui import ui

    holder: dict = {"job": None}
    with ui.row().classes("items-center"):
        run_btn = tid(ui.button(f"Run {name}"), f"run-{name}")
        cancel_btn = tid(ui.button("Cancel").props("color=negative"), f"cancel-{name}")
        cancel_btn.set_visibility(False)
        bar = tid(ui.linear_progress(value=0, show_value=False).classes("w-64"), f"progress-{name}")
        status = tid(ui.label(""), f"status-{name}")

    def tick() -> None:
        job = holder["job"]
        if job is None:
            return
        bar.value = job.done / job.total if job.total else 0.0
        status.text = job.message or f"{job.done} of {job.total or '?'} runs, {job.elapsed:.0f} s"
        if job.finished:
            if job.status == "done":
                bar.value = 1.0
            timer.active = False
            run_btn.enable()
            cancel_btn.set_visibility(False)
            if job.status == "done":
                on_done(job.result)

    timer = ui.timer(0.2, tick, active=False)

    def run() -> None:
        try:
            holder["job"] = start_job()
        except FluidoptError as e:
            status.text = str(e)
            return
        run_btn.disable()
        cancel_btn.set_visibility(True)
        status.text = "starting..."
        timer.active = True

    run_btn.on_click(run)
    cancel_btn.on_click(lambda: holder["job"] and holder["job"].cancel())


# -- Capacity --------------------------------------------------------------------------------------------------
def _capacity_panel(state: State, workers: int) -> None:
    from nicegui import ui

    from fluidopt.calibration.profiles import profile_names

    ui.label("Fleet size against demand growth: the fluid bound at once; a simulation-verified size on request")
    with ui.row().classes("items-end"):
        growth = tid(ui.input("demand growth factors", value="1, 1.5, 2"), "cap-growth")
        served = tid(ui.number("served fraction", value=0.99, min=0.01, max=1.0, step=0.01), "cap-served")
        profs = tid(ui.select(list(profile_names()), multiple=True, label="GPU types (named profiles)", value=[])
                    .classes("w-96"), "cap-profiles")
    box = ui.column().classes("w-full")
    err = tid(ui.label("").classes("text-negative"), "cap-error")

    def factors() -> list[float]:
        out = []
        for t in str(growth.value).split(","):
            if t.strip():
                v = float(t)
                if not (math.isfinite(v) and v > 0):
                    raise ValueError(t)
                out.append(v)
        if not out:
            raise ValueError("none")
        return out

    def render() -> None:
        box.clear()
        err.text = ""
        try:
            tab = L.capacity(state.scenario, factors(), float(served.value or 0.99), profs.value or None)
        except ValueError:
            err.text = f"demand growth factors: expected comma-separated numbers > 0, got {growth.value!r}"
            return
        except FluidoptError as e:
            err.text = str(e)
            return
        with box:
            _table(tab, "cap-table")

    for w in (growth, served, profs):
        w.on_value_change(lambda _: render())
    state.listeners.append(render)
    render()

    ui.label("Simulation-verified fleet at growth x1 (gate-and-route, 2 seeds, local process pool)").classes("font-bold")
    verified = ui.column()

    def done(res) -> None:
        verified.clear()
        with verified:
            _table(res.table[["profile", "n_fluid", "n_fluid_int", "n_sim", "correction"]], "cap-verified")

    _job_view(lambda: L.verify_job(state.scenario, served=float(served.value or 0.99), workers=workers), done,
              "verify")


# -- Pricing ----------------------------------------------------------------------------------------------------
def _pricing_panel(state: State) -> None:
    from nicegui import ui

    with ui.row().classes("items-end"):
        which = tid(ui.select(["decode", "prefill"], value="decode", label="price moved"), "pr-which")
        lo = tid(ui.number("from", value=0.0), "pr-lo")
        hi = tid(ui.number("to", value=0.6), "pr-hi")
        n = tid(ui.number("points", value=13, min=2, max=200, step=1), "pr-points")
    err = tid(ui.label("").classes("text-negative"), "pr-error")
    box = ui.column().classes("w-full")
    ui.label("Optimal prices under the fleet's capacity (needs [classes.demand] in the scenario)").classes("font-bold")
    opt = ui.column().classes("w-full")

    def render_optimum() -> None:
        opt.clear()
        with opt:
            try:
                res = L.optimal_prices(state.scenario)
            except FluidoptError as e:
                tid(ui.label(str(e)), "pr-opt-note")
                return
            with ui.row():
                ui.label(f"status {res.status}:")
                tid(ui.label(fmt(res.revenue_per_gpu)), "pr-opt-revenue")
                ui.label("per GPU per s at the optimal prices")
            if res.success:
                _table(res.to_frame(), "pr-opt-table")

    state.listeners.append(render_optimum)
    render_optimum()

    def render() -> None:
        import numpy as np

        box.clear()
        err.text = ""
        try:
            a, b, k = float(lo.value), float(hi.value), int(n.value)
            if not (0 <= a < b and 2 <= k <= 200):
                raise ValueError
        except (TypeError, ValueError):
            err.text = "prices: expected 0 <= from < to and 2..200 points"
            return
        try:
            curve = L.price_curve(state.scenario, which.value, np.linspace(a, b, k))
        except FluidoptError as e:
            err.text = str(e)
            return
        col = f"{which.value}_price"
        served = [c for c in curve.columns if c.startswith("served[")]
        with box:
            with ui.matplotlib(figsize=(8, 3.2)).figure as fig:
                ax1, ax2 = fig.subplots(1, 2)
                ax1.plot(curve[col], curve["revenue_per_gpu"], marker=".")
                ax1.set_xlabel(f"{which.value} price per token")
                ax1.set_ylabel("LP revenue per GPU per s")
                for c in served:
                    ax2.plot(curve[col], curve[c], marker=".", label=c[7:-1])
                ax2.set_xlabel(f"{which.value} price per token")
                ax2.set_ylabel("served fraction")
                ax2.legend(fontsize=7)
                fig.tight_layout()
            _table(curve[[col, "revenue_per_gpu", *served]], "pr-table")

    for w in (which, lo, hi, n):
        w.on_value_change(lambda _: render())
    state.listeners.append(render)
    render()


# -- Controllers ------------------------------------------------------------------------------------------------
def _controllers_panel(state: State, workers: int) -> None:
    from nicegui import ui

    from fluidopt.control.registry import available

    names = sorted(available())
    with ui.row().classes("items-end"):
        pols = tid(ui.select(names, multiple=True, value=["gate-and-route", "fi-wsp"], label="policies")
                   .classes("w-96"), "ct-policies")
        horizon = tid(ui.number("horizon (s)", value=300.0, min=10), "ct-horizon")
        warmup = tid(ui.number("warm-up (s)", value=50.0, min=0), "ct-warmup")
        seeds = tid(ui.number("seeds", value=2, min=1, max=20, step=1), "ct-seeds")
    out = ui.column().classes("w-full")

    def start():
        from fluidopt.core.errors import UsageError

        if not pols.value:
            raise UsageError("policies: pick at least one")
        return L.compare_job(state.scenario, list(pols.value), seeds=int(seeds.value or 1),
                             horizon=float(horizon.value or 300), warmup=float(warmup.value or 0), workers=workers)

    def done(comp) -> None:
        out.clear()
        summ = comp.summary()
        with out:
            _table(summ[["policy", "seeds", "ratio", "revenue", "throughput", "abandoned_fraction", "ttft_mean",
                         "e2e_mean"]], "ct-table")
            ts = comp.timeseries
            if ts is not None and not ts.empty:
                with ui.matplotlib(figsize=(8, 3)).figure as fig:
                    ax = fig.gca()
                    xcols = [c for c in ts.columns if c.startswith("x[")]
                    for (pol, seed), g in ts.groupby(["policy", "seed"]):
                        if seed != ts["seed"].min():
                            continue
                        ax.plot(g["time"], g[xcols].sum(axis=1) / state.scenario.gpus, label=pol)
                    ax.set_xlabel("time (s)")
                    ax.set_ylabel("prefill occupancy per GPU")
                    ax.legend(fontsize=7)
                    fig.tight_layout()

    _job_view(start, done, "compare")
