"""What the results store's hand-written JSON-lines reader keeps that pandas.read_json(lines=True) does not
(docs/scaling.md, "Libraries, and what is kept by hand"): every double bit for bit, NaN, ints and None as
written, keys as strings, and the whole lines before a torn one."""

from __future__ import annotations

import math
import struct

from fluidopt.core.files import lock_folder
from fluidopt.harness.executor import ResultStore

# doubles that read_json rounds (1/3, the largest, the smallest normal, the smallest subnormal) or cannot
# read with precise_float=True (subnormals), and the signed zero, whose sign a rounding parser may drop
DOUBLES = [1 / 3, 1.7976931348623157e308, 2.2250738585072014e-308, 5e-324, 1e-320, -0.0, 0.1 + 0.2]


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def test_every_double_reads_back_bit_for_bit_and_nan_none_ints_stay(tmp_path):
    st = ResultStore(tmp_path)
    st.append("0012", {"row": {f"x{i}": v for i, v in enumerate(DOUBLES)}})
    st.append("1e5", {"row": {"nan": float("nan"), "inf": float("inf"), "ninf": float("-inf"), "none": None,
                              "n": 7, "big": 2**62 + 1}})
    got = ResultStore(tmp_path).load()
    assert list(got) == ["0012", "1e5"]  # keys that look like numbers stay strings
    row = got["0012"]["row"]
    assert [_bits(row[f"x{i}"]) for i in range(len(DOUBLES))] == [_bits(v) for v in DOUBLES]
    r = got["1e5"]["row"]
    assert math.isnan(r["nan"]) and r["inf"] == math.inf and r["ninf"] == -math.inf and r["none"] is None
    assert type(r["n"]) is int and r["n"] == 7 and r["big"] == 2**62 + 1  # not via a double (2**62 + 1 is not one)


def test_a_torn_line_keeps_the_whole_lines_before_it_and_the_holder_cuts_the_rest(tmp_path):
    st = ResultStore(tmp_path)
    st.append("a", {"v": 1.5})
    st.append("b", {"v": 2.5})
    whole = st.path.stat().st_size
    with open(st.path, "ab") as fh:  # a crash mid-append, then a line appended by a writer that did not cut it
        fh.write(b'{"key":"c","result":{"v":')
    st.append("d", {"v": 4.5})
    assert ResultStore(tmp_path).load() == {"a": {"v": 1.5}, "b": {"v": 2.5}}
    with lock_folder(tmp_path):
        assert ResultStore(tmp_path).load() == {"a": {"v": 1.5}, "b": {"v": 2.5}}
    assert st.path.stat().st_size == whole  # cut back to the last whole line
