"""Refusals of fluidopt/calibration/vidur.py on a tiny synthetic operator table (``test_vidur.py``'s
``write_table``): a cell that is not a number is named by its line in the file, column and value, and a
model with a table but no geometry lists the models that have one. Imports use the former module names
(``fluidopt.vidur``), which work before and after the package move."""

from __future__ import annotations

import pandas as pd
import pytest
from fluidopt.errors import CalibrationError

from fluidopt import vidur

from .test_vidur import MODEL, write_table


@pytest.mark.parametrize("value", ["abc", "1.5 ms"])
def test_a_cell_that_is_not_a_number_is_named_by_its_line_column_and_value(tmp_path, value):
    root = write_table(tmp_path, tps=(1,))
    path = root / "compute" / "a100" / MODEL / "mlp.csv"
    d = pd.read_csv(path)
    col = "time_stats.mlp_up_proj.median"
    d[col] = d[col].astype(object)
    d.loc[1, col] = value  # the second data row: line 3 of the file, under the header
    d.to_csv(path, index=False)
    with pytest.raises(CalibrationError) as e:
        vidur.read_operator_table(root, "a100", MODEL, 1)
    assert str(e.value) == f"{path}: row 3: {col} = {value!r}: expected a finite number"


def test_a_model_with_a_table_but_no_geometry_lists_the_known_models(tmp_path):
    root = write_table(tmp_path, model="acme/unknown-7b", tps=(1,))
    with pytest.raises(CalibrationError) as e:
        vidur.read_operator_table(root, "a100", "acme/unknown-7b", 1)
    msg = str(e.value)
    assert msg.startswith("--model 'acme/unknown-7b': no geometry (layers, parameters) in ")
    known = msg.split("; known: ", 1)[1].split(", ")
    assert known == list(vidur.MODELS) and MODEL in known and len(known) > 1
