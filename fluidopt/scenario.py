"""Load and validate scenarios from TOML files or plain dicts.

The TOML shape (docs/scenarios.md)::

    name = "paper-two-class"
    [gpu]            # or: gpu = "qwen-8b-a100", a named profile from calibration/
    alpha = 0.0174   # s
    beta = 6.2e-5    # s per prefill token
    tau_solo = 0.022 # s (or gamma = 45.45 tokens/s, not both)
    chunk = 256
    batch = 16
    [cluster]
    gpus = 500
    [pricing]
    prefill = 0.1
    decode = 0.2
    [[classes]]
    name = "code"
    prompt = 300
    decode = 1000
    rate = 250.0     # per second, whole cluster
    patience = 0.1   # 1/s

Validation is strict: unknown keys, missing fields and wrong types raise :class:`ScenarioError`
naming the field, the value and what was expected.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fluidopt.core.errors import ScenarioError
from fluidopt.core.files import read_text_file
from fluidopt.core.model import RequestClass, Scenario, paper_scenario
from fluidopt.core.tables import (
    _expect_table,
    _integer,
    _number,
    _reject_unknown,
    _require,
    gpu_from_dict,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_TOP_KEYS = {"name", "gpu", "cluster", "pricing", "classes", "description", "slis"}
# Keys added for the simulator's orchestration features; accepted, but kept out of the lists that
# the unknown-key errors print (those lists are part of the documented error texts).
_TOP_EXTRA = {"fleet", "arrivals", "backlogs", "workflow", "layout", "pools"}
# the [pools] table (issue 44): the keys of fluidopt.core.model.Layout but its kind (named as the flags)
_POOL_KEYS = ("profile", "model", "prefill_tp", "decode_tp", "prefill_instances", "decode_instances", "tp",
              "link_gbps", "link_latency_ms", "prefill_max_tokens", "prefill_overhead_ms", "decode_request_ms",
              "colocated_profile", "colocated_request_ms", "lengths")
_CLASS_EXTRA = {"ttft_slo", "itl_slo", "deadline", "deadline_at", "demand"}
_CLUSTER_KEYS = {"gpus"}
_PRICING_KEYS = {"prefill", "decode"}
_CLASS_REQUIRED = ("name", "prompt", "decode", "rate")
_CLASS_OPTIONAL = {
    "patience", "prefill_price", "decode_price", "lengths", "prompt_sigma", "decode_sigma", "hit_ratio",
}

DEFAULT_SCENARIO_NAME = "paper-two-class"


def class_from_dict(table: Mapping[str, Any], index: int) -> RequestClass:
    where = f"classes[{index}]"
    table = _expect_table(where, table)
    _reject_unknown(where, {k: v for k, v in table.items() if k not in _CLASS_EXTRA},
                    set(_CLASS_REQUIRED) | _CLASS_OPTIONAL)
    _require(where, table, _CLASS_REQUIRED)
    name = table["name"]
    if not isinstance(name, str) or not name:
        raise ScenarioError(f"{where}.name: expected a non-empty string, got {name!r}")
    kw: dict[str, Any] = {"name": name}
    for k in ("prompt", "decode", "rate", "patience", "prefill_price", "decode_price", "prompt_sigma", "decode_sigma",
              "ttft_slo", "itl_slo", "deadline", "deadline_at", "hit_ratio"):
        if k in table:
            kw[k] = _number(f"{where}.{k}", table[k])
    if "lengths" in table:
        if not isinstance(table["lengths"], str):
            raise ScenarioError(f"{where}.lengths: expected a string, got {table['lengths']!r}")
        kw["lengths"] = table["lengths"]
    try:
        return RequestClass(**kw)
    except ScenarioError as e:
        # RequestClass names itself by class name; add the position in the file too.
        raise ScenarioError(f"{str(e)} (in {where})") from None


def scenario_from_dict(data: Mapping[str, Any], *, source: str = "<dict>") -> Scenario:
    """Build a validated :class:`Scenario` from a dict shaped like the TOML file."""
    data = _expect_table("scenario", data)
    _reject_unknown("scenario", {k: v for k, v in data.items() if k not in _TOP_EXTRA}, _TOP_KEYS)
    _require("scenario", data, ("gpu", "cluster", "classes"))
    name = data.get("name", Path(source).stem if not source.startswith("<") else "scenario")
    if not isinstance(name, str):
        raise ScenarioError(f"name: expected a string, got {name!r}")

    gpu_spec = data["gpu"]
    line_from_law = False  # a timemodel without alpha, beta, tau_solo: the LP's line comes from the law
    if isinstance(gpu_spec, str):
        from fluidopt.calibration.profiles import load_profile  # local import: calibration pulls statsmodels lazily

        gpu = load_profile(gpu_spec)
    elif isinstance(gpu_spec, Mapping) and "timemodel" in gpu_spec:
        from dataclasses import replace as _replace

        law = _timemodel(gpu_spec["timemodel"], source)
        table = {k: v for k, v in gpu_spec.items() if k != "timemodel"}
        line = [k for k in ("alpha", "beta", "tau_solo", "gamma") if k in table]
        line_from_law = not line
        if line_from_law:  # placeholders, replaced once the classes, which weight the law's line, are read
            table.update(alpha=1.0, beta=0.0, tau_solo=1.0)
        elif not ({"alpha", "beta"} <= set(line) and ("tau_solo" in line or "gamma" in line)):
            raise ScenarioError(f"gpu: with a timemodel give alpha, beta and tau_solo (or gamma) together, or none of "
                                f"them to take the fluid LP's straight line from the law; got only {', '.join(line)}")
        gpu = _replace(gpu_from_dict(table), timemodel=law)
    else:
        gpu = gpu_from_dict(gpu_spec)

    cluster = _expect_table("cluster", data["cluster"])
    _reject_unknown("cluster", cluster, _CLUSTER_KEYS)
    _require("cluster", cluster, ("gpus",))
    gpus = _integer("cluster.gpus", cluster["gpus"])
    if gpus < 1:
        raise ScenarioError(f"cluster.gpus: expected an integer >= 1, got {gpus!r}")

    pricing = _expect_table("pricing", data.get("pricing", {}))
    _reject_unknown("pricing", pricing, _PRICING_KEYS)
    cp = _number("pricing.prefill", pricing.get("prefill", 0.0))
    cd = _number("pricing.decode", pricing.get("decode", 0.0))

    classes = data["classes"]
    if not isinstance(classes, list) or not classes:
        raise ScenarioError(f"classes: expected a non-empty array of tables ([[classes]]), got {classes!r}")
    parsed = tuple(class_from_dict(c, i) for i, c in enumerate(classes))
    if any(isinstance(c, Mapping) and "demand" in c for c in classes):
        from fluidopt.core.demand import demands_from_tables

        parsed = demands_from_tables(classes, parsed, _number("pricing.prefill", cp), _number("pricing.decode", cd))
    if line_from_law:
        from dataclasses import replace as _replace

        from fluidopt.calibration.timemodels import straight_line_at
        from fluidopt.workloads.synthetic import _length_law

        moments = [(_length_law(f"classes[{c.name}]", c.lengths, c.prompt, c.prompt_sigma).second_moment,
                    _length_law(f"classes[{c.name}]", c.lengths, c.decode, c.decode_sigma).second_moment)
                   for c in parsed]
        alpha, beta, tau_solo = straight_line_at(gpu.timemodel, gpu.batch, parsed, moments)
        gpu = _replace(gpu, alpha=alpha, beta=beta, tau_solo=tau_solo)
    meta: dict[str, Any] = {}
    if "slis" in data:
        meta["slis"] = _slis(data["slis"], tuple(c.name for c in parsed))
    fleet = None
    if "fleet" in data:
        from fluidopt.core.model import Fleet

        ft = _expect_table("fleet", data["fleet"])
        _reject_unknown("fleet", ft, {"initial", "startup_delay", "kv_swap_time_per_token", "types"})
        fkw: dict[str, Any] = {}
        if "initial" in ft:
            fkw["initial"] = _integer("fleet.initial", ft["initial"])
        for k in ("startup_delay", "kv_swap_time_per_token"):
            if k in ft:
                fkw[k] = _number(f"fleet.{k}", ft[k])
        if "types" in ft:
            fkw["types"] = _instance_types(ft["types"])
        fleet = Fleet(**fkw)
    workflow = None
    if "arrivals" in data or "backlogs" in data or "workflow" in data:
        workflow = _workflow(data.get("arrivals", []), data.get("backlogs", []), source)
        wt = _expect_table("workflow", data.get("workflow", {}))
        _reject_unknown("workflow", wt, {"horizon"})
        if "horizon" in wt:
            from dataclasses import replace as _replace

            workflow = _replace(workflow, horizon=_number("workflow.horizon", wt["horizon"]))
    layout = None
    if "layout" in data or "pools" in data:
        try:
            layout = _layout(data.get("layout", "colocated"), data.get("pools", {}), source)
        except ScenarioError as e:
            # name the file: a layout's fields are checked again by the commands, which know no file
            raise ScenarioError(str(e) if source.startswith("<") else f"{source}: {e}") from None
    return Scenario(gpu=gpu, gpus=gpus, classes=parsed, prefill_price=cp, decode_price=cd, name=name, meta=meta,
                    fleet=fleet, workflow=workflow, layout=layout)


def _timemodel(spec: Any, source: str):
    """The ``[gpu.timemodel]`` table: the law's coefficients in seconds (``prefill``, ``decode_small``, optional
    ``decode_large`` and ``decode_threshold``), or DistServe's profiler JSON (``distserve_profile``, a path relative
    to the scenario file, with ``model`` and ``tp``)."""
    from fluidopt.calibration.timemodels import law_from_table, load_distserve_profile
    from fluidopt.core.errors import CalibrationError

    where = "gpu.timemodel" if source.startswith("<") else f"{source}: gpu.timemodel"
    spec = _expect_table("gpu.timemodel", spec)
    try:
        if "distserve_profile" in spec:
            _reject_unknown("gpu.timemodel", spec, {"distserve_profile", "model", "tp"})
            _require("gpu.timemodel", spec, ("model", "tp"))
            path = Path(str(spec["distserve_profile"]))
            if not path.is_absolute() and not source.startswith("<"):
                path = Path(source).parent / path
            return load_distserve_profile(path, str(spec["model"]), _integer("gpu.timemodel.tp", spec["tp"]))
        return law_from_table(spec, where=where)
    except CalibrationError as e:
        raise ScenarioError(str(e)) from None


def _layout(kind: Any, pools: Any, source: str):
    """``layout = "colocated" | "disaggregated" | "best"`` and the ``[pools]`` table (docs/scenarios.md,
    "Layout"): a path (``profile``, ``colocated_profile``, ``lengths``) is taken relative to the scenario
    file's folder."""
    import os

    from fluidopt.core.model import LAYOUTS, Layout

    if not isinstance(kind, str) or kind not in LAYOUTS:
        raise ScenarioError(f"layout: expected one of {', '.join(map(repr, LAYOUTS))}, got {kind!r}")
    pools = _expect_table("pools", pools)
    _reject_unknown("pools", pools, set(_POOL_KEYS))
    base = None if source.startswith("<") else Path(source).resolve().parent

    def path(v: Any) -> Any:
        if not isinstance(v, str) or not v or base is None or Path(v).is_absolute():
            return v  # (Layout refuses a value that is not a path)
        return os.path.normpath(base / v)

    kw: dict[str, Any] = {}
    for k, v in pools.items():
        if k in ("profile", "colocated_profile"):
            v = path(v)
        elif k == "lengths" and isinstance(v, list):
            v = [path(x) for x in v]
        kw[k] = v
    return Layout(kind, **kw)


