"""Iteration-time laws from Vidur's published operator profiles (fluidopt/calibration/vidur.py, issue 32).

Hand computations on a tiny synthetic operator table run everywhere; the checks against the real
tables (../shared/data/vidur-profiling) skip when the folder is absent and fail under
FLUIDOPT_REQUIRE=trace (tests/conftest.py), as CI sets it when ../shared/data exists.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

from fluidopt import vidur
from fluidopt.calibration import from_vidur, list_profiles, load_profile, profile_info, profile_names
from fluidopt.cli import main
from fluidopt.core.errors import CalibrationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "vidur-profiling"
needs_data = pytest.mark.skipif(not (DATA / "compute").is_dir(), reason=f"Vidur profiling data not found at {DATA}")

MODEL = "meta-llama/Llama-2-7b-hf"  # 32 layers in vidur.MODELS
GEO = dict(n_head=32, n_kv_head=32, n_embd=4096, n_expanded_embd=11008, vocab_size=32768, use_gated_mlp=True)
OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
       "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


def write_table(root: Path, gpu: str = "a100", model: str = MODEL, tps=(1, 2), tokens=(1, 1024, 4096),
                **geo) -> Path:
    """A tiny mlp.csv in which every operator's median is ``k + tokens / 1000`` ms (k its position + 1)."""
    rows = []
    for tp in tps:
        for t in tokens:
            r = {**GEO, **geo, "num_tokens": t, "num_tensor_parallel_workers": tp}
            for k, op in enumerate(OPS, start=1):
                for stat in ("min", "max", "mean", "median", "std"):
                    r[f"time_stats.{op}.{stat}"] = (k + t / 1000) / tp if stat != "std" else 0.0
            rows.append(r)
    folder = root / "compute" / gpu / model
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / "mlp.csv", index=False)
    return root


def op_ms(op: str, tokens: float, tp: int) -> float:
    return (OPS.index(op) + 1 + tokens / 1000) / tp


NO_ATTENTION = vidur.AttentionModel(0.0, 1e300, 1e300, 0.0, 1e300)


# -- composition by hand ----------------------------------------------------------------------------
def test_iteration_time_is_the_documented_sum_of_operators(tmp_path):
    root = write_table(tmp_path)
    t = vidur.read_operator_table(root, "a100", MODEL, 1)
    C, D, K = 300.0, 20.0, 1000.0
    T = C + D
    layer = sum(op_ms(op, T, 1) for op in vidur.LAYER_OPS) * 1e-3  # two adds
    spec, a = vidur.GPUS["a100"], vidur.ATTENTION
    hd = 4096 // 32
    attn = (a.prefill_launch + 2 * C * C * hd * 32 / (a.causal_efficiency * spec.peak_flops)
            + a.decode_launch + 2 * D * K * hd * 32 * 2 / (a.decode_efficiency * spec.bandwidth))
    lm_head = op_ms("mlp_up_proj", D + 1, 1) * 1e-3 * 32768 / (2 * 11008)
    want = 32 * (layer + attn) + op_ms("emb", T, 1) * 1e-3 + lm_head
    assert float(vidur.iteration_time(t, C, D, K)) == pytest.approx(want, rel=1e-12)


def test_a_token_count_profiled_twice_takes_the_later_row_whatever_the_sort(tmp_path):
    """Vidur's h100 Llama-2-70B table has two rows at 2,048 and at 4,096 tokens; which one a quicksort
    kept changed with the numpy release. The later row in the file wins, here with 40 copies of one count."""
    root = write_table(tmp_path, tokens=(1, 1024, 4096))
    path = root / "compute" / "a100" / MODEL / "mlp.csv"
    d = pd.read_csv(path)
    extra = pd.concat([d[(d["num_tokens"] == 1024) & (d["num_tensor_parallel_workers"] == 1)]] * 40, ignore_index=True)
    for i in range(len(extra)):
        extra.loc[i, "time_stats.mlp_up_proj.median"] = 100.0 + i
    pd.concat([d, extra], ignore_index=True).to_csv(path, index=False)
    t = vidur.read_operator_table(root, "a100", MODEL, 1)
    assert t.tokens.tolist() == [1.0, 1024.0, 4096.0]
    assert t.up_proj[1] == pytest.approx((100.0 + len(extra) - 1) * 1e-3)


