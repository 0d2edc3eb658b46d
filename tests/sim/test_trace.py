"""Trace loaders: the real Azure conversation trace end to end, the generic CSV, and bad files."""

from __future__ import annotations

import csv
import math
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from fluidopt.core.errors import TraceError
from fluidopt.core.model import Scenario, paper_gpu
from fluidopt.workloads import TraceWarning, TraceWorkload, collect
from fluidopt.workloads.traces import (
    assign_classes,
    classes_from_trace,
    load_azure_trace,
    load_trace_csv,
    read_azure_trace,
    read_trace_csv,
    summarize_trace,
)

AZURE = Path(__file__).resolve().parents[3] / "shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv"
needs_azure = pytest.mark.skipif(not AZURE.is_file(), reason=f"shared Azure trace not found at {AZURE}")

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def azure_rows(n: int = 30) -> list[str]:
    return [f"2023-11-16 18:15:{10 + i // 10:02d}.{i % 10}000000,{100 + i},{5 + i}\n" for i in range(n)]


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# --- the real trace -------------------------------------------------------------------------------


def parse_independently(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """csv module + manual split of the 7-digit fraction (datetime's %f takes at most 6)."""
    t, p, o = [], [], []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            whole, frac = row["TIMESTAMP"].split(".")
            base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
            t.append(base.timestamp() + int(frac) / 10 ** len(frac))
            p.append(int(row["ContextTokens"]))
            o.append(int(row["GeneratedTokens"]))
    t = np.array(t)
    return t - t.min(), np.array(p), np.array(o)


@needs_azure
def test_azure_trace_replays_end_to_end():
    w = load_azure_trace(AZURE)
    assert w.n_requests == 19_366 and w.notes == ()
    t, p, o = parse_independently(AZURE)
    b = collect(w, None, math.inf, size=4096)  # the whole trace through the simulator interface
    assert len(b) == 19_366 and b.time[0] == 0.0 and np.all(np.diff(b.time) >= 0)
    assert np.allclose(b.time, t, atol=2e-6)
    assert b.time[1] == pytest.approx(4.314579, abs=1e-6)  # 18:15:50.9951690 - 18:15:46.6805900
    assert np.array_equal(b.prompt, p) and np.array_equal(b.output, o)
    assert w.duration == pytest.approx(3501.721937, abs=1e-5)
    # default classes: thresholds at the medians (1020 prompt, 129 output tokens)
    assert w.class_names == (
        "short-prompt/short-output", "short-prompt/long-output", "long-prompt/short-output", "long-prompt/long-output"
    )
    long_p = b.prompt > np.median(p)
    long_o = b.output > np.median(o)
    assert np.array_equal(b.cls, 2 * long_p + long_o)
    # speedup doubles the rate; a finite horizon clips
    fast = load_azure_trace(AZURE, speedup=2.0, max_requests=1000)
    assert fast.n_requests == 1000 and np.allclose(fast.time, t[:1000] / 2, atol=1e-6)
    assert len(collect(fast, None, 10.0)) == int((t[:1000] / 2 < 10.0).sum())


@needs_azure
def test_classes_from_the_azure_trace():
    w = load_azure_trace(AZURE)
    rc = classes_from_trace(w, patience=0.05)
    s = summarize_trace(w)
    assert [c.name for c in rc] == list(w.class_names) == list(s["class"])
    n = s["requests"].to_numpy()
    assert n.sum() == 19_366
    # rates add up to the trace's rate; request-weighted means give the overall means
    assert sum(c.rate for c in rc) == pytest.approx(19_366 / w.duration, rel=1e-12)
    assert np.dot(n, [c.prompt for c in rc]) / n.sum() == pytest.approx(w.prompt.mean(), rel=1e-12)
    assert np.dot(n, [c.decode for c in rc]) / n.sum() == pytest.approx(w.output.mean(), rel=1e-12)
    assert w.prompt.mean() == pytest.approx(1154.697, abs=1e-3) and w.output.mean() == pytest.approx(211.126, abs=1e-3)
    sc = Scenario(gpu=paper_gpu(), gpus=10, classes=tuple(rc))
    assert np.allclose(sc.rates().lam * 10, [c.rate for c in rc])
    logn = classes_from_trace(w, lengths="lognormal")
    assert all(c.lengths == "lognormal" and c.prompt_sigma > 0 for c in logn)


@needs_azure
def test_kmeans_classes_are_deterministic_and_ordered():
    a = load_azure_trace(AZURE, classes="kmeans", k=3, seed=1)
    b = load_azure_trace(AZURE, classes="kmeans", k=3, seed=1)
    assert np.array_equal(a.cls, b.cls) and a.class_names == ("cluster-0", "cluster-1", "cluster-2")
    logp = [np.log(a.prompt[a.cls == j]).mean() for j in range(3)]
    assert logp == sorted(logp)
    assert all(np.any(a.cls == j) for j in range(3))


# --- class rules on small data --------------------------------------------------------------------


def test_threshold_rule_given_thresholds_and_one_axis(tmp_path):
    df = read_azure_trace(write(tmp_path, HEADER + "".join(azure_rows(30))))
    codes, names = assign_classes(df, "thresholds", prompt_threshold=110, output_threshold=None)
    assert names == ("short-prompt", "long-prompt")
    assert np.array_equal(codes, (df["prompt"].to_numpy() > 110).astype(int))
    codes, names = assign_classes(df, "thresholds", prompt_threshold=1e9, output_threshold=1e9)
    assert names == ("short-prompt/short-output",) and np.all(codes == 0)  # empty classes dropped
    codes, names = assign_classes(df, lambda d: np.where(d["output"] % 2 == 0, "even", "odd"))
    assert names == ("odd", "even") and codes[0] == 0
    with pytest.raises(TraceError, match="classes: expected 'thresholds'"):
        assign_classes(df, "by-size")
    with pytest.raises(TraceError, match="k = 31: expected at most"):
        assign_classes(df, "kmeans", k=31)


# --- generic CSV ----------------------------------------------------------------------------------


def test_generic_csv_numeric_times_and_classes(tmp_path):
    text = "time,prompt_tokens,output_tokens,class\n10.5,100,20,chat\n11.0,3000,400,rag\n12.25,50,9,chat\n"
    w = load_trace_csv(write(tmp_path, text))
    assert isinstance(w, TraceWorkload) and w.class_names == ("chat", "rag")
    assert w.time.tolist() == [0.0, 0.5, 1.75] and w.cls.tolist() == [0, 1, 0]
    rc = classes_from_trace(w)
    assert rc[0].prompt == 75 and rc[0].rate == pytest.approx(2 / 1.75)


def test_generic_csv_iso_times_no_class_column(tmp_path):
    text = "time,prompt_tokens,output_tokens\n2024-05-01T00:00:00Z,1,1\n2024-05-01T00:00:02.5Z,2,2\n"
    w = load_trace_csv(write(tmp_path, text))
    assert w.class_names == ("all",) and w.time.tolist() == [0.0, 2.5]


def test_unsorted_rows_are_sorted_with_a_note_or_rejected(tmp_path):
    text = "time,prompt_tokens,output_tokens\n0,1,1\n5,2,2\n3,3,3\n"
    p = write(tmp_path, text)
    with pytest.warns(TraceWarning, match=r"row 3 \(line 4\): time is earlier"):
        w = load_trace_csv(p)
    assert w.time.tolist() == [0.0, 3.0, 5.0] and w.prompt.tolist() == [1, 3, 2]
    assert any("sorted" in n for n in w.notes)
    with pytest.raises(TraceError, match=r"row 3 \(line 4\).*sort=True"):
        read_trace_csv(p, sort=False)


def test_zero_tokens_are_raised_to_one(tmp_path):
    p = write(tmp_path, HEADER + "2023-11-16 18:15:46.6805900,0,0\n2023-11-16 18:15:47.0,5,0\n")
    with pytest.warns(TraceWarning) as rec:
        w = load_azure_trace(p, classes="single")
    assert sorted(str(r.message) for r in rec) == [
        "t.csv: 1 row(s) with 0 prompt tokens raised to 1", "t.csv: 2 row(s) with 0 output tokens raised to 1"
    ]
    assert w.prompt.tolist() == [1, 5] and w.output.tolist() == [1, 1] and len(w.notes) == 2


def test_blank_lines_are_skipped_and_rows_keep_their_line_numbers(tmp_path):
    rows = azure_rows(5)
    rows[3] = "2023-11-16 18:15:46.6805900,12x,5\n"
    text = HEADER + rows[0] + "\n" + "".join(rows[1:])
    with pytest.raises(TraceError, match=r"row 5 \(line 6\): ContextTokens = '12x'"):
        read_azure_trace(write(tmp_path, text))
    ok = read_azure_trace(write(tmp_path, HEADER + rows[0] + "\n" + "".join(rows[1:3])))
    assert len(ok) == 3 and ok["row"].tolist() == [1, 3, 4]


# --- bad files: errors name the row ---------------------------------------------------------------


def bad_row(tmp_path: Path, row: int, line: str) -> Path:
    rows = azure_rows(30)
    rows[row - 1] = line + "\n"
    return write(tmp_path, HEADER + "".join(rows))


@pytest.mark.parametrize(
    "line,message",
    [
        ("2023-11-16 18:15:46.6805900,-3,10", "t.csv: row 17 (line 18): ContextTokens = '-3': expected a non-negative integer"),
        ("2023-11-16 18:15:46.6805900,12,many", "row 17 (line 18): GeneratedTokens = 'many': expected a non-negative integer"),
        ("2023-11-16 18:15:46.6805900,12.5,3", "row 17 (line 18): ContextTokens = '12.5': expected a non-negative integer"),
        ("2023-11-16 18:15:46.6805900,,3", "row 17 (line 18): ContextTokens = '': expected"),
        ("yesterday,12,3", "row 17 (line 18): TIMESTAMP = 'yesterday': expected a timestamp"),
        ("2023-13-45 18:15:46,12,3", "row 17 (line 18): TIMESTAMP = '2023-13-45 18:15:46'"),
        ("2023-11-16 18:15:46.6805900,12", "row 17 (line 18): GeneratedTokens = ''"),
        ("2023-11-16 18:15:46.6805900,12,3,9", "row 17 (line 18): 4 fields, expected 3"),
    ],
)
def test_bad_azure_rows_are_named(tmp_path, line, message):
    with pytest.raises(TraceError) as e:
        load_azure_trace(bad_row(tmp_path, 17, line))
    assert message in str(e.value)


def test_error_counts_further_bad_rows(tmp_path):
    rows = azure_rows(30)
    for r in (4, 9, 20):
        rows[r - 1] = f"2023-11-16 18:15:46.6805900,-{r},3\n"
    with pytest.raises(TraceError, match=r"row 4 \(line 5\).*2 more bad row\(s\) in this column: 9, 20"):
        read_azure_trace(write(tmp_path, HEADER + "".join(rows)))


@pytest.mark.parametrize(
    "text,message",
    [
        ("", "t.csv: empty file: expected a header line with columns TIMESTAMP, ContextTokens, GeneratedTokens"),
        (HEADER, "t.csv: no data rows"),
        (HEADER + "\n\n", "t.csv: no data rows"),
        (
            "TIMESTAMP,Context,GeneratedTokens\n2023-11-16 18:15:46,1,1\n",
            "t.csv: missing column(s) ContextTokens; found TIMESTAMP, Context, GeneratedTokens",
        ),
        ("time,tokens\n1,2\n", "missing column(s) TIMESTAMP, ContextTokens, GeneratedTokens; found time, tokens"),
    ],
)
def test_bad_azure_files(tmp_path, text, message):
    with pytest.raises(TraceError) as e:
        read_azure_trace(write(tmp_path, text))
    assert message in str(e.value)


def test_missing_file_and_header_case(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        read_azure_trace(tmp_path / "absent.csv")
    p = write(tmp_path, "timestamp, contexttokens ,GENERATEDTOKENS\n2023-11-16 18:15:46.6805900,7,8\n")
    assert read_azure_trace(p)[["prompt", "output"]].to_numpy().tolist() == [[7, 8]]


@pytest.mark.parametrize(
    "text,message",
    [
        ("time,prompt_tokens,output_tokens\n0,1,1\nsoon,1,1\n", "row 2 (line 3): time = 'soon': expected a time in seconds"),
        ("time,prompt_tokens,output_tokens\n0,1,1\ninf,1,1\n", "row 2 (line 3): time = 'inf'"),
        ("time,prompt_tokens,output_tokens,class\n0,1,1,a\n1,1,1,\n", "row 2 (line 3): class = '': expected a class name"),
        ("time,prompt_tokens,output_tokens\n0,-1,1\n", "row 1 (line 2): prompt_tokens = '-1'"),
        ("time,prompt,output\n0,1,1\n", "missing column(s) prompt_tokens, output_tokens; found time, prompt, output"),
    ],
)
def test_bad_generic_csv(tmp_path, text, message):
    with pytest.raises(TraceError) as e:
        load_trace_csv(write(tmp_path, text))
    assert message in str(e.value)