def _instance_types(value: Any) -> tuple:
    """The ``[[fleet.types]]`` tables: name, gpu (a shipped profile's name or a GPU table), price_per_hour,
    startup_delay, max."""
    from fluidopt.core.model import InstanceType

    if not isinstance(value, list) or not value:
        raise ScenarioError(f"fleet.types: expected a non-empty array of tables ([[fleet.types]]), got {value!r}")
    out = []
    for k, t in enumerate(value):
        w = f"fleet.types[{k}]"
        t = _expect_table(w, t)
        _reject_unknown(w, t, {"name", "gpu", "price_per_hour", "startup_delay", "max"})
        _require(w, t, ("name",))
        name = t["name"]
        if not isinstance(name, str) or not name:
            raise ScenarioError(f"{w}.name: expected a non-empty string, got {name!r}")
        spec = t.get("gpu")
        if spec is None:
            raise ScenarioError(f"{w} ({name!r}): expected a GPU profile: gpu = \"NAME\" (a shipped profile) or a "
                                f"[fleet.types.gpu] table (alpha, beta, gamma or tau_solo, chunk, batch), got none")
        if isinstance(spec, str):
            from fluidopt.calibration.profiles import load_profile

            try:
                gpu = load_profile(spec)
            except ScenarioError as e:
                raise ScenarioError(f"{w} ({name!r}).{e}") from None
        else:
            gpu = gpu_from_dict(spec, where=f"{w}.gpu")
        kw: dict[str, Any] = {}
        for key in ("price_per_hour", "startup_delay"):
            if key in t:
                kw[key] = _number(f"{w}.{key}", t[key])
        if "max" in t:
            kw["max"] = _integer(f"{w}.max", t["max"])
        out.append(InstanceType(name, gpu, **kw))
    return tuple(out)


