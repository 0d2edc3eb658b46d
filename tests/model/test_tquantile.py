"""fluidopt.core.tquantile: the tables are scipy's stdtrit bit for bit, the rest goes to scipy, and the
reporting modules no longer import scipy (which, beside Pyomo, drags in scipy.stats)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.special import stdtrit

from fluidopt.core.tquantile import TABLES, t_quantile

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("p", sorted(TABLES))
def test_every_table_entry_is_scipys_stdtrit_bit_for_bit(p):
    table = TABLES[p]
    assert len(table) == 100
    differ = [(df, table[df - 1], float(stdtrit(df, p))) for df in range(1, 101)
              if table[df - 1] != float(stdtrit(df, p))]
    # on a scipy whose stdtrit moved by an ulp, regenerate the tables (repr of each value) from it
    assert not differ, differ[:3]
    assert [t_quantile(df, p) for df in range(1, 101)] == list(table)


def test_closed_forms_of_one_and_two_degrees_of_freedom():
    # df 1 is the Cauchy distribution: F^-1(p) = tan(pi (p - 1/2)); df 2: (2p - 1) / sqrt(2 p (1 - p))
    for p in (0.975, 0.95):
        assert t_quantile(1, p) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-13)
        assert t_quantile(2, p) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-13)
    # large df tends to the normal quantile (1.959964 at 0.975), from above
    assert 1.959964 < t_quantile(100, 0.975) < t_quantile(99, 0.975) < 1.99


@pytest.mark.parametrize("df, p", [(101, 0.975), (1999, 0.975), (150, 0.95), (5, 0.9), (5, 0.995),
                                   (np.int64(5), 0.975), (2.5, 0.975), (True, 0.975)])
def test_outside_the_tables_scipy_answers(df, p):
    assert t_quantile(df, p) == float(stdtrit(df, p))
    assert isinstance(t_quantile(df, p), float)


@pytest.mark.parametrize("df", [0, -1])
def test_no_degrees_of_freedom_is_nan_as_scipy_says(df):
    assert math.isnan(t_quantile(df, 0.975)) and math.isnan(float(stdtrit(df, 0.975)))


def test_the_modules_that_report_intervals_import_no_scipy():
    # one subprocess (about 0.7 CPU-s): the point of the tables is that a command's process never loads scipy
    code = ("import sys\n"
            "import fluidopt.sim.metrics, fluidopt.harness.comparison, fluidopt.rl.evaluate, fluidopt.planning.fleet\n"
            "from fluidopt.core.tquantile import t_quantile\n"
            "t_quantile(19, 0.975); t_quantile(4, 0.95)\n"
            "print(sorted(m for m in sys.modules if m == 'scipy' or m.startswith('scipy.')))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