def test_tensor_parallel_adds_two_ring_allreduces_per_layer(tmp_path):
    root = write_table(tmp_path)
    t2 = vidur.read_operator_table(root, "a100", MODEL, 2)
    C, D = 512.0, 0.0
    ar = vidur.ALLREDUCE_LATENCY + 2 * (2 - 1) / 2 * C * 4096 * 2 / vidur.GPUS["a100"].link_bandwidth
    layer = sum(op_ms(op, C, 2) for op in vidur.LAYER_OPS) * 1e-3
    lm_head = op_ms("mlp_up_proj", 1, 2) * 1e-3 * 32768 / (2 * 11008)
    want = 32 * (layer + 2 * ar) + op_ms("emb", C, 2) * 1e-3 + lm_head
    assert float(vidur.iteration_time(t2, C, D, attention=NO_ATTENTION)) == pytest.approx(want, rel=1e-12)


def test_a_linear_table_gives_the_closed_form_law(tmp_path):
    """Every operator linear in tokens and no attention: tau(C) is exactly alpha + beta C with
    beta = L * sum(layer slopes) + emb slope, and the held-out error is zero."""
    root = write_table(tmp_path)
    t = vidur.read_operator_table(root, "a100", MODEL, 1)
    v = vidur.fit_table(t, batch=16, attention=NO_ATTENTION)
    slope = (32 * len(vidur.LAYER_OPS) + 1) * 1e-6  # 1e-3 ms per token per operator, in s
    D = 15
    alpha = 32 * sum(op_ms(op, D, 1) for op in vidur.LAYER_OPS) * 1e-3 + op_ms("emb", D, 1) * 1e-3 \
        + op_ms("mlp_up_proj", D + 1, 1) * 1e-3 * 32768 / (2 * 11008)
    assert v.fit.beta == pytest.approx(slope, rel=1e-9)
    assert v.fit.alpha == pytest.approx(alpha, rel=1e-9)
    assert v.cv_max_error < 1e-9 and v.fit.r2 == pytest.approx(1.0)
    assert v.kv_time_per_token == pytest.approx(0.0, abs=1e-15)
    # decode-only: B decodes, no prefill row sampled
    solo = 32 * sum(op_ms(op, 16, 1) for op in vidur.LAYER_OPS) * 1e-3 + op_ms("emb", 16, 1) * 1e-3 \
        + op_ms("mlp_up_proj", 16, 1) * 1e-3 * 32768 / (2 * 11008)
    assert v.fit.tau_solo == pytest.approx(solo, rel=1e-12)


def test_kv_term_is_the_decode_roofline_slope(tmp_path):
    root = write_table(tmp_path)
    t = vidur.read_operator_table(root, "a100", MODEL, 1)
    v = vidur.fit_table(t, batch=8)
    a, spec = vidur.ATTENTION, vidur.GPUS["a100"]
    # per resident token: 32 layers x K and V x 32 heads x 128 channels x 2 bytes at 76% of 2.039 TB/s
    want = 32 * 2 * 32 * 128 * 2 / (a.decode_efficiency * spec.bandwidth)
    assert v.kv_time_per_token == pytest.approx(want, rel=1e-9)
    assert v.kv_time_per_token_ci[0] <= v.kv_time_per_token <= v.kv_time_per_token_ci[1]