_ARRIVAL_KEYS = {"class", "process", "rate", "cv", "file", "slot"}
_BACKLOG_KEYS = {"class", "count", "at", "deadline"}


def _workflow(arrivals: Any, backlogs: Any, source: str):
    """``[[arrivals]]`` and ``[[backlogs]]`` (docs/orchestration.md section 5): a file path is taken
    relative to the scenario file's folder."""
    from fluidopt.core.model import ArrivalSpec, BacklogSpec, Workflow

    base = None if source.startswith("<") else Path(source).resolve().parent
    out_a, out_b = [], []
    for key, rows, keys in (("arrivals", arrivals, _ARRIVAL_KEYS), ("backlogs", backlogs, _BACKLOG_KEYS)):
        if not isinstance(rows, list):
            raise ScenarioError(f"{key}: expected an array of tables ([[{key}]]), got {rows!r}")
        for k, t in enumerate(rows):
            where = f"{key}[{k}]"
            t = _expect_table(where, t)
            _reject_unknown(where, t, keys)
            _require(where, t, ("class", "count") if key == "backlogs" else ("class",))
            if not isinstance(t["class"], str):
                raise ScenarioError(f"{where}.class: expected a class name (a string), got {t['class']!r}")
            kw: dict[str, Any] = {"cls": t["class"]}
            try:
                if key == "arrivals":
                    if "process" in t:
                        if not isinstance(t["process"], str):
                            raise ScenarioError(f"{where}.process: expected a string, got {t['process']!r}")
                        kw["process"] = t["process"]
                    for f in ("rate", "cv", "slot"):
                        if f in t:
                            kw[f] = _number(f"{where}.{f}", t[f])
                    if "file" in t:
                        if not isinstance(t["file"], str) or not t["file"]:
                            raise ScenarioError(f"{where}.file: expected a file path (a string), got {t['file']!r}")
                        f = Path(t["file"])
                        kw["file"] = str(f if f.is_absolute() or base is None else base / f)
                    out_a.append(ArrivalSpec(**kw))
                else:
                    kw["count"] = _integer(f"{where}.count", t["count"])
                    for f in ("at", "deadline"):
                        if f in t:
                            kw[f] = _number(f"{where}.{f}", t[f])
                    out_b.append(BacklogSpec(**kw))
            except ScenarioError as e:
                msg = str(e).replace(f"{key}[{t['class']}]", where, 1)
                if not msg.startswith(where):
                    msg = f"{msg} (in {where})"
                raise ScenarioError(msg) from None
    return Workflow(arrivals=tuple(out_a), backlogs=tuple(out_b))


