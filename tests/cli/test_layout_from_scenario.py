"""``solve`` and ``plan`` take the layout a scenario states (``layout`` and ``[pools]``) as the default of
their flags; a flag given overrides it (issue 44, "a scenario says which layout it uses")."""

from __future__ import annotations

import json
import textwrap

import pytest

from fluidopt.cli import main

ENTRY = {"prefill": [10.0, 0.05, 0.0], "decoding_smallbs": [5.0, 0.0001, 0.1]}  # ms, DistServe's format

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
    [pricing]
    prefill = 0.1
    decode = 0.2
    [[classes]]
    name = "chat"
    prompt = 300
    decode = 100
    rate = 2.0
    ttft_slo = 0.2
    itl_slo = 0.1
    """)


def _files(tmp_path, head: str, pools: str):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"facebook/opt-13b": {"1": ENTRY, "2": ENTRY}, "facebook/opt-66b": {"1": ENTRY}}))
    with_layout = tmp_path / "with.toml"
    with_layout.write_text(head + "\n" + BASE + "[pools]\nprofile = \"p.json\"\n" + pools)
    plain = tmp_path / "plain.toml"
    plain.write_text(BASE)
    return prof, with_layout, plain


def _untimed(d):
    """The JSON without the solver's wall times (they differ between any two solves)."""
    if isinstance(d, dict):
        return {k: _untimed(v) for k, v in d.items() if not k.endswith("_seconds")}
    return [_untimed(v) for v in d] if isinstance(d, list) else d


def _solve(capsys, *argv):
    code = main(["solve", *map(str, argv), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return _untimed(json.loads(out))


def test_solve_reads_the_layout_from_the_scenario(tmp_path, capsys):
    pools = 'model = "facebook/opt-13b"\nprefill_tp = 2\ndecode_tp = 1\nprefill_instances = 1\ndecode_instances = 3\n'
    prof, with_layout, plain = _files(tmp_path, 'layout = "disaggregated"', pools)
    from_file = _solve(capsys, with_layout)
    from_flags = _solve(capsys, plain, "--layout", "disaggregated", "--profile", prof, "--model", "facebook/opt-13b",
                        "--prefill-tp", "2", "--decode-tp", "1", "--prefill-instances", "1", "--decode-instances", "3")
    assert from_file == from_flags and from_file["prefill_tp"] == 2
    assert from_file["disaggregated_fixed_split"]["decode_instances"] == 3
    # "best" is the comparison of both, as disaggregated; a flag overrides its field
    with_layout.write_text(with_layout.read_text().replace('layout = "disaggregated"', 'layout = "best"'))
    assert _solve(capsys, with_layout) == from_file
    tp1 = _solve(capsys, with_layout, "--prefill-tp", "1")
    assert (tp1["prefill_tp"], tp1["decode_tp"]) == (1, 1) and tp1 != from_file
    # --layout colocated overrides the file's layout: the colocated LP, as for the scenario without one
    assert _solve(capsys, with_layout, "--layout", "colocated") == _solve(capsys, plain)


def test_a_colocated_layout_solves_as_before(tmp_path, capsys):
    _, with_layout, plain = _files(tmp_path, 'layout = "colocated"', 'model = "facebook/opt-13b"\n')
    assert _solve(capsys, with_layout) == _solve(capsys, plain)


@pytest.mark.parametrize("cmd, pools, fragment", [
    ("solve", 'model = "facebook/opt-13b"\nprefill_tp = 4\n',
     "pools.prefill_tp = 4: the profile '{p}' has TP degrees 1, 2 for facebook/opt-13b"),
    ("plan", 'model = "facebook/opt-13b"\ntp = [2, 4]\n',
     "pools.tp[1] = 4: the profile '{p}' has TP degrees 1, 2 for facebook/opt-13b"),
    ("solve", 'model = "facebook/opt-66b"\nprefill_tp = 1\ndecode_tp = 1\n',
     "pools.prefill_tp = 1: facebook/opt-66b at TP 1 needs 131.4 GB of weights per GPU"),
    ("plan", 'model = "facebook/opt-66b"\ntp = [1]\n',
     "pools.tp[0] = 1: facebook/opt-66b at TP 1 needs 131.4 GB of weights per GPU"),
    ("solve", 'model = "nobody/none"\n', "pools.model: --model 'nobody/none': not in --profile"),
    ("plan", 'model = "nobody/none"\n', "pools.model: --model 'nobody/none': not in --profile"),
])
def test_a_tp_degree_or_model_the_profile_lacks_is_one_line(tmp_path, capsys, cmd, pools, fragment):
    prof, with_layout, _ = _files(tmp_path, 'layout = "disaggregated"', pools)
    assert main([cmd, str(with_layout)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{with_layout}: " in err and fragment.replace("{p}", str(prof)) in err, err


def test_plan_runs_the_placement_search_with_the_scenarios_pools(tmp_path, capsys, monkeypatch):
    # the search itself is tested in tests/planning; here: what plan hands it from the file, and what a flag overrides
    import fluidopt.planning.placement as placement

    seen = {}

    def fake(law_of, kv_of, prompt, output, **kw):
        from fluidopt.core.errors import UsageError

        seen.update(kw, prompts=len(prompt))
        raise UsageError("stopped before the search")

    monkeypatch.setattr(placement, "search_placement", fake)
    runs = tmp_path / "r.exp"
    runs.write_text(repr([dict(prompt_len=10, output_len=3, issue_time=0.0, ttft_ms=20.0, tpot_ms=12.0,
                               latency_ms=44.0)] * 3) + "\n")
    pools = ('model = "facebook/opt-13b"\ntp = [1, 2]\nlink_gbps = 25\nlink_latency_ms = 0.5\nprefill_max_tokens = 4096\n'
             'prefill_overhead_ms = 3\ndecode_request_ms = 0.2\nlengths = ["r.exp"]\n')
    _, with_layout, _ = _files(tmp_path, 'layout = "best"', pools)
    assert main(["plan", str(with_layout)]) == 2 and "stopped before the search" in capsys.readouterr().err
    assert seen["gpus"] == 4 and list(seen["tps"]) == [1, 2] and seen["layouts"] == ("colocated", "disaggregated")
    assert seen["link_bandwidth"] == 25e9 and seen["link_latency"] == pytest.approx(5e-4)
    assert seen["prefill_max_tokens"] == 4096 and seen["prefill_overhead"] == pytest.approx(3e-3)
    assert seen["decode_request_overhead"] == pytest.approx(2e-4) and seen["prompts"] == 3
    assert main(["plan", str(with_layout), "--layout", "disaggregated", "--gpus", "3", "--tp", "1", "--link-gbps", "50"]) == 2
    assert seen["gpus"] == 3 and list(seen["tps"]) == [1] and seen["layouts"] == ("disaggregated",)
    assert seen["link_bandwidth"] == 50e9 and seen["prefill_max_tokens"] == 4096
    capsys.readouterr()
    # a colocated layout leaves plan as it was (the fleet plan; no search)
    colo = tmp_path / "colo.toml"
    colo.write_text(with_layout.read_text().replace('layout = "best"', 'layout = "colocated"'))
    seen.clear()
    assert main(["plan", str(colo), "--fluid-only", "--json"]) == 0 and not seen
