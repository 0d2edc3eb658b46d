"""The steady-state fluid LPs (paper Eqs. 40 and 42; docs/lp.md) as Pyomo models solved by HiGHS.

Everything is per GPU: x_i is the fraction of GPUs prefilling class i, y_mixed,i / y_solo,i the decode
slots per GPU that class i holds on mixed / solo GPUs, q_prefill,i / q_decode,i the fluid queues per
GPU, lambda_i the arrival rate per GPU (requests/s). The objective is revenue per GPU per second.

Rows (names as they appear in ``FluidSolution.duals`` and in infeasibility reports)::

    prefill_capacity        sum_i x_i                              <= 1
    mixed_decode_capacity   sum_i y_mixed,i - (B-1) sum_i x_i      <= 0
    solo_decode_capacity    sum_i y_solo,i + B sum_i x_i           <= B
    prefill_balance[i]      mu_p,i x_i + theta_i q_prefill,i       == lambda_i
    decode_balance[i]       mu_p,i x_i - theta_i q_decode,i - mu_m,i y_mixed,i - mu_s,i y_solo,i == 0

SLI rows are listed in docs/lp.md. Duals are d objective / d rhs of the row as written above
(HiGHS's convention for a maximisation; checked by finite differences in tests/test_lp.py).

A :class:`FluidModel` keeps every number that comes from the scenario in a mutable Pyomo ``Param`` and
keeps one persistent HiGHS instance, so re-solving after :meth:`FluidModel.update` (new prices, new
arrival rates, new SLI bounds) only changes coefficients in the loaded LP instead of rebuilding it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pyomo.environ as pyo
from pyomo.contrib.solver.common.results import TerminationCondition
from pyomo.contrib.solver.solvers.highs import Highs

from fluidopt.core.errors import InfeasibleError, ScenarioError, SolverError
from fluidopt.core.model import Rates, Scenario
from fluidopt.fluid.quiet_highs import QuietHighs
from fluidopt.fluid.sli import FLUID_VARIABLES, SLI, RowData, SLIRow, sli_spec, validate_slis
from fluidopt.fluid.solution import FluidSolution

__all__ = [
    "PRICINGS",
    "FluidModel",
    "build_fluid_model",
    "check_pricing",
    "objective_coefficients",
    "scenario_slis",
    "solve_fluid",
]

PRICINGS = ("bundled", "separate")
CAPACITY_ROWS = ("prefill_capacity", "mixed_decode_capacity", "solo_decode_capacity")
_INF = float("inf")
# Relative slack of the revenue floor in the lexicographic second stage: far below any reported digit,
# far above HiGHS's 1e-7 feasibility tolerance times the size of a coefficient, so stage 2 is feasible.
_FLOOR_RTOL = 1e-9
_QD_TOL = 1e-9
# "No lower bound" for the floor row. Not -inf: Pyomo would then treat the row as having no lower
# bound at all and never pass the stage-2 value on to HiGHS; HiGHS reads <= -1e20 as -inf anyway.
_FREE_ROW = -1e30  # a decode buffer below this (requests per GPU) counts as empty


def _primals(loader, variables):
    """Primal values of ``variables`` (Pyomo renamed get_primals -> get_vars in 6.10)."""
    get = getattr(loader, "get_vars", None) or loader.get_primals
    return get(variables)


def check_pricing(pricing: str) -> str:
    """Validate a pricing mode name: 'bundled' (Eq. 40) or 'separate' (Eq. 42)."""
    if pricing not in PRICINGS:
        raise ScenarioError(f"pricing: expected one of {', '.join(PRICINGS)}, got {pricing!r}")
    return pricing


def objective_coefficients(rates: Rates, pricing: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Revenue per GPU per second per unit of (x_i, y_mixed,i, y_solo,i).

    Bundled: w_i per completed request, so (0, w mu_m, w mu_s). Separate: c_p P_i per completed prefill
    and c_d D_i per completed decode, so (c_p P mu_p, c_d D mu_m, c_d D mu_s).
    """
    check_pricing(pricing)
    if pricing == "bundled":
        w = rates.w
        return np.zeros_like(w), w * rates.mu_m, w * rates.mu_s
    return rates.prefill_reward * rates.mu_p, rates.decode_reward * rates.mu_m, rates.decode_reward * rates.mu_s


