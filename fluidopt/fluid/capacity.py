"""The capacity LP: the fewest GPUs for which the fluid model has an operating point meeting the SLIs.

The per-GPU fluid LP (docs/lp.md) at a fleet of n GPUs, multiplied through by n, is linear in n and
in the cluster-level variables X_i = n x_i (GPUs prefilling class i), Ym_i = n y_mixed,i,
Ys_i = n y_solo,i, Qp_i = n q_prefill,i (requests waiting), with the cluster arrival rates Lambda_i
fixed. So "the smallest n with a feasible point" is one LP with n as a variable (minimise n), not a
bisection. Rows (same names as the per-GPU LP's)::

    prefill_capacity        sum_i X_i - n                               <= 0
    mixed_decode_capacity   sum_i Ym_i - (B-1) sum_i X_i                <= 0
    solo_decode_capacity    sum_i Ys_i + B sum_i X_i - B n              <= 0
    prefill_balance[i]      mu_p,i X_i + theta_i Qp_i                   == Lambda_i
    decode_balance[i]       mu_p,i X_i - mu_m,i Ym_i - mu_s,i Ys_i      == 0     (no decode buffer: SLIs)
    served_fraction[i]      (mu_p,i / Lambda_i) X_i                     >= s_i
    prefill_wait[i]         Qp_i / Lambda_i                             <= W_i   (seconds)
    tpot                    tpot_coef sum_i X_i - tpot_rhs n            <= 0
    prefill_fairness        X_i <= hi, lo <= X_i, hi - lo - eta n       <= 0     (and decode_fairness on Ys)

The SLI rows are not written here: each SLI's ``rows`` (fluidopt/fluid/sli.py), taken on the cluster's
rates (lam = Lambda_i), are homogenised by n (their ``rhs_per_gpu`` part times n moves to the left).
Every SLI is taken as hard here (a penalty weight is ignored: a capacity plan meets its SLIs).
Feasibility is monotone in n (more GPUs never hurt: keep the same point), so the integer answer is
ceil(n*). The duals of the optimum say which rows bind: d n* / d rhs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from fluidopt.core.errors import InfeasibleError, ScenarioError
from fluidopt.core.model import Scenario
from fluidopt.fluid.sli import SLI, MinServedFraction, RowData, sli_spec, validate_slis

__all__ = ["FleetBound", "fluid_fleet_bound", "check_slis_attainable"]


@dataclass(frozen=True)
class FleetBound:
    """The fluid lower bound on the fleet size for a demand and SLIs.

    ``gpus``: n*, the fewest GPUs (continuous) with a feasible fluid operating point; ``gpus_int``:
    ceil(n*). ``binding``: rows with a nonzero dual, largest share of n* first (n* = sum over rows of
    dual * rhs); ``binding_sli``: the first SLI row among them (None: capacity alone binds).
    ``x``, ``y_mixed``, ``y_solo``, ``q_prefill``: the operating point per GPU at n* (per-GPU units,
    as in :class:`~fluidopt.fluid.solution.FluidSolution`).
    """

    gpus: float
    gpus_int: int
    binding: tuple[str, ...]
    binding_sli: str | None
    duals: dict[str, float] = field(default_factory=dict)
    x: np.ndarray = field(default_factory=lambda: np.zeros(0))
    y_mixed: np.ndarray = field(default_factory=lambda: np.zeros(0))
    y_solo: np.ndarray = field(default_factory=lambda: np.zeros(0))
    q_prefill: np.ndarray = field(default_factory=lambda: np.zeros(0))
    class_names: tuple[str, ...] = ()
    slis: tuple = ()

    def to_dict(self) -> dict:
        return {"gpus": self.gpus, "gpus_int": self.gpus_int, "binding": list(self.binding),
                "binding_sli": self.binding_sli, "duals": dict(self.duals),
                "slis": [sli_spec(s) for s in self.slis]}


def check_slis_attainable(scenario: Scenario, slis: Sequence[SLI]) -> None:
    """Raise :class:`ScenarioError` for an SLI that no fleet size can meet, naming why."""
    for s in slis:
        why = s.unattainable(scenario.gpu)
        if why:
            raise ScenarioError(why)


def quiet_highs():
    """A highspy ``Highs`` with no output (its constructor prints a banner to the C stdout once per
    process; Pyomo's fd capture keeps it off the user's terminal and ``--json`` output)."""
    import io

    import highspy
    from pyomo.common.tee import capture_output

    with capture_output(io.StringIO(), capture_fd=True):
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h


def _rates(scenario: Scenario) -> dict[str, np.ndarray]:
    g = scenario.gpu
    P = np.array([c.prefill_tokens for c in scenario.classes], dtype=float)  # a cached prefix is not prefilled
    D = np.array([c.decode for c in scenario.classes], dtype=float)
    return {
        "Lam": np.array([c.rate for c in scenario.classes], dtype=float),
        "theta": np.array([c.patience for c in scenario.classes], dtype=float),
        "mu_p": g.chunk / (P * g.tau_mix),
        "mu_m": 1.0 / (D * g.tau_mix),
        "mu_s": g.gamma / D,
    }


def fluid_fleet_bound(scenario: Scenario, slis: Sequence[SLI]) -> FleetBound:
    """The fewest GPUs (continuous and integer) for which the fluid LP meets ``slis``: one LP in n.

    Demand is the scenario's cluster arrival rates (its ``gpus`` is ignored). Needs at least one
    served-fraction SLI with a positive target (else zero GPUs would do: everyone abandons).
    Raises :class:`ScenarioError` for SLIs no fleet can meet (say which and why) and
    :class:`InfeasibleError` naming the conflicting rows for anything else.
    """
    import highspy

    slis = validate_slis(slis, scenario.class_names)
    if not any(isinstance(s, MinServedFraction) and s.fraction > 0 for s in slis):
        raise ScenarioError("plan: no demand to serve: give a served fraction > 0 for at least one class "
                            "(e.g. --served 0.99); with none, zero GPUs meet the SLIs")
    check_slis_attainable(scenario, slis)
    r = _rates(scenario)
    I = scenario.n_classes
    g = scenario.gpu
    B = float(g.batch)
    # columns: n, X[I], Ym[I], Ys[I], Qp[I], then helper hi/lo pairs for fairness rows
    names = ["n"] + [f"{v}[{c}]" for v in ("X", "Ym", "Ys", "Qp") for c in scenario.class_names]
    lb = [0.0] * (1 + 4 * I)
    ub = [math.inf] * (1 + 4 * I)
    for i in range(I):
        if r["theta"][i] == 0:
            ub[1 + 3 * I + i] = 0.0  # no abandonment, no fluid queue (as in the per-GPU LP)
    cost = [1.0] + [0.0] * (4 * I)
    X = lambda i: 1 + i  # noqa: E731
    Ym = lambda i: 1 + I + i  # noqa: E731
    Ys = lambda i: 1 + 2 * I + i  # noqa: E731
    Qp = lambda i: 1 + 3 * I + i  # noqa: E731
    rows: list[tuple[str, dict[int, float], float, float]] = []  # name, coefs, lower, upper
    inf = math.inf
    rows.append(("prefill_capacity", {**{X(i): 1.0 for i in range(I)}, 0: -1.0}, -inf, 0.0))
    rows.append(("mixed_decode_capacity", {**{Ym(i): 1.0 for i in range(I)}, **{X(i): -(B - 1) for i in range(I)}},
                 -inf, 0.0))
    rows.append(("solo_decode_capacity", {**{Ys(i): 1.0 for i in range(I)}, **{X(i): B for i in range(I)}, 0: -B},
                 -inf, 0.0))
    for i, c in enumerate(scenario.class_names):
        coef = {X(i): r["mu_p"][i]}
        if r["theta"][i] > 0:
            coef[Qp(i)] = r["theta"][i]
        rows.append((f"prefill_balance[{c}]", coef, r["Lam"][i], r["Lam"][i]))
        rows.append((f"decode_balance[{c}]", {X(i): r["mu_p"][i], Ym(i): -r["mu_m"][i], Ys(i): -r["mu_s"][i]},
                     0.0, 0.0))

    def add_col(name: str) -> int:
        names.append(name)
        lb.append(-inf)
        ub.append(inf)
        cost.append(0.0)
        return len(names) - 1

    # Each SLI's own rows (fluidopt/fluid/sli.py) on cluster data (lam = Lambda), homogenised by n: the
    # per-GPU part of the right-hand side moves to the left as -rhs_per_gpu * n. Terms on a variable pinned
    # at 0 (q_prefill with theta = 0, q_decode: no buffer with SLIs) are left out, and a row left empty
    # is a constant and left out too.
    data = RowData(scenario.class_names, replace(scenario.rates(), lam=r["Lam"]), scenario.gpu)
    cols = {"x": X, "y_mixed": Ym, "y_solo": Ys, "q_prefill": Qp}
    for s in slis:
        helper = {h: add_col(h) for h in s.helpers}
        for row in s.rows(data):
            coef: dict[int, float] = {}
            for var, classes, a in row.terms:
                if classes is None and var in helper:
                    coef[helper[var]] = a
                    continue
                for cls in (classes if isinstance(classes, tuple) else (classes,)):
                    if var in cols and cls is not None:
                        i = scenario.class_names.index(cls)
                        if var != "q_prefill" or r["theta"][i] > 0:
                            coef[cols[var](i)] = a
                    elif var != "q_decode" or cls is None:
                        raise ScenarioError(f"sli {sli_spec(s)}: row {row.name}: unknown variable {var}[{cls}]")
            if not coef:
                continue
            if row.rhs_per_gpu:
                coef[0] = -row.rhs_per_gpu
            lo_, hi_ = (-inf, row.rhs) if row.sense == "<=" else (row.rhs, inf)
            rows.append((row.name, coef, lo_, hi_))

    h = quiet_highs()
    # Tight tolerances on rows scaled to a largest coefficient of 1: HiGHS's default 1e-7 absolute
    # tolerance would otherwise be a visible relative error on rows with small coefficients (TPOT's
    # are eta - 1/gamma, a few milliseconds), and n* is meant to 1e-6 relative or better.
    h.setOptionValue("primal_feasibility_tolerance", 1e-10)
    h.setOptionValue("dual_feasibility_tolerance", 1e-10)
    ncol = len(names)
    h.addVars(ncol, np.array(lb), np.array(ub))
    h.changeColsCost(ncol, np.arange(ncol, dtype=np.int32), np.array(cost))
    scale = []
    for _name, coef, lo_, hi_ in rows:
        idx = np.array(list(coef), dtype=np.int32)
        val = np.array([coef[k] for k in coef], dtype=float)
        sc = float(np.max(np.abs(val))) if val.size else 1.0
        sc = sc if sc > 0 else 1.0
        scale.append(sc)
        h.addRow(lo_ / sc, hi_ / sc, len(idx), idx, val / sc)
    h.changeObjectiveSense(highspy.ObjSense.kMinimize)
    h.run()
    status = h.getModelStatus()
    if status not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kInfeasible):
        # HiGHS may stop short of the tight tolerances on a badly scaled instance: ask again at its defaults
        h.setOptionValue("primal_feasibility_tolerance", 1e-7)
        h.setOptionValue("dual_feasibility_tolerance", 1e-7)
        h.clearSolver()
        h.run()
        status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise InfeasibleError(
            f"plan: the capacity LP of scenario {scenario.name!r} has no solution ({h.modelStatusToString(status)}) "
            f"for the SLIs {', '.join(sli_spec(s) for s in slis)}",
            conflicting=(),
        )
    sol = h.getSolution()
    col = np.array(sol.col_value)
    rd = np.array(sol.row_dual)
    n = float(col[0])
    duals = {}
    share = {}
    for k, (name, _c, lo_, hi_) in enumerate(rows):
        d = float(rd[k]) / scale[k]  # d n* / d rhs of the row as written (unscaled)
        if abs(d) > 1e-9 * max(1.0, n):
            duals[name] = d
            rhs = lo_ if math.isfinite(lo_) else hi_
            share[name] = abs(d * rhs)
    binding = tuple(sorted(duals, key=lambda k: -share[k]))
    sli_keys = {s.key for s in slis}
    binding_sli = next((b for b in binding if b in sli_keys), None)
    if binding_sli is None:
        binding_sli = next((b for b in duals if b in sli_keys), None)
    per = (lambda v: v / n) if n > 0 else (lambda v: v * 0.0)
    return FleetBound(
        gpus=n, gpus_int=max(1, math.ceil(n - 1e-9 * max(1.0, n))), binding=binding, binding_sli=binding_sli,
        duals=duals, x=per(col[1:1 + I]), y_mixed=per(col[1 + I:1 + 2 * I]), y_solo=per(col[1 + 2 * I:1 + 3 * I]),
        q_prefill=per(col[1 + 3 * I:1 + 4 * I]), class_names=scenario.class_names, slis=tuple(slis),
    )
