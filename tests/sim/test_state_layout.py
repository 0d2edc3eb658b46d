"""The compiled core's row layout (fluidopt.sim.state): a new per-request field needs no slot count edited."""

from __future__ import annotations

import math

import numpy as np

from fluidopt.sim import state as S


def test_rows_grow_by_whole_cache_lines_with_their_fields():
    assert (S.REQUEST_ROW, S.GPU_ROW) == (24, 16)  # the layout docs/simulator.md section 9 describes
    assert [S.row_slots(range(k)) for k in (1, 8, 9, 16, 24, 25, 32, 33)] == [8, 8, 16, 16, 24, 32, 32, 40]
    extra = S.REQUEST_FIELDS + (("r_new", float, math.nan, "a new per-request field"),)
    fill = {**S.REQUEST_FILL, "r_new": math.nan}
    old = S.rows(extra, S.row_slots(extra), 3, fill)  # a run's rows, grown below as the engine grows them
    old["r_cls"][:] = [2, 0, 1]
    new = S.rows(extra, S.row_slots(extra), 5, fill, old=old)
    assert new.dtype.itemsize == 256 and new.ctypes.data % S.ROW_ALIGN == 0
    assert list(new["r_cls"]) == [2, 0, 1, 0, 0] and np.isnan(new["r_new"]).all()
    assert list(new["r_phase"][3:]) == [S.REQUEST_FILL["r_phase"]] * 2


def test_every_record_field_has_its_named_offset_and_the_engine_writes_each_once():
    """A finished request's row is written by name (metrics.REC_<NAME>), one field per name, in one place."""
    import inspect

    from fluidopt.sim import metrics as M
    from fluidopt.sim.engine import Engine

    offsets = {nm: getattr(M, f"REC_{nm.upper()}") for nm in M.RECORD_FIELDS}
    assert sorted(offsets.values()) == list(range(M.N_RECORD_FIELDS))
    assert all(M.RECORD_FIELDS[k] == nm for nm, k in offsets.items())
    src = inspect.getsource(Engine._write_record)
    for nm in M.RECORD_FIELDS:
        assert src.count(f"_rec[k + REC_{nm.upper()}]") == 1, nm
