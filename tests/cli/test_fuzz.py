"""Fuzzing the command line: whatever a user types or feeds it, fluidopt exits 0, or exits 2 with one
line on stderr; never a traceback, never a hang.

Hypothesis mutates the inputs a new user gets wrong: scenario files (values of the wrong type, out of
range, huge, missing or unknown keys, broken TOML, a byte-order mark), calibration CSVs, trace CSVs
and argument lists. Each example runs in-process through ``fluidopt.cli.main`` under an alarm, so a
hang fails as a hang. Numbers that are legal but enormous (a million requests per second for a
day) are deliberately not drawn: they are valid runs, only long ones; the size limits that stop
absurd ones (``fluidopt.sim.limits``) are drawn.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest
from builders import process_state, state_changes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluidopt.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / "examples/scenarios/paper-two-class.toml").read_text()
SETTINGS = settings(max_examples=int(os.environ.get("FLUIDOPT_FUZZ_EXAMPLES", "40")), deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
ALARM_S = 60


class Hang(Exception):
    pass


@contextlib.contextmanager
def alarm(seconds: int):
    def fire(signum, frame):
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    with alarm(ALARM_S):
        before = process_state()  # (inside the alarm: its own SIGALRM handler is the state to restore)
        try:
            code = main(argv)
        except SystemExit as e:  # --help / --version
            code = e.code if isinstance(e.code, int) else 0
        changed = state_changes(before, process_state())  # nothing left for the next example or test
    assert not changed, f"{argv} left the process changed: " + "; ".join(changed)
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean(argv: list[str], code: int, err: str) -> None:
    assert "Traceback" not in err, f"{argv}: traceback:\n{err}"
    assert code in (0, 2, 130), f"{argv}: exit {code}\n{err}"
    if code == 2:
        # one error line, last; warnings about the input (one line each) may come before it
        lines = [ln for ln in err.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ": warning: " not in ln]
        assert len(errors) == 1, f"{argv}: expected one error line, got {len(errors)}:\n{err}"
        assert lines[-1] == errors[0] and errors[0].startswith("fluidopt"), f"{argv}: {err!r}"
        assert all(ln.startswith("fluidopt") for ln in lines), f"{argv}: {err!r}"


# -- scenario files ---------------------------------------------------------------------------------
KEYS = ["name", "alpha", "beta", "tau_solo", "chunk", "batch", "gpus", "prefill", "decode", "prompt", "rate",
        "patience"]
BAD_VALUES = st.one_of(
    st.sampled_from(['"x"', "true", "-1", "0", "-0.5", "nan", "inf", "-inf", "1e300", "99999999999999999999",
                     "10000000000000", "1e13", "[]", "[1, 2]", "{}", '""', "2.5", "0.0001", "1_000"]),
    st.integers(min_value=-10**6, max_value=10**4).map(str),
    st.floats(min_value=-1e3, max_value=1e3, allow_nan=False).map(repr),
)


def mutate(text: str, key: str, value: str | None, extra: str) -> str:
    lines = text.splitlines()
    out = []
    done = False
    for ln in lines:
        if not done and ln.split("=")[0].strip() == key:
            done = True
            if value is None:
                continue  # delete the key
            out.append(f"{key} = {value}")
        else:
            out.append(ln)
    return "\n".join(out) + "\n" + extra


@SETTINGS
@given(key=st.sampled_from(KEYS), value=st.one_of(st.none(), BAD_VALUES),
       extra=st.sampled_from(["", "unknown = 1\n", "[extra]\n", "slis = [\"tpot=0.0001\"]\n", "slis = 3\n",
                              'slis = ["nonsense"]\n', "[[classes]]\n", "=\n"]),
       bom=st.booleans(), policy=st.sampled_from(["gate-and-route", "fi-wsp", "round-robin"]))
@pytest.mark.integration
def test_scenario_files(tmp_path, capsys, key, value, extra, bom, policy):
    text = mutate(EXAMPLE, key, value, extra)
    f = tmp_path / "s.toml"
    f.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    for argv in (["solve", str(f)], ["solve", str(f), "--json"],
                 ["simulate", str(f), "--policy", policy, "--gpus", "2", "--horizon", "3", "--no-progress"]):
        code, out, err = run_cli(argv, capsys)
        assert_clean(argv, code, err)


# -- demand tables and observations (fluidopt price --optimize / --fit-demand) -------------------------
DEMAND_EXAMPLE = (ROOT / "examples/scenarios/paper-two-class-demand.toml").read_text()
DEMAND_TABLES = st.sampled_from([
    'model = "linear"\nslope = 2.0', 'model = "linear"\nmax_rate = 900.0', 'model = "linear"\nslope = 2.0\nmax_rate = 1.0',
    'model = "constant-elasticity"\nelasticity = 1.5', 'model = "constant-elasticity"\nelasticity = 0.5',
    'model = "constant-elasticity"\nelasticity = 1.5\nprice_ref = 0',
    'model = "logit"\nmarket = "m"\nmarket_size = 1000.0\nprice_sensitivity = 0.01',
    'model = "logit"\nmarket = "m"\nmarket_size = 250.0\nprice_sensitivity = 0.01\noutside_option = false',
    'model = "logit"\nmarket = "m"\nmarket_size = 1000.0\nprice_sensitivity = 0.01\nutility = 3.0',
    'model = "nope"', "", "slope = 2.0", 'model = "linear"\nslope = "x"', 'model = 3',
])


@SETTINGS
@given(first=DEMAND_TABLES, second=DEMAND_TABLES, value=BAD_VALUES, key=st.sampled_from(["slope", "rate", "gpus"]),
       flags=st.sampled_from([[], ["--tiers", "tokens"], ["--json"], ["--gpus", "3"], ["--fleet"]]))
@pytest.mark.integration
def test_demand_scenario_files(tmp_path, capsys, first, second, value, key, flags):
    parts = DEMAND_EXAMPLE.split("[classes.demand]")
    text = parts[0] + "[classes.demand]\n" + first + "\n\n" + parts[1].split("\n\n", 1)[1] + "[classes.demand]\n" + second
    f = tmp_path / "s.toml"
    f.write_text(mutate(text, key, value, "") if key != "slope" else text)
    argv = ["price", str(f), "--optimize", "--prefill", "0:0.5:3", "--decode", "0:0.5:3", *flags]
    code, out, err = run_cli(argv, capsys)
    assert_clean(argv, code, err)


@SETTINGS
@given(header=st.sampled_from(["class,price,rate", "price,rate", "class,price", "class,rate,price", "a,b,c", ""]),
       rows=st.lists(st.tuples(st.sampled_from(["a", "b", ""]), st.sampled_from(["1", "2.5", "0", "-1", "x", "", "1e300"]),
                               st.sampled_from(["3", "0", "-2", "nan", "7.5", "y"])), max_size=10))
@pytest.mark.integration
def test_observation_csvs(tmp_path, capsys, header, rows):
    f = tmp_path / "o.csv"
    f.write_text(header + "\n" + "\n".join(",".join(r) for r in rows) + "\n")
    argv = ["price", "--fit-demand", str(f)]
    code, out, err = run_cli(argv, capsys)
    assert_clean(argv, code, err)


# -- calibration CSVs -------------------------------------------------------------------------------
CELL = st.sampled_from(["64", "128", "0", "-1", "32.5", "fast", "", "nan", "inf", "1e300", "0.02", "0.03",
                        "99999999999999999999", "solo", "mixed"])


@SETTINGS
@given(header=st.sampled_from(["chunk_tokens,iteration_seconds", "chunk_tokens,iteration_seconds,mode",
                               "iteration_seconds,chunk_tokens", "a,b", "chunk_tokens", ""]),
       rows=st.lists(st.lists(CELL, min_size=0, max_size=4), min_size=0, max_size=12),
       flags=st.sampled_from([[], ["--json"], ["--robust"], ["--toml"], ["--toml", "--chunk", "256", "--batch", "16"]]))
@pytest.mark.integration
def test_calibration_csvs(tmp_path, capsys, header, rows, flags):
    f = tmp_path / "c.csv"
    f.write_text(header + "\n" + "\n".join(",".join(r) for r in rows) + "\n")
    argv = ["calibrate", str(f), *flags]
    code, out, err = run_cli(argv, capsys)
    assert_clean(argv, code, err)


# -- Vidur operator profiles and GPU prices ---------------------------------------------------------
@SETTINGS
@given(folder=st.sampled_from(["", "compute", "compute/a100", "compute/a100/meta-llama/Llama-2-7b-hf"]),
       content=st.sampled_from(["", "num_tokens\n1\n", "a,b\n1,2\n", "\x00\x01"]),
       gpu=st.sampled_from(["a100", "h100", "A100", "", "x"]),
       model=st.sampled_from(["meta-llama/Llama-2-7b-hf", "meta-llama/Meta-Llama-3-70B", "x", ""]),
       tp=st.sampled_from(["1", "3", "0", "-1", "x"]),
       flags=st.sampled_from([[], ["--json"], ["--toml"], ["--robust"], ["--layers-from", "meta-llama/Llama-2-7b-hf"],
                              ["--layers-from", "x"]]))
@pytest.mark.integration
def test_vidur_folders(tmp_path, capsys, folder, content, gpu, model, tp, flags):
    d = tmp_path / "v" / folder
    d.mkdir(parents=True, exist_ok=True)
    if folder:
        (d / "mlp.csv").write_text(content)
    argv = ["calibrate", "--vidur", str(tmp_path / "v"), "--gpu", gpu, "--model", model, "--tp", tp, *flags]
    code, out, err = run_cli(argv, capsys)
    assert_clean(argv, code, err)


@SETTINGS
@given(prices=st.lists(st.sampled_from(["h100=4", "a100=2", "h100", "=3", "h100=x", "h100=-1", "h200=1", "h100=nan",
                                        "h100-llama-2-70b-tp4=inf", "a100-llama-2-70b-tp4=1e300"]), max_size=3),
       profiles=st.sampled_from(["h100-llama-2-70b-tp4,a100-llama-2-70b-tp4", "h100-llama-2-70b-tp4", "nope", ""]))
@pytest.mark.integration
def test_plan_prices(capsys, prices, profiles):
    argv = ["plan", "--fluid-only", *(["--profiles", profiles] if profiles else [])]
    for p in prices:
        argv += ["--price", p]
    code, out, err = run_cli(argv, capsys)
    assert_clean(argv, code, err)


# -- traces -----------------------------------------------------------------------------------------
TCELL = st.sampled_from(["0", "0.5", "1", "2.25", "-1", "", "x", "1e300", "nan", "12", "300", "100000000000",
                         "2023-11-16 18:15:46.6805900", "short-prompt", "c9"])


@SETTINGS
@given(header=st.sampled_from(["time,prompt_tokens,output_tokens", "time,prompt_tokens,output_tokens,class",
                               "TIMESTAMP,ContextTokens,GeneratedTokens", "time,prompt", ""]),
       rows=st.lists(st.lists(TCELL, min_size=0, max_size=4), min_size=0, max_size=10),
       speedup=st.sampled_from(["1", "0", "-2", "1e6", "x"]))
@pytest.mark.integration
def test_trace_files(tmp_path, capsys, header, rows, speedup):
    f = tmp_path / "t.csv"
    f.write_text(header + "\n" + "\n".join(",".join(r) for r in rows) + "\n")
    argv = ["simulate", "--trace", str(f), "--service", "tokens", "--gpus", "2", "--horizon", "5",
            "--policy", "round-robin", "--speedup", speedup, "--no-progress"]
    code, out, err = run_cli(argv, capsys)
    assert_clean(argv, code, err)


# -- argument lists ---------------------------------------------------------------------------------
ARG = st.sampled_from([
    "--gpus", "--horizon", "--warmup", "--seed", "--service", "--policy", "--option", "--import", "--records",
    "--batches", "--pricing", "--sli", "--json", "--backend", "--sample-interval", "--list-policies",
    "0", "-1", "2", "1e12", "1e300", "nan", "x", "tokens", "markov", "fi-wsp", "gate-and-route", "jsq",
    "foo=bar", "predictor=oracle", "chunked=true", "tpot=0.0001", "tpot=0.03", "served[short-prompt]>=0.99",
    "separate", "bundled", "compiled", "python", "auto", "nope.py", "/", "/nonexistent/dir/x.csv", ".",
    "99999999999999999999999",
])


@pytest.mark.integration
@SETTINGS
@given(cmd=st.sampled_from(["solve", "simulate", "calibrate", "validate"]), args=st.lists(ARG, max_size=7))
def test_argument_lists(tmp_path, capsys, monkeypatch, cmd, args):
    monkeypatch.chdir(tmp_path)
    argv = [cmd, *args]
    if cmd == "simulate":
        # keep legal runs short: a small fleet and horizon unless the drawn arguments override them
        argv += ["--no-progress"] + ([] if "--horizon" in args else ["--horizon", "2"]) + \
                ([] if "--gpus" in args else ["--gpus", "2"])
    code, out, err = run_cli(argv, capsys)
    assert_clean(argv, code, err)


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--gpus", "1000000000", "--policy", "fi-wsp", "--horizon", "1"], "slots is more than"),
    (["simulate", "--horizon", "1e12", "--policy", "fi-wsp"], "shorten the horizon"),
    (["simulate", "--policy", "fi-wsp", "--option", "foo=bar"], "unknown option 'foo'"),
    (["simulate", "--policy", "gate-and-route", "--option", "predictor=oracle"], "unknown option 'predictor'"),
    (["simulate", "--policy", "fi-wsp", "--records", "."], "is a folder"),
    (["simulate", "--policy", "round-robin", "--service", "tokens", "--no-prefix-cache"],
     "--no-prefix-cache: only used with --trace"),
    (["simulate", "--policy", "round-robin", "--service", "tokens", "--trace", "/nonexistent.jsonl", "--speedup", "inf"],
     "--speedup: expected a finite number > 0, got inf"),
    (["solve", "."], "is a folder"),
    (["validate", "x.exp", "--engine", "vlm"], "no such engine (did you mean 'vllm'?)"),
    (["validate", ".", "--engine", "vllm", "--timemodel", "x.toml"], "time-model file 'x.toml': no such file"),
    (["validate", "/nonexistent.exp", "--profile", "p.json"], "needs --model NAME and --tp N"),
    (["solve", "--hit-ratio", "1"], "--hit-ratio: expected a number in [0, 1)"),
    (["price", "--from-trace", "/nonexistent.jsonl"], "--from-trace: '/nonexistent.jsonl': no such file"),
    (["plan", "--fluid-only", "--cache-rule", "sglang"], "--cache-rule: only used with --from-trace"),
    (["stability", "mixed", "--engine", "vllm"], "smaller than the longest prompt (1024 tokens)"),
    (["stability", "short", "--engine", "vllm", "--budget", "100"], "--budget 100: smaller than the longest prompt"),
    (["stability", "short", "--rates", "10,0"], "--rates '10,0': expected comma-separated requests/s > 0"),
    (["stability", "short", "--rates", "-5"], "expected comma-separated requests/s > 0"),
    (["stability", "short", "--engine", "sarathi"], "--engine 'sarathi': no such engine"),
    (["stability", "shrt"], "no such scenario (did you mean 'short'?)"),
    (["stability", "x.toml"], "scenario file 'x.toml': no such file"),
    (["serve-engine", "--port", "0", "--speed", "nan"], "--speed nan: expected a positive number"),
    (["replay", "/nonexistent.jsonl", "--url", "http://127.0.0.1:9"], "no such file"),
    (["loop", "x.csv", "--engines", "0", "--router", "litellm:fi-wsp"], "--engines 0: expected a positive"),
    (["loop", "x.csv", "--engines", "2", "--router", "litellm:fi-wps"], "did you mean 'fi-wsp'"),
])
def test_named_bad_inputs_are_one_line_before_any_work(capsys, argv, message):
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_json_errors_are_json(capsys):
    import json

    code, out, err = run_cli(["solve", "/nonexistent.toml", "--json"], capsys)
    assert code == 2 and json.loads(out)["error"].endswith("no such file")
    code, out, err = run_cli(["solve", "--pricing", "z", "--json"], capsys)
    assert code == 2 and "invalid choice" in json.loads(out)["error"]


@pytest.mark.skipif(sys.platform == "win32", reason="file permissions")
def test_unwritable_output_folder(tmp_path, capsys):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        import os

        if os.access(d, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        code, out, err = run_cli(["simulate", "--policy", "fi-wsp", "--records", str(d / "r.csv")], capsys)
        assert code == 2 and "not writable" in err
    finally:
        d.chmod(0o700)


def test_trace_with_no_time_span(tmp_path, capsys):
    """Found by test_trace_files: a multi-class scenario cannot take its rates from a trace whose
    requests all arrive at once; the CLI says so in one error line after its input warnings."""
    f = tmp_path / "t.csv"
    f.write_text("time,prompt_tokens,output_tokens\n0,0,0\n")
    argv = ["simulate", "--trace", str(f), "--service", "tokens", "--gpus", "2", "--horizon", "5",
            "--policy", "round-robin", "--no-progress"]
    code, out, err = run_cli(argv, capsys)
    assert code == 2
    assert_clean(argv, code, err)
    assert "arrive at the same instant" in err.splitlines()[-1]
    assert sum(": warning: " in ln for ln in err.splitlines()) == 2