def _slis(value: Any, class_names: tuple[str, ...]):
    """Parse and validate ``slis = ["tpot=0.03", ...]`` (the ``--sli`` spec strings of ``fluidopt solve``)
    once: the strings as written, carrying their SLI objects (:class:`~fluidopt.fluid.sli.SLISpecs`)."""
    from fluidopt.fluid.sli import SLISpecs, parse_sli, validate_slis  # pure Python, no solver import

    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ScenarioError(f"slis: expected an array of SLI spec strings like \"tpot=0.03\", got {value!r}")
    slis = validate_slis([parse_sli(v, where=f"slis[{i}]") for i, v in enumerate(value)], class_names)
    return SLISpecs(value, slis)


def _looks_like(text: str) -> str | None:
    """What a text that failed to parse as TOML plainly is instead (a CSV table, JSON), from its first
    line that is not blank or a comment; None when it looks like (broken) TOML."""
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
    if first[:1] in ("{", "["):
        import json

        for candidate in (text, first):  # a JSON document, or JSON lines
            try:
                json.loads(candidate)
                return "JSON"
            except ValueError:
                pass
        return None  # a (broken) TOML table header such as [gpu
    if "," in first and "=" not in first:
        return f"a CSV table (header {first[:60]!r})"
    return None


def loads_scenario(text: str, *, source: str = "<string>") -> Scenario:
    """Parse a scenario from TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        what = _looks_like(text)
        if what is not None:
            # a trace or a table passed where a scenario goes: the TOML error alone names neither
            raise ScenarioError(
                f"{source}: looks like {what}, not a scenario: a scenario is a TOML file with [gpu], [cluster] and "
                f"[[classes]] tables (docs/scenarios.md, examples/scenarios/); a trace goes to --trace") from None
        raise ScenarioError(f"{source}: not valid TOML: {e}") from None
    return scenario_from_dict(data, source=source)


def load_scenario(path: str | Path | None = None) -> Scenario:
    """Load a scenario from a TOML file; ``None`` or ``"default"`` gives the built-in default."""
    if path is None or str(path) in ("default", DEFAULT_SCENARIO_NAME):
        return default_scenario()
    text = read_text_file(path, "scenario", ScenarioError)
    return loads_scenario(text, source=str(path))


def default_scenario(gpus: int = 500) -> Scenario:
    """The built-in default: the paper's two-class instance (docs/model.md) on ``gpus`` GPUs."""
    return paper_scenario(gpus=gpus)