def test_kv_capacity_is_memory_minus_weights_over_kv_bytes(tmp_path):
    root = write_table(tmp_path)
    t1 = vidur.read_operator_table(root, "a100", MODEL, 1)
    t2 = vidur.read_operator_table(root, "a100", MODEL, 2)
    per_token = 2 * 32 * 32 * 128 * 2  # K and V, 32 layers, 32 heads x 128, fp16: 524,288 bytes
    assert vidur.kv_capacity(t1) == pytest.approx((80e9 * 0.9 - 6.74e9 * 2) / per_token)
    assert vidur.kv_capacity(t2) == pytest.approx((80e9 * 0.9 - 6.74e9) / (per_token / 2))
    assert vidur.default_batch(vidur.kv_capacity(t1)) == 54  # 111,683 tokens / 2,048
    assert vidur.default_batch(1.0) == 1 and vidur.default_batch(1e9) == vidur.MAX_BATCH


def test_attention_roofline_closed_forms():
    a, spec = vidur.AttentionModel(1e-5, 0.5, 0.25, 2e-5, 0.8), vidur.GPUS["h100"]
    assert float(a.prefill(spec, 100, 300, 8, 128)) == pytest.approx(
        1e-5 + 2 * 100**2 * 128 * 8 / (0.5 * 989.4e12) + 4 * 100 * 300 * 128 * 8 / (0.25 * 989.4e12))
    assert float(a.decode(spec, 10, 500, 2, 128)) == pytest.approx(2e-5 + 2 * 10 * 500 * 128 * 2 * 2 / (0.8 * 3.35e12))
    assert float(a.prefill(spec, 0, 300, 8, 128)) == 0.0 and float(a.decode(spec, 0, 500, 2, 128)) == 0.0


def test_model_table_names_every_profiled_model():
    assert len(vidur.MODELS) == 8 and {g for g in vidur.GPUS} == {"a100", "a40", "h100"}
    assert vidur.profile_name("h100", "meta-llama/Llama-2-70b-hf", 4) == "h100-llama-2-70b-tp4"


def test_a_stand_in_layer_table_keeps_the_models_own_layers_and_vocabulary(tmp_path):
    """Llama-3-70B on h100 timed with Llama-2-70B's layer table: same per-layer times, 80 layers, and
    only the LM head differs, by the vocabulary ratio."""
    l3, l2 = "meta-llama/Meta-Llama-3-70B", "meta-llama/Llama-2-70b-hf"
    write_table(tmp_path, "a100", l3, vocab_size=128256)
    write_table(tmp_path, "h100", l2)
    with pytest.raises(CalibrationError, match=r"no table for h100; .*\(meta-llama/Llama-2-70b-hf has the same layer "
                                               r"shapes: --layers-from meta-llama/Llama-2-70b-hf\)"):
        vidur.read_operator_table(tmp_path, "h100", l3, 1)
    t3 = vidur.read_operator_table(tmp_path, "h100", l3, 1, layers_from=l2)
    t2 = vidur.read_operator_table(tmp_path, "h100", l2, 1)
    assert t3.model.layers == 80 and t3.model.vocab_size == 128256 and t3.model.params == 70.55e9
    assert t3.layers_from == l2 and t3.path == t2.path
    D = 31.0
    diff = float(vidur.iteration_time(t3, 700, D, attention=NO_ATTENTION) - vidur.iteration_time(t2, 700, D, attention=NO_ATTENTION))
    assert diff == pytest.approx(op_ms("mlp_up_proj", D + 1, 1) * 1e-3 * (128256 - 32768) / (2 * 11008), rel=1e-12)
    v = from_vidur(tmp_path, "h100", l3, 2, layers_from=l2, batch=4)
    assert v.name == "h100-llama-3-70b-tp2" and "Llama-2-70b-hf's table" in v.summary()


def test_a_stand_in_must_have_the_same_layer_shapes(tmp_path):
    write_table(tmp_path, "a100", "meta-llama/Meta-Llama-3-70B", n_kv_head=8)
    write_table(tmp_path, "h100", "meta-llama/Llama-2-70b-hf")
    with pytest.raises(CalibrationError, match=r"--layers-from 'meta-llama/Llama-2-70b-hf': its layers .* differ from "
                                               r"meta-llama/Meta-Llama-3-70B's \(32, 8, 4096"):
        from_vidur(tmp_path, "h100", "meta-llama/Meta-Llama-3-70B", 1, layers_from="meta-llama/Llama-2-70b-hf")
    assert vidur.stand_ins(tmp_path, "h100", "meta-llama/Meta-Llama-3-70B") == []