class FluidModel:
    """A built fluid LP: ``.model`` is the Pyomo ``ConcreteModel``; :meth:`solve` solves it with HiGHS.

    Add your own constraints to ``.model`` before :meth:`solve` (they are picked up by the persistent
    solver and appear under their Pyomo names in duals and infeasibility reports)::

        fm = build_fluid_model(scenario)
        m = fm.model
        m.cap_long = pyo.Constraint(expr=m.x["long-prompt"] <= 0.15)
        sol = fm.solve()

    Variables (indexed by class name): ``x``, ``y_mixed``, ``y_solo``, ``q_prefill``, ``q_decode``;
    ``m.revenue`` and ``m.penalty`` are named expressions (per GPU per second); ``m.objective``
    maximises revenue - penalty (its stage weights and the free ``objective_floor`` row serve the
    lexicographic second stage). Soft SLIs add ``m.violation[key]``.
    """

    def __init__(self, scenario: Scenario, pricing: str = "bundled", slis: Sequence[SLI] = ()) -> None:
        t0 = time.perf_counter()
        if not isinstance(scenario, Scenario):
            raise ScenarioError(f"scenario: expected a fluidopt Scenario, got {type(scenario).__name__}")
        self.pricing = check_pricing(pricing)
        self.class_names: tuple[str, ...] = scenario.class_names
        self.slis: tuple[SLI, ...] = validate_slis(slis, self.class_names)
        self._structure = self._sli_structure(self.slis)
        self._solver: Highs | None = None
        self.scenario = scenario
        self._rates = scenario.rates()
        self._build()  # the SLI rows are built with the scenario's numbers: the first update() keeps them
        self._first_load = True
        self.update(scenario)
        self.build_seconds = time.perf_counter() - t0

    # -- construction ---------------------------------------------------------------------------
    @staticmethod
    def _sli_structure(slis: Sequence[SLI]) -> tuple[tuple[str, bool], ...]:
        return tuple((s.key, s.penalty is None) for s in slis)

    def _build(self) -> None:
        names = list(self.class_names)
        m = pyo.ConcreteModel(name="fluid_lp")
        m.I = pyo.Set(initialize=names, ordered=True)

        def param() -> pyo.Param:
            return pyo.Param(m.I, initialize=0.0, mutable=True, within=pyo.Any)

        m.lam, m.theta, m.mu_p, m.mu_m, m.mu_s = param(), param(), param(), param(), param()
        m.c_x, m.c_m, m.c_s = param(), param(), param()  # revenue coefficients (depend on pricing)
        m.q_prefill_ub, m.q_decode_ub = param(), param()
        m.B = pyo.Param(initialize=1.0, mutable=True, within=pyo.Any)

        nn = pyo.NonNegativeReals
        m.x = pyo.Var(m.I, within=nn)
        m.y_mixed = pyo.Var(m.I, within=nn)
        m.y_solo = pyo.Var(m.I, within=nn)
        # theta_i = 0: no abandonment, the fluid queue is not determined; pin it to 0 (bound = 0).
        m.q_prefill = pyo.Var(m.I, within=nn, bounds=lambda m, i: (0, m.q_prefill_ub[i]))
        # With SLIs, or theta_i = 0, the decode buffer is forced empty (docs/lp.md, SLIs).
        m.q_decode = pyo.Var(m.I, within=nn, bounds=lambda m, i: (0, m.q_decode_ub[i]))

        X = sum(m.x[i] for i in m.I)
        m.prefill_capacity = pyo.Constraint(expr=X <= 1)
        m.mixed_decode_capacity = pyo.Constraint(expr=sum(m.y_mixed[i] for i in m.I) - (m.B - 1) * X <= 0)
        m.solo_decode_capacity = pyo.Constraint(expr=sum(m.y_solo[i] for i in m.I) + m.B * X <= m.B)
        m.prefill_balance = pyo.Constraint(
            m.I, rule=lambda m, i: m.mu_p[i] * m.x[i] + m.theta[i] * m.q_prefill[i] == m.lam[i]
        )
        m.decode_balance = pyo.Constraint(
            m.I,
            rule=lambda m, i: m.mu_p[i] * m.x[i] - m.theta[i] * m.q_decode[i]
            - m.mu_m[i] * m.y_mixed[i] - m.mu_s[i] * m.y_solo[i] == 0,
        )

        # -- SLIs -------------------------------------------------------------------------------
        soft = [s.key for s in self.slis if s.penalty is not None]
        m.SOFT = pyo.Set(initialize=soft, ordered=True)
        m.penalty_weight = pyo.Param(m.SOFT, initialize=0.0, mutable=True, within=pyo.Any)
        m.violation = pyo.Var(m.SOFT, within=nn)

        def v(key: str):
            return m.violation[key] if key in soft else 0.0

        # Each SLI's rows (fluidopt/fluid/sli.py), in the built-ins' order of before; each coefficient and
        # right-hand side a mutable parameter (sli_coef[row, k], sli_rhs[row]) that update() reloads, except
        # in rows marked fixed (constants: the fairness rows' 1s and 0s). Rows named base[index] of all SLIs
        # form one indexed constraint ``base`` (served_fraction[a], served_fraction[b], ...).
        data = RowData(self.class_names, self._rates, self.scenario.gpu)
        order = sorted(range(len(self.slis)), key=lambda j: self.slis[j].order)
        self._sli_rows: list[tuple[int, tuple[SLIRow, ...]]] = [(j, tuple(self.slis[j].rows(data))) for j in order]
        coef0: dict[tuple[str, int], float] = {}
        rhs0: dict[str, float] = {}
        for _, rows in self._sli_rows:
            for row in rows:
                if not row.fixed:
                    rhs0[row.name] = row.per_gpu_rhs
                    coef0.update(((row.name, k), t[2]) for k, t in enumerate(row.terms))
        m.sli_rhs = pyo.Param(pyo.Any, initialize=rhs0, mutable=True, within=pyo.Any)
        m.sli_coef = pyo.Param(pyo.Any, initialize=coef0, mutable=True, within=pyo.Any)
        groups: dict[str, dict[str | None, object]] = {}
        for j, rows in self._sli_rows:
            sli = self.slis[j]
            for h in sli.helpers:
                if hasattr(m, h):
                    raise ScenarioError(f"sli {sli_spec(sli)}: helper variable {h!r} is already a name in the model")
                setattr(m, h, pyo.Var())
            for row in rows:
                base, br, idx = row.name.partition("[")
                exprs = groups.setdefault(base, {})
                key = idx[:-1] if br else None
                if key in exprs or (None in exprs) or (key is None and exprs):
                    raise ScenarioError(f"sli {sli_spec(sli)}: row name {row.name!r} is given twice")
                exprs[key] = self._sli_expr(m, sli, row, v(sli.key) if row.main else 0.0)
        for base, exprs in groups.items():
            if hasattr(m, base):
                raise ScenarioError(f"sli row {base!r}: the name is already taken in the model")
            if None in exprs:
                setattr(m, base, pyo.Constraint(expr=exprs[None]))
            else:
                setattr(m, base, pyo.Constraint(list(exprs), rule=lambda m, i, e=exprs: e[i]))

        # -- objective ----------------------------------------------------------------------------
        m.revenue = pyo.Expression(
            expr=sum(m.c_x[i] * m.x[i] + m.c_m[i] * m.y_mixed[i] + m.c_s[i] * m.y_solo[i] for i in m.I)
        )
        m.penalty = pyo.Expression(expr=sum(m.penalty_weight[k] * m.violation[k] for k in m.SOFT))
        # Lexicographic second stage (among revenue-optimal points, the smallest decode buffer) by
        # parameters only, so that switching stages never adds or removes rows in the loaded LP:
        # stage 1 maximises 1 * (revenue - penalty) - 0 * buffer with a free floor row; stage 2
        # maximises 0 * (...) - 1 * buffer with the floor row at the stage-1 optimum.
        m.stage_revenue_weight = pyo.Param(initialize=1.0, mutable=True, within=pyo.Any)
        m.stage_buffer_weight = pyo.Param(initialize=0.0, mutable=True, within=pyo.Any)
        m.objective = pyo.Objective(
            expr=m.stage_revenue_weight * (m.revenue - m.penalty)
            - m.stage_buffer_weight * sum(m.q_decode[i] for i in m.I),
            sense=pyo.maximize,
        )
        m.objective_floor_rhs = pyo.Param(initialize=_FREE_ROW, mutable=True, within=pyo.Any)
        m.objective_floor = pyo.Constraint(expr=m.revenue - m.penalty >= m.objective_floor_rhs)

        self.model = m
        self._vars = [m.x[i] for i in names] + [m.y_mixed[i] for i in names] + [m.y_solo[i] for i in names] + [
            m.q_prefill[i] for i in names
        ] + [m.q_decode[i] for i in names]
        self._soft_vars = [m.violation[k] for k in soft]
        # Row names for duals and IIS reports; user-added rows fall back to Pyomo's own names.
        self._row_names: dict[int, str] = {}
        for comp in m.component_objects(pyo.Constraint, descend_into=False):
            for idx, cd in comp.items():
                self._row_names[id(cd)] = comp.local_name if idx is None else f"{comp.local_name}[{idx}]"
        self._sli_of_row: dict[str, SLI] = {}
        for j, rows in self._sli_rows:
            for row in rows:
                self._sli_of_row[row.name] = self.slis[j]

    @staticmethod
    def _sli_expr(m, sli: SLI, row: SLIRow, violation):
        """One SLI row as a Pyomo relational expression (coefficients and rhs: parameters unless fixed)."""
        body = 0
        for k, (var, cls, coef) in enumerate(row.terms):
            if var in FLUID_VARIABLES and isinstance(cls, tuple):
                x = sum(getattr(m, var)[c] for c in cls)
            elif var in FLUID_VARIABLES and cls is not None:
                x = getattr(m, var)[cls]
            elif var in sli.helpers and cls is None:
                x = getattr(m, var)
            else:
                raise ScenarioError(f"sli {sli_spec(sli)}: row {row.name}: unknown variable {var}[{cls}]; expected one "
                                    f"of {', '.join(FLUID_VARIABLES)} with a class, or a helper {sli.helpers}")
            if not row.fixed:
                body = body + m.sli_coef[row.name, k] * x
            elif coef == 1.0 or coef == -1.0:  # as the rows were written by hand: x_i - x_max <= 0
                body = body + x if coef == 1.0 else body - x
            else:
                body = body + float(coef) * x
        rhs = float(row.per_gpu_rhs) if row.fixed else m.sli_rhs[row.name]
        return body - violation <= rhs if row.sense == "<=" else body + violation >= rhs

    # -- data -------------------------------------------------------------------------------------
    def update(self, scenario: Scenario | None = None, *, slis: Sequence[SLI] | None = None,
               pricing: str | None = None) -> None:
        """Load new data into the built model without rebuilding it.

        ``scenario`` must have the same class names in the same order (anything else may change:
        rates, prices, GPU profile, number of GPUs). ``slis`` must have the same keys and the same
        hard/soft modes as the model was built with (bounds and weights may change). ``pricing``
        switches between 'bundled' and 'separate'.
        """
        m = self.model
        if pricing is not None:
            self.pricing = check_pricing(pricing)
        if slis is not None:
            new = validate_slis(slis, self.class_names)
            if self._sli_structure(new) != self._structure:
                raise ScenarioError(
                    "slis: update() keeps the SLI rows of the built model "
                    f"({', '.join(k + (' (hard)' if h else ' (penalty)') for k, h in self._structure) or 'none'}); "
                    f"got {', '.join(sli_spec(s) for s in new) or 'none'}; build a new model for other SLIs"
                )
            self.slis = new
        if scenario is not None:
            if not isinstance(scenario, Scenario):
                raise ScenarioError(f"scenario: expected a fluidopt Scenario, got {type(scenario).__name__}")
            if scenario.class_names != self.class_names:
                raise ScenarioError(
                    f"scenario.classes: update() needs the classes {', '.join(self.class_names)} in this order, "
                    f"got {', '.join(scenario.class_names)}; build a new model for other classes"
                )
            self.scenario = scenario
        s = self.scenario
        first, self._first_load = self._first_load, False
        r = self._rates if first else s.rates()
        self._rates = r
        cx, cm, cs = objective_coefficients(r, self.pricing)
        no_buffer = bool(self.slis)
        for k, i in enumerate(self.class_names):
            m.lam[i] = float(r.lam[k])
            m.theta[i] = float(r.theta[k])
            m.mu_p[i] = float(r.mu_p[k])
            m.mu_m[i] = float(r.mu_m[k])
            m.mu_s[i] = float(r.mu_s[k])
            m.c_x[i] = float(cx[k])
            m.c_m[i] = float(cm[k])
            m.c_s[i] = float(cs[k])
            m.q_prefill_ub[i] = 0.0 if r.theta[k] == 0 else _INF
            m.q_decode_ub[i] = 0.0 if (r.theta[k] == 0 or no_buffer) else _INF
        m.B = float(s.gpu.batch)
        data = RowData(self.class_names, r, s.gpu)
        for j, built in self._sli_rows:
            sli = self.slis[j]
            if sli.penalty is not None:
                m.penalty_weight[sli.key] = float(sli.penalty)
            if first:  # _build loaded these very rows
                continue
            rows = tuple(sli.rows(data))
            if len(rows) != len(built):
                raise ScenarioError(f"sli {sli_spec(sli)}: {len(rows)} rows for the new data, {len(built)} when built; "
                                    "an SLI's rows keep their names and terms")
            for row, old in zip(rows, built):
                if old.fixed:  # constants by the SLI's word (SLIRow.fixed): nothing to reload
                    continue
                if row.name != old.name or len(row.terms) != len(old.terms) or row.fixed:
                    raise ScenarioError(f"sli {sli_spec(sli)}: its row {old.name} changed with the data or the bound "
                                        f"(to {row}); an SLI's rows keep their names and terms, a fixed row its numbers")
                for k, t in enumerate(row.terms):
                    m.sli_coef[row.name, k] = t[2]
                m.sli_rhs[row.name] = row.per_gpu_rhs

    # -- solving ----------------------------------------------------------------------------------
    @property
    def solver(self) -> Highs:
        """The persistent Pyomo HiGHS interface (created on first use)."""
        if self._solver is None:
            opt = QuietHighs()
            opt.config.load_solutions = False
            opt.config.raise_exception_on_nonoptimal_result = False
            opt.config.solver_options["output_flag"] = False
            self._solver = opt
        return self._solver

    _STRUCTURE_CHECKS = (
        "check_for_new_or_removed_constraints", "check_for_new_or_removed_vars", "check_for_new_or_removed_params",
        "check_for_new_objective", "update_constraints", "update_vars", "update_named_expressions",
        "update_objective",
    )

    @property
    def watch_structure(self) -> bool:
        """Whether each solve looks for rows, variables or objectives added, removed or (de)activated.

        True (default) lets users edit ``.model`` between solves. Sweeps set it to False: then only
        mutable parameters are re-read, which is several times faster per solve.
        """
        return bool(self.solver.config.auto_updates.check_for_new_or_removed_constraints)

    @watch_structure.setter
    def watch_structure(self, on: bool) -> None:
        au = self.solver.config.auto_updates
        for k in self._STRUCTURE_CHECKS:
            setattr(au, k, bool(on))

    def row_name(self, con) -> str:
        """Name of a Pyomo constraint as used in duals and infeasibility reports."""
        return self._row_names.get(id(con)) or con.name

    def _run(self):
        opt = self.solver
        res = opt.solve(self.model)
        tc = res.termination_condition
        if tc == TerminationCondition.infeasibleOrUnbounded:
            # Presolve could not tell which; the simplex without presolve can.
            opt.config.solver_options["presolve"] = "off"
            try:
                res = opt.solve(self.model)
            finally:
                opt.config.solver_options["presolve"] = "choose"
            tc = res.termination_condition
        return res, tc

    def solve(self, *, lexicographic: bool = True, raise_infeasible: bool = True) -> FluidSolution:
        """Solve with HiGHS and return a :class:`FluidSolution`.

        ``lexicographic``: if the revenue-optimal point found has a decode buffer, re-solve for the
        smallest total buffer sum_i q_decode,i among points within 1e-9 (relative) of the optimum
        (when gamma tau >= (B-1)/B that buffer is 0 for the bundled LP, Prop. 3.2). Duals always come
        from the first, revenue-maximising stage. Infeasible: raises
        :class:`~fluidopt.core.errors.InfeasibleError` with an irreducible infeasible subsystem of rows, or
        (``raise_infeasible=False``) returns a solution with ``status='infeasible'`` and NaNs.
        """
        t0 = time.perf_counter()
        m = self.model
        res, tc = self._run()
        if tc == TerminationCondition.provenInfeasible:
            if not raise_infeasible:
                return self._nan_solution("infeasible", time.perf_counter() - t0)
            rows, bounds = self.conflict()
            raise InfeasibleError(self._infeasible_message(rows, bounds), conflicting=tuple(rows))
        if tc != TerminationCondition.convergenceCriteriaSatisfied:
            raise SolverError(
                f"HiGHS did not solve the fluid LP of scenario {self.scenario.name!r}: termination {tc.name}"
            )
        duals_raw = res.solution_loader.get_duals()
        values, viol = self._values(res)
        I = len(self.class_names)
        if lexicographic and values[4 * I:].max(initial=0.0) > _QD_TOL:
            better = self._least_buffer(float(res.incumbent_objective))
            if better is not None:
                values, viol = better
        # Duals below 1e-10 are simplex round-off (e.g. -9e-16 on a non-binding row): report 0.
        duals = {self.row_name(c): (float(d) if abs(d) > 1e-10 else 0.0)
                 for c, d in duals_raw.items() if c is not m.objective_floor}
        return self._solution(values, viol, duals, time.perf_counter() - t0)

    def _values(self, res) -> tuple[np.ndarray, dict[str, float]]:
        primal = _primals(res.solution_loader, self._vars + self._soft_vars)
        values = np.array([primal[v] for v in self._vars], dtype=float)
        viol = {k: float(primal[v]) for k, v in zip(self.model.SOFT, self._soft_vars)}
        return values, viol

    def _least_buffer(self, r1: float) -> tuple[np.ndarray, dict[str, float]] | None:
        """Second stage: a revenue-optimal point with the smallest decode buffer (None: keep stage 1).

        A: maximise again with q_decode = 0; if the optimum is unchanged (always so for the bundled LP
        when gamma tau >= (B-1)/B) that vertex is the answer. B: otherwise minimise sum q_decode over
        points within 1e-9 (relative) of the optimum, then C: maximise revenue with q_decode capped at
        B's buffer (plus 1e-6 relative), which returns to the exact optimum instead of a point shaved
        by the 1e-9 slack; the buffer is then the least one to within about 1e-6 (relative).
        """
        m = self.model
        floor = r1 - _FLOOR_RTOL * max(1.0, abs(r1))
        ub = {i: pyo.value(m.q_decode_ub[i]) for i in self.class_names}
        ok = TerminationCondition.convergenceCriteriaSatisfied
        try:
            for i in self.class_names:
                m.q_decode_ub[i] = 0.0
            res, tc = self._run()
            if tc == ok and res.incumbent_objective >= floor:
                return self._values(res)
            for i in self.class_names:
                m.q_decode_ub[i] = ub[i]
            m.objective_floor_rhs = floor
            m.stage_revenue_weight = 0.0
            m.stage_buffer_weight = 1.0
            try:
                res, tc = self._run()
            finally:
                m.objective_floor_rhs = _FREE_ROW
                m.stage_revenue_weight = 1.0
                m.stage_buffer_weight = 0.0
            if tc != ok:
                return None
            stage_b = self._values(res)
            I = len(self.class_names)
            qd = stage_b[0][4 * I:]
            for k, i in enumerate(self.class_names):
                m.q_decode_ub[i] = min(ub[i], float(qd[k]) * (1 + 1e-6)) if qd[k] > _QD_TOL else 0.0
            res, tc = self._run()
            if tc == ok and res.incumbent_objective >= floor:
                return self._values(res)
            return stage_b
        finally:
            for i in self.class_names:
                m.q_decode_ub[i] = ub[i]

    def _solution(self, values: np.ndarray, viol: dict[str, float], duals: dict[str, float],
                  seconds: float, status: str = "optimal") -> FluidSolution:
        r, s = self._rates, self.scenario
        I = len(self.class_names)
        # Round-off from the simplex (|v| ~ 1e-12, or slightly negative values of these nonnegative
        # variables down to ~1e-8 on badly scaled instances) is cleaned so reports show exact zeros
        # and controllers never see a negative target.
        values = np.where((np.abs(values) < 1e-12) | ((values < 0) & (values > -1e-7)), 0.0, values)
        x, ym, ys, qp, qd = (values[k * I:(k + 1) * I] for k in range(5))
        cx, cm, cs = objective_coefficients(r, self.pricing)
        revenue = float(cx @ x + cm @ ym + cs @ ys)
        penalty = float(sum(sli.penalty * viol.get(sli.key, 0.0) for sli in self.slis if sli.penalty is not None))
        return FluidSolution.from_primal(
            s, pricing=self.pricing, x=x, y_mixed=ym, y_solo=ys, q_prefill=qp, q_decode=qd,
            revenue_per_gpu=revenue, penalty_per_gpu=penalty, objective_per_gpu=revenue - penalty,
            duals=duals, slis=self.slis, violations=viol, solve_seconds=seconds, solver="highs", status=status,
        )

    def _nan_solution(self, status: str, seconds: float) -> FluidSolution:
        I = len(self.class_names)
        nan = np.full(5 * I, np.nan)
        sol = self._solution(nan, {}, {}, seconds, status=status)
        return sol

    # -- infeasibility ----------------------------------------------------------------------------
    def conflict(self) -> tuple[list[str], list[str]]:
        """Rows and variable bounds of an irreducible infeasible subsystem of the last (infeasible) solve.

        Uses HiGHS's IIS (``Highs.getIis``); if that is unavailable or fails, a deletion filter over
        the rows (drop a row, keep it dropped if the rest stays infeasible) gives an IIS of rows.
        """
        try:
            return self._highs_iis()
        except Exception:  # noqa: BLE001 - any failure of the private mapping: use the public fallback
            watching = self.watch_structure
            self.watch_structure = True  # the filter (de)activates rows
            try:
                return self._deletion_filter(), []
            finally:
                self.watch_structure = watching

    def _highs_iis(self) -> tuple[list[str], list[str]]:
        opt = self.solver
        h = opt._solver_model
        # HiGHS's default ("light") strategy returns an empty set when presolve found the
        # infeasibility; kIisStrategyIrreducible (4) always gives an irreducible one.
        h.setOptionValue("iis_strategy", 4)
        status, iis = h.getIis()
        if not iis.valid_ or (len(iis.row_index_) == 0 and len(iis.col_index_) == 0):
            raise RuntimeError(f"HiGHS IIS not available: {status}")
        rows = [self.row_name(opt._solver_con_to_pyomo_con_map[int(i)]) for i in iis.row_index_]
        var_of = {idx: opt._vars[vid][0] for vid, idx in opt._pyomo_var_to_solver_var_map.items()}
        bounds = []
        for j, b in zip(iis.col_index_, iis.col_bound_):
            var = var_of[int(j)]
            if int(b) in (2, 4):  # lower or boxed
                bounds.append(f"{var.name} >= {pyo.value(var.lb):g}")
            if int(b) in (3, 4):  # upper or boxed
                bounds.append(f"{var.name} <= {pyo.value(var.ub):g}")
        return rows, bounds

    def _deletion_filter(self) -> list[str]:
        m = self.model
        cons = [c for c in m.component_data_objects(pyo.Constraint, active=True) if c is not m.objective_floor]
        dropped = []
        try:
            for c in cons:
                c.deactivate()
                _, tc = self._run()
                if tc == TerminationCondition.provenInfeasible:
                    dropped.append(c)  # not needed for infeasibility
                else:
                    c.activate()
        finally:
            for c in dropped:
                c.activate()
        keep = set(map(id, dropped))
        return [self.row_name(c) for c in cons if id(c) not in keep]

    def _infeasible_message(self, rows: list[str], bounds: list[str]) -> str:
        parts = []
        for r in rows:
            sli = self._sli_of_row.get(r)
            parts.append(f"{r} (SLI {sli_spec(sli)})" if sli is not None else r)
        msg = (
            f"the fluid LP ({self.pricing} pricing) of scenario {self.scenario.name!r} is infeasible; "
            f"an irreducible set of conflicting rows: {', '.join(parts) or '(none found)'}"
        )
        if bounds:
            msg += f"; with variable bounds {', '.join(bounds)}"
        if any(r in self._sli_of_row for r in rows):
            msg += "; relax the SLIs named, or make them soft with ':penalty=WEIGHT'"
        return msg


