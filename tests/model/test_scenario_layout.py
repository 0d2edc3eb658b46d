"""A scenario's layout (issue 44): ``layout = "colocated" | "disaggregated" | "best"`` and the ``[pools]``
table, read, validated (one line naming the file, the field and the value) and written back."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fluidopt.cli import main
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Layout
from fluidopt.scenario import load_scenario, loads_scenario, scenario_to_dict

ROOT = Path(__file__).resolve().parents[2]

BASE = textwrap.dedent("""
    name = "s"
    [gpu]
    alpha = 0.0174
    beta = 6.2e-5
    gamma = 45.45
    chunk = 256
    batch = 16
    [cluster]
    gpus = 4
    [[classes]]
    name = "chat"
    prompt = 300
    decode = 100
    rate = 2.0
    """)

POOLS = textwrap.dedent("""
    [pools]
    profile = "prof/p.json"
    model = "facebook/opt-13b"
    prefill_tp = 2
    decode_tp = 1
    prefill_instances = 1
    decode_instances = 2
    tp = [1, 2]
    link_gbps = 25
    link_latency_ms = 0.5
    prefill_max_tokens = 4096
    prefill_overhead_ms = 3.13
    decode_request_ms = 0.224
    colocated_profile = "/abs/vllm.json"
    colocated_request_ms = 0.34
    lengths = ["runs/a.exp", "runs/b.exp"]
    """)


def _write(tmp_path, text: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_layout_and_pools_are_read_with_paths_relative_to_the_file(tmp_path):
    sc = load_scenario(_write(tmp_path, 'layout = "best"\n' + BASE + POOLS))
    lay = sc.layout
    assert lay.kind == "best" and lay.model == "facebook/opt-13b" and (lay.prefill_tp, lay.decode_tp) == (2, 1)
    assert lay.tp == (1, 2) and lay.link_gbps == 25.0 and isinstance(lay.link_gbps, float)
    assert lay.profile == str(tmp_path.resolve() / "prof" / "p.json")
    assert lay.colocated_profile == "/abs/vllm.json"  # an absolute path stays as written
    assert lay.lengths == tuple(str(tmp_path.resolve() / "runs" / f) for f in ("a.exp", "b.exp"))
    # no [pools]: the commands' own defaults; no layout key: colocated
    assert load_scenario(_write(tmp_path, 'layout = "disaggregated"\n' + BASE)).layout == Layout("disaggregated")
    assert load_scenario(_write(tmp_path, BASE + POOLS)).layout.kind == "colocated"


def test_the_layout_round_trips_through_toml(tmp_path):
    import tomli_w

    sc = load_scenario(_write(tmp_path, 'layout = "disaggregated"\n' + BASE + POOLS))
    d = scenario_to_dict(sc)
    assert d["layout"] == "disaggregated" and d["pools"]["tp"] == [1, 2]
    again = loads_scenario(tomli_w.dumps(d))
    assert again.layout == sc.layout and again == sc
    assert scenario_to_dict(again) == d


def test_scenarios_without_a_layout_load_and_write_as_before():
    # every shipped scenario but the one that states a layout: no layout, and no new key written back
    for f in sorted((ROOT / "examples" / "scenarios").glob("*.toml")):
        if f.stem == "distserve-opt13b-a100":
            continue
        sc = load_scenario(f)
        assert sc.layout is None, f.name
        assert "layout" not in scenario_to_dict(sc) and "pools" not in scenario_to_dict(sc), f.name


def test_the_distserve_example_states_its_layout():
    sc = load_scenario(ROOT / "examples" / "scenarios" / "distserve-opt13b-a100.toml")
    lay = sc.layout
    assert lay.kind == "best" and sc.gpus == 4 and lay.model == "facebook/opt-13b" and lay.tp == (1, 2, 4)
    # the paths point at the shared data beside the repository, never into it
    assert lay.profile.endswith("shared/data/distserve-opt13b-a100/profiler-a100-80g.distserve.json")
    assert len(lay.lengths) == 4 and not Path(lay.profile).resolve().is_relative_to(ROOT.resolve())


@pytest.mark.parametrize("head, pools, fragment", [
    ('layout = "split"', "", "layout: expected one of 'colocated', 'disaggregated', 'best', got 'split'"),
    ("layout = 2", "", "layout: expected one of 'colocated', 'disaggregated', 'best', got 2"),
    ('layout = "best"', "decode_instances = 0\nprefill_instances = 1",
     "pools.decode_instances: a disaggregated layout needs a decode pool, expected an integer >= 1, got 0"),
    ('layout = "best"', "prefill_instances = 1", "pools.prefill_instances: expected prefill_instances and "
                                                 "decode_instances together"),
    ('layout = "best"', "link_gbps = 0", "pools.link_gbps: expected a bandwidth in GB/s > 0, got 0"),
    ('layout = "best"', "link_gbps = -2.5", "pools.link_gbps: expected a bandwidth in GB/s > 0, got -2.5"),
    ('layout = "best"', "link_latency_ms = -1", "pools.link_latency_ms: expected a number >= 0, got -1"),
    ('layout = "best"', "prefill_tp = 0", "pools.prefill_tp: expected an integer >= 1, got 0"),
    ('layout = "best"', 'decode_tp = "1"', "pools.decode_tp: expected an integer, got '1'"),
    ('layout = "best"', "tp = 2", "pools.tp: expected a non-empty array of TP degrees, integers >= 1, got 2"),
    ('layout = "best"', "tp = [2, 0]", "pools.tp[1]: expected an integer >= 1, got 0"),
    ('layout = "best"', "lengths = [3]", "pools.lengths[0]: expected a path (a non-empty string), got 3"),
    ('layout = "best"', 'model = ""', "pools.model: expected a non-empty string, got ''"),
    ('layout = "best"', "gbps = 3", "pools: unknown key 'gbps'"),
])
def test_bad_layouts_are_one_line_naming_the_file(tmp_path, capsys, head, pools, fragment):
    text = head + "\n" + BASE + ("[pools]\n" + pools + "\n" if pools else "")
    with pytest.raises(ScenarioError) as e:
        loads_scenario(text, source="x.toml")
    assert str(e.value).startswith("x.toml: ") and fragment in str(e.value)
    path = _write(tmp_path, text)
    assert main(["solve", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"{path}: " in err and fragment in err and "Traceback" not in err