# -- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu, model, tp, match", [
    ("h200", MODEL, 1, r"--gpu 'h200'.*has a100"),
    ("a100", "meta-llama/Meta-Llama-3-70B", 1, r"--model 'meta-llama/Meta-Llama-3-70B'.*it has meta-llama/Llama-2-7b-hf"),
    ("a100", MODEL, 4, r"--tp 4: a100 meta-llama/Llama-2-7b-hf was profiled at tensor-parallel degrees 1, 2"),
])
def test_unknown_gpu_model_or_tp_names_what_exists(tmp_path, gpu, model, tp, match):
    root = write_table(tmp_path)
    with pytest.raises(CalibrationError, match=match):
        from_vidur(root, gpu, model, tp)


def test_a_folder_that_is_not_a_profiling_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CalibrationError, match=r"not a Vidur profiling folder.*found notes.txt"):
        vidur.available(tmp_path)
    with pytest.raises(CalibrationError, match="not a folder"):
        vidur.available(tmp_path / "missing")


def test_weights_that_do_not_fit_are_refused(tmp_path):
    root = write_table(tmp_path, model="meta-llama/Llama-2-70b-hf", tps=(1,))
    with pytest.raises(CalibrationError, match=r"weights \(138 GB\) do not fit in 1 x 80 GB"):
        from_vidur(root, "a100", "meta-llama/Llama-2-70b-hf", 1)