def build_fluid_model(scenario: Scenario, pricing: str = "bundled", slis: Sequence[SLI] = ()) -> FluidModel:
    """Build the fluid LP of ``scenario`` (bundled: Eq. 40, separate: Eq. 42) with optional SLIs."""
    return FluidModel(scenario, pricing, slis)


def scenario_slis(scenario: Scenario) -> tuple[SLI, ...]:
    """The SLIs a scenario file declares (``slis = ["tpot=0.03", ...]``), parsed once when the file was
    read (:func:`~fluidopt.fluid.sli.slis_of`); () when none."""
    from fluidopt.fluid.sli import slis_of

    meta = getattr(scenario, "meta", None)
    return slis_of(meta.get("slis") if isinstance(meta, dict) else None)


def solve_fluid(scenario: Scenario, pricing: str = "bundled", slis: Sequence[SLI] | None = None, *,
                lexicographic: bool = True) -> FluidSolution:
    """Build and solve the fluid LP; see :meth:`FluidModel.solve`.

    ``slis``: the SLI rows to add; ``None`` (default) takes the scenario's own (its file's ``slis``
    list, :func:`scenario_slis`), ``()`` solves without any.

    >>> import fluidopt
    >>> round(solve_fluid(fluidopt.default_scenario()).objective_per_gpu, 2)
    297.7
    """
    if slis is None:
        slis = scenario_slis(scenario)
    return FluidModel(scenario, pricing, slis).solve(lexicographic=lexicographic)

