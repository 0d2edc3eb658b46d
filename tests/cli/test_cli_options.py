"""CLI plumbing shared by ``simulate`` and ``run``: --option, --import, exit codes."""

import json
from pathlib import Path

import pytest
from builders import run_cli

from fluidopt.commands._options import parse_options
from fluidopt.core.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
CUSTOM = str(ROOT / "examples" / "custom_controller.py")


_cli = run_cli


def test_parse_options_reads_json_values_else_strings():
    assert parse_options(["chunked=true", "interval=2.5", "predictor=oracle", "ids=[1, 2]"]) == {
        "chunked": True, "interval": 2.5, "predictor": "oracle", "ids": [1, 2]}


@pytest.mark.parametrize("spec, message", [
    ("novalue", r"--option 'novalue': expected KEY=VALUE"),
    ("1x=3", r"--option '1x=3': expected KEY=VALUE with KEY a Python identifier"),
])
def test_parse_options_errors(spec, message):
    with pytest.raises(UsageError, match=message):
        parse_options([spec])


def test_parse_options_duplicate():
    with pytest.raises(UsageError, match="--option a: given twice"):
        parse_options(["a=1", "a=2"])


@pytest.mark.integration
def test_simulate_passes_options_to_the_controller(cli_here):
    base = ["simulate", "--gpus", "4", "--horizon", "40", "--warmup", "5", "--service", "tokens", "--json"]
    mean = json.loads(cli_here(*base, "--policy", "jsq").stdout)
    oracle = json.loads(cli_here(*base, "--policy", "jsq", "--option", "predictor=oracle").stdout)
    assert mean["policy"] == oracle["policy"] == "jsq"
    # Same arrivals, different routing information: the runs must differ somewhere.
    assert mean["requests"] == oracle["requests"]
    assert (mean["completed"], mean["e2e_mean"]) != (oracle["completed"], oracle["e2e_mean"])
    bad = cli_here("simulate", "--gpus", "4", "--horizon", "40", "--policy", "jsq", "--option", "bogus=1")
    assert bad.returncode == 2 and "unknown option 'bogus'" in bad.stderr and "Traceback" not in bad.stderr


# A real process: --import registers a policy in the process's registry for good (in this process it would
# stay for every later test on the worker), and run's worker processes must import the file themselves.
@pytest.mark.integration
def test_import_registers_a_user_policy_for_simulate_and_run():
    p = _cli("simulate", "--import", CUSTOM, "--policy", "class-affinity", "--gpus", "4", "--horizon", "30", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["policy"] == "class-affinity"
    # run uses worker processes: each must import the module too
    p = _cli("run", "--import", CUSTOM, "--policies", "class-affinity,fi-wsp", "--gpus", "4", "--horizon", "30",
             "--warmup", "5", "--seeds", "2", "--workers", "2", "--out", "", "--json")
    assert p.returncode == 0, p.stderr
    assert [r["policy"] for r in json.loads(p.stdout)["policies"]] == ["class-affinity", "fi-wsp"]


@pytest.mark.integration
def test_import_errors_are_one_line(cli_here):
    p = cli_here("simulate", "--import", "no_such_module_xyz", "--policy", "fi-wsp")
    assert p.returncode == 2 and "--import 'no_such_module_xyz': cannot import it" in p.stderr
    p = cli_here("simulate", "--import", "missing.py", "--policy", "fi-wsp")
    assert p.returncode == 2 and "--import 'missing.py': no such file" in p.stderr