@pytest.mark.parametrize("argv, match", [
    (["--gpu", "h200", "--model", MODEL, "--tp", "1"], "--gpu 'h200': no operator tables for it; the folder has a100"),
    (["--gpu", "a100", "--model", "x/y", "--tp", "1"], "--model 'x/y': no table for a100; it has " + MODEL),
    (["--gpu", "a100", "--model", MODEL, "--tp", "3"], "--tp 3: a100 " + MODEL + " was profiled at"),
    (["--gpu", "a100", "--model", MODEL], "--vidur needs --tp"),
])
def test_cli_bad_input_exits_2_naming_what_exists(tmp_path, capsys, argv, match):
    root = write_table(tmp_path)
    assert main(["calibrate", "--vidur", str(root), *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_on_a_folder_that_is_not_a_profiling_directory(tmp_path, capsys):
    assert main(["calibrate", "--vidur", str(tmp_path), "--gpu", "a100", "--model", MODEL, "--tp", "1"]) == 2
    assert "not a Vidur profiling folder" in capsys.readouterr().err


def test_cli_json_equals_the_library(tmp_path, capsys):
    root = write_table(tmp_path)
    assert main(["calibrate", "--vidur", str(root), "--gpu", "a100", "--model", MODEL, "--tp", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    v = from_vidur(root, "a100", MODEL, 2)
    assert d["alpha"] == v.fit.alpha and d["beta"] == v.fit.beta and d["kv_capacity"] == v.kv_capacity
    assert d["profile"] == "a100-llama-2-7b-tp2" and d["tp"] == 2 and d["data_sha256"] == v.table.sha256


def test_cli_toml_is_a_valid_gpu_table(tmp_path, capsys):
    from fluidopt.scenario import gpu_from_dict

    root = write_table(tmp_path)
    argv = ["calibrate", "--vidur", str(root), "--gpu", "a100", "--model", MODEL, "--tp", "1", "--toml", "--batch", "8"]
    assert main(argv) == 0
    g = gpu_from_dict(tomllib.loads(capsys.readouterr().out)["gpu"])
    assert g == from_vidur(root, "a100", MODEL, 1, batch=8).to_profile() and g.batch == 8 and g.chunk == 1024


def test_cli_rejects_vidur_flags_without_vidur(capsys):
    assert main(["calibrate", "--gpu", "h100"]) == 2
    assert "--gpu: only with --vidur DIR" in capsys.readouterr().err


# -- the shipped library ----------------------------------------------------------------------------
GENERATED = [n for n in profile_names() if profile_info(n).get("data_file")]


def test_library_holds_the_generated_profiles_with_provenance():
    assert len(GENERATED) == 60
    stand_ins = sorted(n for n in GENERATED if profile_info(n).get("layers_from"))
    assert stand_ins == ["a40-llama-3-70b-tp4", "a40-llama-3-70b-tp8", "h100-llama-3-70b-tp2", "h100-llama-3-70b-tp4",
                         "h100-llama-3-70b-tp8"]
    assert all(profile_info(n)["layers_from"] == "meta-llama/Llama-2-70b-hf" for n in stand_ins)
    for n in GENERATED:
        info, g = profile_info(n), load_profile(n)
        assert info["alpha_ci"][0] <= g.alpha <= info["alpha_ci"][1]
        assert info["beta_ci"][0] <= g.beta <= info["beta_ci"][1]
        assert g.kv_capacity > 0 and g.kv_time_per_token > 0 and info["gpus"] == int(n.rsplit("-tp", 1)[1])
        assert len(info["data_sha256"]) == 64 and info["data_file"].endswith("/mlp.csv") and info["r2"] > 0.96
    df = list_profiles()
    assert {"qwen-8b-a100", "h100-llama-2-70b-tp4", "a100-llama-3-70b-tp4"} <= set(df.index)
    assert df.loc["h100-llama-3-70b-tp2", "cv_max_error"] == df["cv_max_error"].max()
    assert df.loc["a100-llama-3-70b-tp4", "gpus"] == 4 and df.loc["qwen-8b-a100", "gpus"] == 1


def test_list_shows_the_generated_profiles(capsys):
    assert main(["calibrate", "--list"]) == 0
    out = capsys.readouterr().out
    assert "h100-llama-2-70b-tp4" in out and "gpus per replica" in out
    assert main(["calibrate", "--list", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d) == 63 and d["a40-llama-2-70b-tp8"]["gpus"] == 8 and d["qwen-8b-a100"]["cv_max_error"] is None


def test_h100_over_a100_beta_ratio_matches_the_spec_sheets():
    """beta(A100) / beta(H100) between 1.5 and 3.5 for every model and TP degree profiled on both
    (peak fp16 ratio 3.2, bandwidth ratio 1.6)."""
    ratios = {}
    for n in GENERATED:
        if n.startswith("h100-") and f"a100-{n[5:]}" in GENERATED:
            ratios[n[5:]] = load_profile(f"a100-{n[5:]}").beta / load_profile(n).beta
    assert len(ratios) == 20  # 17 measured on both, 3 with H100's Llama-3-70B a stand-in
    assert all(1.5 <= r <= 3.5 for r in ratios.values()), ratios
    assert min(ratios.values()) == pytest.approx(2.15, abs=0.01) and max(ratios.values()) == pytest.approx(3.45, abs=0.01)


def test_cross_validation_median_within_5_percent_and_the_worst_case():
    cv = {n: (profile_info(n)["cv_median_error"], profile_info(n)["cv_max_error"]) for n in GENERATED}
    assert max(m for m, _ in cv.values()) <= 0.05
    worst = max(cv, key=lambda n: cv[n][1])
    assert worst == "h100-llama-3-70b-tp2" and cv[worst][1] == pytest.approx(0.218, abs=0.002)
    measured = max((n for n in cv if not profile_info(n).get("layers_from")), key=lambda n: cv[n][1])
    assert measured == "h100-llama-2-70b-tp2" and cv[measured][1] == pytest.approx(0.153, abs=0.002)
    assert sum(m <= 0.05 for _, m in cv.values()) == 8 and sum(m <= 0.10 for _, m in cv.values()) == 47


def test_a_named_profile_in_a_scenario_and_plan_compares_two_gpus(capsys):
    from fluidopt.scenario import default_scenario, scenario_from_dict, scenario_to_dict

    d = scenario_to_dict(default_scenario())
    d["gpu"] = "h100-llama-2-70b-tp4"
    sc = scenario_from_dict(d)
    assert sc.gpu == load_profile("h100-llama-2-70b-tp4") and sc.gpu.kv_capacity > 4e5
    argv = ["plan", "--profiles", "h100-llama-2-70b-tp4,a100-llama-2-70b-tp4", "--price", "h100=4",
            "--price", "a100=2", "--fluid-only", "--json"]
    assert main(argv) == 0
    rows = {r["profile"]: r for r in json.loads(capsys.readouterr().out)["fleets"]}
    tokens_per_hour = (250 * 1000 + 250 * 400) * 3600 * 0.99
    for name, price in (("h100-llama-2-70b-tp4", 4 * 4), ("a100-llama-2-70b-tp4", 2 * 4)):
        r = rows[name]
        assert r["price_per_gpu_hour"] == price
        assert r["cost_per_hour"] == pytest.approx(r["n_fluid_int"] * price)
        assert r["cost_per_million_output_tokens"] == pytest.approx(r["cost_per_hour"] / tokens_per_hour * 1e6, rel=0.02)
    assert rows["h100-llama-2-70b-tp4"]["n_fluid_int"] < rows["a100-llama-2-70b-tp4"]["n_fluid_int"]


def test_plan_compares_h100_and_a100_for_llama_3_70b(capsys):
    """The issue's own example; H100's Llama-3-70B profile is a stand-in (Llama-2-70B's layer table)."""
    argv = ["plan", "--profiles", "h100-llama-3-70b-tp4,a100-llama-3-70b-tp4", "--price", "h100=4", "--price",
            "a100=2", "--fluid-only", "--json"]
    assert main(argv) == 0
    rows = {r["profile"]: r for r in json.loads(capsys.readouterr().out)["fleets"]}
    assert rows["h100-llama-3-70b-tp4"]["n_fluid_int"] == 108 and rows["a100-llama-3-70b-tp4"]["n_fluid_int"] == 255
    assert rows["h100-llama-3-70b-tp4"]["cost_per_hour"] == 108 * 16 and rows["a100-llama-3-70b-tp4"]["cost_per_hour"] == 255 * 8


def test_plan_table_shows_both_gpus_in_one_table(capsys):
    argv = ["plan", "--profiles", "h100-llama-2-70b-tp4,a100-llama-2-70b-tp4", "--price", "h100=4",
            "--price", "a100-llama-2-70b-tp4=2", "--fluid-only"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.strip().startswith(("h100-llama", "a100-llama"))]
    assert len(lines) == 2 and "cost/h" in out and "cost/M out tok" in out and "one replica of 4 GPUs" in out


@pytest.mark.parametrize("price, match", [
    ("h200=3", "'h200' matches none of the --profiles"), ("h100", "expected KEY=DOLLARS"),
    ("h100=-1", "expected KEY=DOLLARS"), ("h100=x", "expected KEY=DOLLARS"),
])
def test_plan_bad_prices_exit_2(capsys, price, match):
    assert main(["plan", "--profiles", "h100-llama-2-70b-tp4", "--price", price, "--fluid-only"]) == 2
    assert match in capsys.readouterr().err


# -- against the published data ---------------------------------------------------------------------
@needs_data
def test_shipped_profiles_equal_a_regeneration():
    text = (ROOT / "calibration" / "profiles.toml").read_text(encoding="utf-8")
    generated, skipped = vidur.render_profiles(DATA)
    assert vidur.splice_profiles(text, generated) == text
    assert len(skipped) == 19 and sum("weights do not fit" in s for s in skipped) == 15
    assert len(tomllib.loads(text)) == 3 + 60


@needs_data
def test_attention_roofline_against_the_a100_profile():
    """Held-out rows (odd positions) of the older A100 attention profile: the fitted-efficiency
    roofline is within 20% in median per phase; the bare roofline at peak is far off."""
    v = vidur.validate_attention(DATA)
    assert v.n_prefill == 2209 and v.n_decode == 5120
    assert v.prefill_median_abs == pytest.approx(0.0773, abs=0.001) and v.prefill_median_abs < 0.20
    assert v.decode_median_abs == pytest.approx(0.0934, abs=0.001) and v.decode_median_abs < 0.20
    assert abs(v.prefill_median) < 0.01 and abs(v.decode_median) < 0.02
    bare = vidur.validate_attention(DATA, vidur.PEAK_ROOFLINE)
    assert bare.prefill_median == pytest.approx(-0.769, abs=0.001)
    assert bare.decode_median == pytest.approx(-0.368, abs=0.001)


@needs_data
def test_shipped_attention_constants_are_the_refit_rounded():
    fit = vidur.fit_attention(DATA)
    for name in ("prefill_launch", "causal_efficiency", "prefix_efficiency", "decode_launch", "decode_efficiency"):
        assert getattr(vidur.ATTENTION, name) == pytest.approx(getattr(fit, name), rel=5e-4), name


@needs_data
def test_geometry_params_match_the_published_counts():
    for gpu, models in vidur.available(DATA).items():
        for model in models:
            m = vidur.read_operator_table(DATA, gpu, model, 1).model
            assert m.params_from_geometry() == pytest.approx(m.params, rel=0.02), model


@needs_data
def test_error_lists_the_models_each_gpu_has():
    with pytest.raises(CalibrationError, match=r"no table for h100; it has Qwen/Qwen-72B, .*microsoft/phi-2 "
                                               r"\(meta-llama/Llama-2-70b-hf has the same layer shapes"):
        from_vidur(DATA, "h100", "meta-llama/Meta-Llama-3-70B", 4)


@needs_data
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_the_llama_2_70b_stand_in_on_a100_where_both_are_measured(tp):
    """What the notes of the stand-in profiles claim: on A100, Llama-3-70B timed with Llama-2-70B's
    layer table has beta within 1.6% and tau_solo within 1.4% of the fit on its own table."""
    own = from_vidur(DATA, "a100", "meta-llama/Meta-Llama-3-70B", tp)
    alt = from_vidur(DATA, "a100", "meta-llama/Meta-Llama-3-70B", tp, layers_from="meta-llama/Llama-2-70b-hf")
    assert abs(alt.fit.beta / own.fit.beta - 1) < 0.016
    assert abs(alt.fit.tau_solo / own.fit.tau_solo - 1) < 0.014
    assert abs(alt.fit.tau_mix(1024) / own.fit.tau_mix(1024) - 1) < 0.016
    assert alt.kv_time_per_token == pytest.approx(own.kv_time_per_token, rel=1e-12)


@needs_data
@pytest.mark.integration
def test_cli_vidur_summary_and_plot(tmp_path, capsys):
    png = tmp_path / "fit.png"
    argv = ["calibrate", "--vidur", str(DATA), "--gpu", "h100", "--model", "meta-llama/Llama-2-70b-hf", "--tp", "4",
            "--plot", str(png)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "h100-llama-2-70b-tp4" in out and "alpha (s)" in out and "kv_time_per_token" in out
    assert "cross-validation at 24 held-out chunk sizes" in out and png.read_bytes()[:4] == b"\x89PNG"
    g = load_profile("h100-llama-2-70b-tp4")
    v = from_vidur(DATA, "h100", "meta-llama/Llama-2-70b-hf", 4)
    assert v.fit.alpha == pytest.approx(g.alpha, rel=1e-5) and v.fit.beta == pytest.approx(g.beta, rel=1e-5)
    assert math.isclose(v.kv_capacity, g.kv_capacity, abs_tol=1)
    assert np.isfinite(v.fit.alpha_se)