def _gpu_to_dict(g) -> dict[str, Any]:
    gpu: dict[str, Any] = {"alpha": g.alpha, "beta": g.beta, "tau_solo": g.tau_solo, "chunk": g.chunk, "batch": g.batch}
    if g.name:
        gpu["name"] = g.name
    if g.kv_capacity is not None:
        gpu["kv_capacity"] = g.kv_capacity
    if g.kv_time_per_token:
        gpu["kv_time_per_token"] = g.kv_time_per_token
    if g.price_per_hour is not None:
        gpu["price_per_hour"] = g.price_per_hour
    if g.timemodel is not None:
        gpu["timemodel"] = g.timemodel.to_dict()
    return gpu


def scenario_to_dict(s: Scenario) -> dict[str, Any]:
    """The inverse of :func:`scenario_from_dict` (round-trips through TOML)."""
    gpu = _gpu_to_dict(s.gpu)
    classes = []
    for c in s.classes:
        d: dict[str, Any] = {"name": c.name, "prompt": c.prompt, "decode": c.decode, "rate": c.rate, "patience": c.patience}
        for k in ("prefill_price", "decode_price", "prompt_sigma", "decode_sigma", "ttft_slo", "itl_slo", "deadline",
                  "deadline_at"):
            if getattr(c, k) is not None:
                d[k] = getattr(c, k)
        if c.lengths != "exponential":
            d["lengths"] = c.lengths
        if c.hit_ratio:
            d["hit_ratio"] = c.hit_ratio
        if c.demand is not None:
            d["demand"] = c.demand.to_dict()
        classes.append(d)
    out: dict[str, Any] = {
        "name": s.name,
        "gpu": gpu,
        "cluster": {"gpus": s.gpus},
        "pricing": {"prefill": s.prefill_price, "decode": s.decode_price},
        "classes": classes,
    }
    if s.meta.get("slis"):
        out["slis"] = list(s.meta["slis"])
    if s.fleet is not None:
        f = s.fleet
        out["fleet"] = {"startup_delay": f.startup_delay, "kv_swap_time_per_token": f.kv_swap_time_per_token}
        if f.types:
            out["fleet"]["types"] = [{"name": t.name, "gpu": _gpu_to_dict(t.gpu), "price_per_hour": t.price_per_hour,
                                      "startup_delay": t.startup_delay, **({"max": t.max} if t.max is not None else {})}
                                     for t in f.types]
        if f.initial is not None:
            out["fleet"]["initial"] = f.initial
    if s.layout is not None:
        lay = s.layout
        out["layout"] = lay.kind
        pools = {k: list(v) if isinstance(v, tuple) else v for k in _POOL_KEYS if (v := getattr(lay, k)) is not None}
        if pools:
            out["pools"] = pools
    if s.workflow is not None:
        wf = s.workflow
        out["arrivals"] = [{"class": a.cls, "process": a.process, **{k: getattr(a, k) for k in ("rate", "cv", "file", "slot")
                                                                      if getattr(a, k) is not None}} for a in wf.arrivals]
        out["backlogs"] = [{"class": b.cls, "count": b.count, "at": b.at,
                            **({} if b.deadline is None else {"deadline": b.deadline})} for b in wf.backlogs]
        if wf.horizon is not None:
            out["workflow"] = {"horizon": wf.horizon}
    return out


__all__ = [
    "load_scenario",
    "loads_scenario",
    "scenario_from_dict",
    "scenario_to_dict",
    "default_scenario",
    "gpu_from_dict",
]
