"""A direct highspy path for sweeps: the Pyomo model's own rows, re-solved without Pyomo in the loop.

Through Pyomo a sweep point costs a few milliseconds (parameter updates walk the model); the same
LP re-solved warm in highspy costs a fraction of a millisecond. :class:`DirectFluidLP` builds the
:class:`~fluidopt.fluid.lp.FluidModel` once (Pyomo stays the model users read and extend), lets
Pyomo load it into HiGHS, copies that loaded LP (``Highs.getLp``: the same rows, columns and bounds)
into its own highspy instance and keeps Pyomo's maps from variables and rows to column and row
indices. A point then changes only numbers in place:

- prices (:meth:`DirectFluidLP.set_prices`): the objective coefficients of x, y_mixed and y_solo
  (:func:`~fluidopt.fluid.lp.objective_coefficients`, bundled or separate);
- SLI bounds (:meth:`DirectFluidLP.set_sli_bound`): the right-hand side of the SLI's row (and, for
  TPOT, its coefficients, which depend on the bound);

and re-solves from the previous basis. The lexicographic second stage of :meth:`FluidModel.solve`
(the least decode buffer among revenue-optimal points) runs here too, step for step (A: q_decode = 0;
B: least buffer within 1e-9 of the optimum through the model's own ``objective_floor`` row; C: the
exact optimum with the buffer capped at B's); should B fail, the point is solved through Pyomo, so
the answers are the Pyomo model's on every point (tests/planning/test_pricing.py holds the two equal).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from fluidopt.core.model import Scenario
from fluidopt.fluid.lp import FluidModel
from fluidopt.fluid.scipy_import import import_scipy
from fluidopt.fluid.sli import SLI, RowData

__all__ = ["DirectFluidLP"]

_QD_TOL = 1e-9
_FLOOR_RTOL = 1e-9


class DirectFluidLP:
    """The fluid LP of ``scenario`` (with ``slis``) as a bare highspy model for fast re-solves.

    :meth:`solve` returns a small dict per point (objective and revenue per GPU per second, x, the
    per-class throughput and served fraction, and the status); :meth:`solution` the full
    :class:`~fluidopt.fluid.solution.FluidSolution` through Pyomo when a point needs duals.
    """

    def __init__(self, scenario: Scenario, pricing: str = "bundled", slis: Sequence[SLI] = ()) -> None:
        import highspy

        self._highspy = highspy
        t0 = time.perf_counter()
        fm = FluidModel(scenario, pricing, slis)
        fm.watch_structure = False
        fm.solve(raise_infeasible=False)  # loads the model into Pyomo's HiGHS instance
        opt = fm.solver
        self.fm = fm
        self.scenario = scenario
        self.pricing = pricing
        self.class_names = scenario.class_names
        m = fm.model
        vmap = opt._pyomo_var_to_solver_var_map
        cmap = opt._pyomo_con_to_solver_con_map
        names = list(self.class_names)

        def cols(var) -> np.ndarray:
            return np.array([vmap[id(var[i])] for i in names], dtype=np.int32)

        self._x, self._ym, self._ys = cols(m.x), cols(m.y_mixed), cols(m.y_solo)
        self._qd, self._qp = cols(m.q_decode), cols(m.q_prefill)
        self._obj_cols = np.concatenate([self._x, self._ym, self._ys])
        self._soft = np.array([vmap[id(v)] for v in fm._soft_vars], dtype=np.int32)
        self._rows: dict[str, int] = {}
        for con, idx in cmap.items():
            self._rows[fm.row_name(con)] = int(idx)
        from fluidopt.fluid.capacity import quiet_highs

        h = quiet_highs()
        h.passModel(opt._solver_model.getLp())
        self.h = h
        lp = h.getLp()
        self._qd_ub = np.array(lp.col_upper_, dtype=float)[self._qd]
        self._soft_cost = np.array(lp.col_cost_, dtype=float)[self._soft] if len(self._soft) else np.zeros(0)
        self._rates = scenario.rates()
        self.slis = tuple(fm.slis)
        # per-class data for prices: computing the cost vector needs no Scenario object per point
        r = self._rates
        self._P = np.array([c.prompt for c in scenario.classes], dtype=float)
        self._D = np.array([c.decode for c in scenario.classes], dtype=float)
        self._cp_over = np.array([np.nan if c.prefill_price is None else c.prefill_price for c in scenario.classes])
        self._cd_over = np.array([np.nan if c.decode_price is None else c.decode_price for c in scenario.classes])
        self._mu = (r.mu_p, r.mu_m, r.mu_s)
        self._prices = (scenario.prefill_price, scenario.decode_price)
        self._cache = None  # the last unique optimum and its basis (see _reuse)
        self._read_lp()
        self.set_prices(scenario.prefill_price, scenario.decode_price, pricing)
        self.build_seconds = time.perf_counter() - t0

    def _read_lp(self) -> None:
        """Dense copy of the loaded LP (a few dozen rows and columns) for the basis check."""
        lp = self.h.getLp()
        m, n = lp.num_row_, lp.num_col_
        A = np.zeros((m, n))
        start, index, value = (np.asarray(lp.a_matrix_.start_), np.asarray(lp.a_matrix_.index_),
                               np.asarray(lp.a_matrix_.value_))
        for j in range(n):
            A[index[start[j]:start[j + 1]], j] = value[start[j]:start[j + 1]]
        self._A = A
        self._full_cost = np.array(lp.col_cost_, dtype=float)
        self._col_fixed = np.asarray(lp.col_lower_) == np.asarray(lp.col_upper_)
        self._row_fixed = np.asarray(lp.row_lower_) == np.asarray(lp.row_upper_)
        self._cache = None

    # -- data --------------------------------------------------------------------------------
    def set_prices(self, prefill: float, decode: float, pricing: str | None = None) -> None:
        """Token prices c_p, c_d (per-class overrides in the scenario are kept), optionally a new pricing."""
        if pricing is not None:
            if pricing != self.pricing:
                self._cache = None
            self.pricing = pricing
        self._prices = (float(prefill), float(decode))
        cp = np.where(np.isnan(self._cp_over), prefill, self._cp_over) * self._P  # reward per prefill
        cd = np.where(np.isnan(self._cd_over), decode, self._cd_over) * self._D  # reward per decode
        mu_p, mu_m, mu_s = self._mu
        if self.pricing == "bundled":  # as objective_coefficients(): (0, w mu_m, w mu_s), w = c_p P + c_d D
            w = cp + cd
            self._cost = np.concatenate([np.zeros_like(w), w * mu_m, w * mu_s])
        else:
            self._cost = np.concatenate([cp * mu_p, cd * mu_m, cd * mu_s])
        self._full_cost[self._obj_cols] = self._cost
        self.h.changeColsCost(len(self._obj_cols), self._obj_cols, self._cost)

    @property
    def scenario(self) -> Scenario:
        """The scenario at the current prices."""
        return self._scenario.with_prices(*self._prices)

    @scenario.setter
    def scenario(self, value: Scenario) -> None:
        self._scenario = value

    def set_sli_bound(self, key: str, bound: float) -> None:
        """Move one SLI's bound: its rows (:meth:`~fluidopt.fluid.sli.SLIBase.rows`) are recomputed and the
        coefficients and right-hand sides that changed are written in place (TPOT's coefficients move too)."""
        sli = next((s for s in self.slis if s.key == key), None)
        if sli is None:
            raise KeyError(f"no SLI row {key!r} in this model; it has {[s.key for s in self.slis]}")
        new = sli.with_bound(bound)
        self.slis = tuple(new if s.key == key else s for s in self.slis)
        data = RowData(self.class_names, self._rates, self._scenario.gpu)
        m = self.fm.model
        vmap = self.fm.solver._pyomo_var_to_solver_var_map
        inf = self._highspy.kHighsInf
        for row, old in zip(new.rows(data), sli.rows(data)):
            idx = self._rows[row.name]
            for (var, classes, a), (_, _, a_old) in zip(row.terms, old.terms):
                if a != a_old:
                    for cls in (classes if isinstance(classes, tuple) else (classes,)):
                        v = getattr(m, var) if cls is None else getattr(m, var)[cls]
                        self.h.changeCoeff(idx, int(vmap[id(v)]), float(a))
            rhs, rhs_old = row.per_gpu_rhs, old.per_gpu_rhs
            if rhs != rhs_old:
                if row.sense == "<=":
                    self.h.changeRowBounds(idx, -inf, float(rhs))
                else:
                    self.h.changeRowBounds(idx, float(rhs), inf)
        self._read_lp()

    # -- solving -----------------------------------------------------------------------------
    def _run(self) -> tuple[bool, float, np.ndarray]:
        h = self.h
        h.run()
        st = h.getModelStatus()
        if st != self._highspy.HighsModelStatus.kOptimal:
            return False, math.nan, np.empty(0)
        return True, float(h.getInfo().objective_function_value), np.asarray(h.getSolution().col_value)

    def _reuse(self) -> np.ndarray | None:
        """The cached point when its basis is still optimal (dual feasible) for the current costs.

        A solve warm-started from an optimal basis returns that basis's point without a pivot, so this
        is the answer :meth:`solve` would get from HiGHS, for the price of one small linear solve.
        For a point with a decode buffer the answer is the least-buffer point on the optimal face, so
        it is reused only while the face is the same (the same nonbasics with zero reduced cost)."""
        c = self._cache
        if c is None:
            return None
        y = c["lu"](self._full_cost[c["basic_cols"]])
        d_col = self._full_cost - self._A.T @ y  # reduced costs of columns
        d_row = y  # a row's activity variable enters as -e_i: its reduced cost is y_i
        tol = 1e-9 * max(1.0, float(np.max(np.abs(self._full_cost))))
        zero = []
        for d, at_lower, at_upper in ((d_col[c["nb_col"]], c["col_lower"], c["col_upper"]),
                                      (d_row[c["nb_row"]], c["row_lower"], c["row_upper"])):
            # maximisation: at a lower bound d <= 0, at an upper bound d >= 0 (HiGHS's own test, tolerance
            # far inside its 1e-7 dual feasibility tolerance)
            if np.any(d[at_lower] > tol) or np.any(d[at_upper] < -tol):
                return None
            zero.append(np.abs(d) <= tol)
        zero = np.concatenate(zero)
        if c["zero"] is None:
            c["zero"] = zero
        elif c["buffered"] and not np.array_equal(zero, c["zero"]):
            # The optimal face is {nonbasics with d != 0 at their bounds}: the same zero pattern, the same
            # face, hence the same least-buffer point. Another pattern: solve.
            return None
        return c["col"]

    def _remember(self, col: np.ndarray) -> None:
        """Cache the stage-1 basis and its point (see :meth:`_reuse`); for a point with a decode buffer
        :meth:`solve` replaces the point by the lexicographic one."""
        hs = self._highspy
        basis = self.h.getBasis()
        cs = np.array([int(v) for v in basis.col_status])
        rs = np.array([int(v) for v in basis.row_status])
        BASIC, LOWER, UPPER = int(hs.HighsBasisStatus.kBasic), int(hs.HighsBasisStatus.kLower), \
            int(hs.HighsBasisStatus.kUpper)
        bc, br = np.flatnonzero(cs == BASIC), np.flatnonzero(rs == BASIC)
        m = self._A.shape[0]
        if len(bc) + len(br) != m:
            self._cache = None
            return
        Bm = np.zeros((m, m))
        Bm[:, :len(bc)] = self._A[:, bc]
        for k, i in enumerate(br):
            Bm[i, len(bc) + k] = -1.0
        try:
            # scipy.linalg alone: not the scipy.stats, integrate, sparse and spatial that Pyomo's hook adds
            sla = import_scipy("scipy.linalg")
            lu = sla.lu_factor(Bm.T)
        except Exception:  # noqa: BLE001 - a singular basis matrix: no reuse, just solve
            self._cache = None
            return
        nbc, nbr = np.flatnonzero(cs != BASIC), np.flatnonzero(rs != BASIC)
        movable_c, movable_r = ~self._col_fixed[nbc], ~self._row_fixed[nbr]
        nbc, nbr = nbc[movable_c], nbr[movable_r]
        nb = len(bc)

        def solve_y(cb_cols: np.ndarray) -> np.ndarray:
            rhs = np.concatenate([cb_cols, np.zeros(m - nb)])
            return sla.lu_solve(lu, rhs)

        self._cache = {"lu": solve_y, "basic_cols": bc, "nb_col": nbc, "nb_row": nbr,
                       "col_lower": cs[nbc] == LOWER, "col_upper": cs[nbc] == UPPER,
                       "row_lower": rs[nbr] == LOWER, "row_upper": rs[nbr] == UPPER, "col": col,
                       "buffered": bool(col[self._qd].max(initial=0.0) > _QD_TOL), "zero": None}
        if self._reuse() is None:  # round-off made the basis look infeasible: do not cache it
            self._cache = None

    def solve(self) -> dict:
        """Solve at the current data; returns status, objective_per_gpu, revenue_per_gpu, x, throughput,
        served_fraction (per class arrays) and ``via`` ('basis' when the last basis is still optimal,
        'highspy' or 'pyomo')."""
        col = self._reuse()
        if col is not None:
            obj = float(self._full_cost @ col)
            r = self._result("optimal", obj, col)
            r["via"] = "basis"
            return r
        ok, obj, col = self._run()
        if not ok:
            self._cache = None
            return self._result("infeasible", math.nan, None)
        self._remember(col)
        if col[self._qd].max(initial=0.0) > _QD_TOL:
            better = self._least_buffer(obj)
            if better is None:
                self._cache = None
                return self._via_pyomo()
            col = better
            if self._cache is not None:
                self._cache["col"] = col
        return self._result("optimal", obj, col)

    def _set_qd_upper(self, upper: np.ndarray) -> None:
        zeros = np.zeros(len(self._qd))
        self.h.changeColsBounds(len(self._qd), self._qd, zeros, upper)

    def _least_buffer(self, r1: float) -> np.ndarray | None:
        """Stages A, B, C of :meth:`FluidModel._least_buffer` on the highspy copy (None: use Pyomo)."""
        h, inf = self.h, self._highspy.kHighsInf
        floor = r1 - _FLOOR_RTOL * max(1.0, abs(r1))
        ub = np.where(np.isinf(self._qd_ub), inf, self._qd_ub)
        nq = len(self._qd)
        try:
            # A: the optimum with no decode buffer at all
            self._set_qd_upper(np.zeros(nq))
            ok, obj, col = self._run()
            if ok and obj >= floor:
                return col
            self._set_qd_upper(ub)
            # B: the least total buffer among points within 1e-9 (relative) of the optimum
            row = self._rows["objective_floor"]
            for c, v in zip(self._obj_cols, self._cost):
                h.changeCoeff(row, int(c), float(v))
            ncols = len(self._obj_cols)
            h.changeColsCost(ncols, self._obj_cols, np.zeros(ncols))
            if len(self._soft):
                h.changeColsCost(len(self._soft), self._soft, np.zeros(len(self._soft)))
            h.changeColsCost(nq, self._qd, -np.ones(nq))
            h.changeRowBounds(row, floor, inf)
            try:
                ok, _, col_b = self._run()
            finally:
                h.changeRowBounds(row, -inf, inf)
                h.changeColsCost(nq, self._qd, np.zeros(nq))
                h.changeColsCost(ncols, self._obj_cols, self._cost)
                if len(self._soft):
                    h.changeColsCost(len(self._soft), self._soft, self._soft_cost)
            if not ok:
                return None
            # C: back to the exact optimum with the buffer capped at B's (plus 1e-6 relative)
            qd = col_b[self._qd]
            self._set_qd_upper(np.where(qd > _QD_TOL, np.minimum(ub, qd * (1 + 1e-6)), 0.0))
            ok, obj, col = self._run()
            if ok and obj >= floor:
                return col
            return col_b
        finally:
            self._set_qd_upper(ub)

    def _via_pyomo(self) -> dict:
        sol = self.solution()
        return {"status": sol.status, "objective_per_gpu": sol.objective_per_gpu, "revenue_per_gpu": sol.revenue_per_gpu,
                "x": np.array(sol.x), "throughput": np.array(sol.throughput),
                "served_fraction": np.array(sol.served_fraction), "via": "pyomo"}

    def solution(self):
        """The full :class:`FluidSolution` (duals, SLI shadow prices) at the current data, through Pyomo."""
        self.fm.update(self.scenario, slis=self.slis, pricing=self.pricing)
        return self.fm.solve(raise_infeasible=False)

    def _result(self, status: str, obj: float, col: np.ndarray | None) -> dict:
        I = len(self.class_names)
        if col is None:
            nan = np.full(I, math.nan)
            return {"status": status, "objective_per_gpu": math.nan, "revenue_per_gpu": math.nan, "x": nan,
                    "throughput": nan, "served_fraction": nan, "via": "highspy"}
        r = self._rates
        x, ym, ys = col[self._x], col[self._ym], col[self._ys]
        thr = r.mu_m * ym + r.mu_s * ys
        revenue = float(self._cost @ np.concatenate([x, ym, ys]))
        return {"status": status, "objective_per_gpu": obj, "revenue_per_gpu": revenue, "x": x, "throughput": thr,
                "served_fraction": thr / r.lam, "via": "highspy"}
