"""Service-level indicators (SLIs) for the fluid LP (docs/lp.md).

Each SLI is a frozen dataclass. ``penalty=None`` makes it a hard constraint; a number ``w >= 0``
makes it soft: the LP may violate the bound by ``v >= 0`` and pays ``w * v`` per GPU per second
(the same units as revenue). The violation ``v`` is measured in the SLI's own units (occupancy,
seconds, fraction), except for TPOT, see :class:`TPOT`.

This module is pure Python (no Pyomo), so the CLI can parse ``--sli`` specs cheaply.

Each SLI owns its LP rows (:meth:`SLIBase.rows`): linear rows over the per-GPU fluid variables
(``x``, ``y_mixed``, ``y_solo``, ``q_prefill``, ``q_decode``, indexed by class, plus the SLI's own
free helper variables), each with a right-hand side split into a part that scales with the number
of GPUs and one that does not. The per-GPU LP (:mod:`fluidopt.fluid.lp`, and the direct highspy
path that copies it) adds them as they are; the capacity LP in n (:mod:`fluidopt.fluid.capacity`)
homogenises them by n. An SLI's rows are written here once and nowhere else.

Spec syntax (``--sli`` on the command line, :func:`parse_sli` in Python)::

    tpot=0.03                      average time per output token <= 0.03 s
    prefill_fairness=0.05          max_i x_i - min_i x_i <= 0.05 (prefill occupancy per GPU)
    decode_fairness=0.5            max_i y_s,i - min_i y_s,i <= 0.5 (solo decode slots per GPU)
    served:CLASS=0.9               served fraction of CLASS >= 0.9
    wait:CLASS=2.0                 mean prefill wait of CLASS <= 2.0 s
    tpot=0.03:penalty=100          any of the above, soft, with weight 100 per unit of violation

``served_fraction:`` and ``prefill_wait:`` are accepted for ``served:`` and ``wait:``. A class name
may contain ``:`` but not ``=``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from fluidopt.core.errors import ScenarioError

if TYPE_CHECKING:
    from fluidopt.core.model import GPUProfile, Rates

__all__ = [
    "SLI",
    "SLI_SPEC_HELP",
    "FLUID_VARIABLES",
    "RowData",
    "SLIBase",
    "SLIRow",
    "SLISpecs",
    "TPOT",
    "DecodeFairness",
    "MaxPrefillWait",
    "MinServedFraction",
    "PrefillFairness",
    "parse_sli",
    "parse_slis",
    "slis_of",
    "validate_slis",
]

SLI_SPEC_HELP = (
    "SLI spec: tpot=SECONDS | prefill_fairness=ETA | decode_fairness=ETA | served:CLASS=FRACTION | "
    "wait:CLASS=SECONDS, optionally followed by :penalty=WEIGHT (soft constraint; weight in revenue "
    "per GPU per second per unit of violation)"
)


def _number(where: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ScenarioError(f"{where}.{name}: expected a number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ScenarioError(f"{where}.{name}: expected a finite number, got {value!r}")
    return value


def _check_penalty(where: str, penalty: float | None) -> None:
    if penalty is None:
        return
    p = _number(where, "penalty", penalty)
    if p < 0:
        raise ScenarioError(f"{where}.penalty: expected a weight >= 0 (or None for a hard constraint), got {p!r}")


def _check_class(where: str, cls: object) -> None:
    if not isinstance(cls, str) or not cls:
        raise ScenarioError(f"{where}.cls: expected a non-empty class name, got {cls!r}")

FLUID_VARIABLES = ("x", "y_mixed", "y_solo", "q_prefill", "q_decode")  # indexed by class, per GPU


@dataclass(frozen=True)
class RowData:
    """What an SLI's rows are computed from.

    ``rates``: per GPU in the per-GPU LP (``Scenario.rates()``); in the capacity LP the same with
    ``lam`` the cluster's arrival rates (requests/s), its variables being cluster totals. ``gpu``: the
    GPU profile (batch, tau_mix, gamma).
    """

    class_names: tuple[str, ...]
    rates: Rates
    gpu: GPUProfile

    def index(self, cls: str) -> int:
        return self.class_names.index(cls)


@dataclass(frozen=True)
class SLIRow:
    """One linear row of an SLI: sum of coef * variable (``sense``) rhs + rhs_per_gpu * n.

    ``terms``: (variable, class, coefficient); variable is one of :data:`FLUID_VARIABLES` with a class
    name, or a tuple of class names (one coefficient on their sum: one parameter, not one per class), or
    one of the SLI's ``helpers`` (free variables) with class None. In the per-GPU LP n = 1;
    the capacity LP, whose variables are n times the per-GPU ones, keeps n as a variable. ``name``:
    the row's name in duals and infeasibility reports (``base`` or ``base[index]``). ``main``: the
    SLI's own row, whose dual is d objective / d bound and into which a soft SLI's violation enters.
    ``fixed``: the row's coefficients and right-hand side depend neither on the data nor on the bound;
    the per-GPU LP then writes them as constants instead of parameters (faster re-solves).
    """

    name: str
    terms: tuple[tuple[str, str | tuple[str, ...] | None, float], ...]
    sense: str  # "<=" or ">="
    rhs: float = 0.0
    rhs_per_gpu: float = 0.0
    main: bool = False
    fixed: bool = False

    def __post_init__(self) -> None:
        if self.sense not in ("<=", ">="):
            raise ScenarioError(f"SLI row {self.name}: sense: expected '<=' or '>=', got {self.sense!r}")

    @property
    def per_gpu_rhs(self) -> float:
        """The right-hand side in the per-GPU LP (n = 1)."""
        return self.rhs + self.rhs_per_gpu


class SLIBase:
    """What every SLI provides: ``kind``, ``key``, ``bound``, ``penalty`` and its LP rows.

    A subclass is a frozen dataclass; it sets ``kind`` (its spec name), ``bound_field`` (the field
    :attr:`bound` reads and :meth:`with_bound` moves), ``helpers`` (names of free helper variables
    its rows use) and ``order`` (its rows' place in the per-GPU LP: the built-ins keep the order of
    before, so HiGHS's pivots, hence the vertex reported on a degenerate LP, do not move), and
    writes :meth:`rows`.
    """

    kind: ClassVar[str] = ""
    bound_field: ClassVar[str] = ""
    helpers: ClassVar[tuple[str, ...]] = ()
    order: ClassVar[int] = 100
    penalty: float | None

    @property
    def key(self) -> str:
        return self.kind

    @property
    def bound(self) -> float:
        return float(getattr(self, self.bound_field))

    def with_bound(self, bound: float):
        """The same SLI with another bound."""
        return replace(self, **{self.bound_field: float(bound)})

    def rows(self, d: RowData) -> tuple[SLIRow, ...]:
        """The SLI's rows for the data ``d`` (the same names and variables for any data)."""
        raise NotImplementedError(f"{type(self).__name__}.rows")

    def unattainable(self, gpu: GPUProfile) -> str | None:
        """Why no fleet size can meet this SLI on ``gpu`` (None: it may be met)."""
        return None


def _spread_rows(key: str, var: str, eta: float, classes: Sequence[str]) -> tuple[SLIRow, ...]:
    """max_i var_i - min_i var_i <= eta with helpers var_max, var_min: 2I + 1 rows (not I(I-1))."""
    hi, lo = f"{var}_max", f"{var}_min"
    return (
        *(SLIRow(f"{key}_max[{c}]", ((var, c, 1.0), (hi, None, -1.0)), "<=", fixed=True) for c in classes),
        *(SLIRow(f"{key}_min[{c}]", ((lo, None, 1.0), (var, c, -1.0)), "<=", fixed=True) for c in classes),
        SLIRow(key, ((hi, None, 1.0), (lo, None, -1.0)), "<=", 0.0, eta, main=True),
    )


@dataclass(frozen=True)
class PrefillFairness(SLIBase):
    """max_i x_i - min_i x_i <= eta (prefill occupancy, slots per GPU; paper's eta_1).

    Linearised with two auxiliary variables (u >= x_i >= l, u - l <= eta): 2I + 1 rows instead of
    I(I-1) pairwise rows, same feasible set. The dual of row ``prefill_fairness`` is d objective / d eta.
    """

    eta: float
    penalty: float | None = None
    kind: ClassVar[str] = "prefill_fairness"
    bound_field: ClassVar[str] = "eta"
    helpers: ClassVar[tuple[str, ...]] = ("x_max", "x_min")
    order: ClassVar[int] = 0

    def __post_init__(self) -> None:
        w = "sli.prefill_fairness"
        if _number(w, "eta", self.eta) < 0:
            raise ScenarioError(f"{w}.eta: expected a bound >= 0 (occupancy per GPU), got {self.eta!r}")
        _check_penalty(w, self.penalty)

    def rows(self, d: RowData) -> tuple[SLIRow, ...]:
        return _spread_rows(self.key, "x", self.bound, d.class_names)


@dataclass(frozen=True)
class DecodeFairness(SLIBase):
    """max_i y_s,i - min_i y_s,i <= eta (solo decode slots per GPU; paper's eta_2)."""

    eta: float
    penalty: float | None = None
    kind: ClassVar[str] = "decode_fairness"
    bound_field: ClassVar[str] = "eta"
    helpers: ClassVar[tuple[str, ...]] = ("y_solo_max", "y_solo_min")
    order: ClassVar[int] = 1

    def __post_init__(self) -> None:
        w = "sli.decode_fairness"
        if _number(w, "eta", self.eta) < 0:
            raise ScenarioError(f"{w}.eta: expected a bound >= 0 (solo decode slots per GPU), got {self.eta!r}")
        _check_penalty(w, self.penalty)

    def rows(self, d: RowData) -> tuple[SLIRow, ...]:
        return _spread_rows(self.key, "y_solo", self.bound, d.class_names)


@dataclass(frozen=True)
class TPOT(SLIBase):
    """Average time per output token <= max_seconds (paper's eta_3).

    TPOT(X) = [tau (B-1) X + (B/gamma) (1-X)] / (B - X), X = sum_i x_i: the slot-weighted mean
    iteration time when mixed GPUs hold B-1 decodes and solo GPUs B. Multiplied out and divided by B
    it is the linear row ``tpot``: (N(X) - eta (B - X)) / B <= 0 (seconds). As a penalty the
    violation is v = (TPOT - eta) (B - X) / B, i.e. the excess in seconds times a factor in
    [(B-1)/B, 1]. Below 1/gamma (a solo GPU's iteration time) it cannot hold at all.
    """

    max_seconds: float
    penalty: float | None = None
    kind: ClassVar[str] = "tpot"
    bound_field: ClassVar[str] = "max_seconds"
    order: ClassVar[int] = 2

    def __post_init__(self) -> None:
        w = "sli.tpot"
        if _number(w, "max_seconds", self.max_seconds) <= 0:
            raise ScenarioError(f"{w}.max_seconds: expected a time per output token > 0 s, got {self.max_seconds!r}")
        _check_penalty(w, self.penalty)

    def rows(self, d: RowData) -> tuple[SLIRow, ...]:
        # (N(X) - eta (B - X)) / B <= 0, N(X) = tau (B-1) X + (B/gamma)(1-X), X = sum_i x_i, rewritten as
        # coef * X <= eta - 1/gamma (seconds; per GPU, so n (eta - 1/gamma) in the capacity LP).
        g = d.gpu
        B = float(g.batch)
        eta = self.bound
        coef = (g.tau_mix * (B - 1) - B / g.gamma + eta) / B
        return (SLIRow("tpot", (("x", d.class_names, coef),), "<=", 0.0, eta - 1.0 / g.gamma, main=True),)

    def unattainable(self, gpu: GPUProfile) -> str | None:
        if self.max_seconds <= gpu.tau_solo:
            return (f"no fleet size meets TPOT <= {self.max_seconds:g} s because the GPU law's solo decode time is "
                    f"{gpu.tau_solo:.6g} s per token (1/gamma, profile {gpu.name or 'custom'}); TPOT is at least that")
        return None


@dataclass(frozen=True)
class MinServedFraction(SLIBase):
    """Served fraction of class ``cls`` >= fraction: mu_p,i x_i / lambda_i >= s_i.

    With SLIs the decode buffer is empty (q_d = 0), so every prefill completes its decode and this is
    also the fraction of arrivals that complete (1 - the abandonment probability).
    """

    cls: str
    fraction: float
    penalty: float | None = None
    kind: ClassVar[str] = "served"
    bound_field: ClassVar[str] = "fraction"
    order: ClassVar[int] = 3

    def __post_init__(self) -> None:
        w = "sli.served"
        _check_class(w, self.cls)
        w = f"sli.served[{self.cls}]"
        f = _number(w, "fraction", self.fraction)
        if not 0 <= f <= 1:
            raise ScenarioError(f"{w}.fraction: expected a fraction in [0, 1], got {self.fraction!r}")
        _check_penalty(w, self.penalty)

    @property
    def key(self) -> str:
        return f"served_fraction[{self.cls}]"

    def rows(self, d: RowData) -> tuple[SLIRow, ...]:
        k = d.index(self.cls)
        r = d.rates
        return (SLIRow(self.key, (("x", self.cls, float(r.mu_p[k] / r.lam[k])),), ">=", self.bound, main=True),)


@dataclass(frozen=True)
class MaxPrefillWait(SLIBase):
    """Mean prefill wait of class ``cls`` <= seconds: q_p,i / lambda_i <= W_i (Little's law).

    The wait is averaged over all arrivals of the class, including those that abandon. A class with
    theta_i = 0 has no fluid queue (q_p,i = 0), so the constraint always holds for it.
    """

    cls: str
    seconds: float
    penalty: float | None = None
    kind: ClassVar[str] = "wait"
    bound_field: ClassVar[str] = "seconds"
    order: ClassVar[int] = 4

    def __post_init__(self) -> None:
        w = "sli.wait"
        _check_class(w, self.cls)
        w = f"sli.wait[{self.cls}]"
        if _number(w, "seconds", self.seconds) < 0:
            raise ScenarioError(f"{w}.seconds: expected a mean wait >= 0 s, got {self.seconds!r}")
        _check_penalty(w, self.penalty)

    @property
    def key(self) -> str:
        return f"prefill_wait[{self.cls}]"

    def rows(self, d: RowData) -> tuple[SLIRow, ...]:
        k = d.index(self.cls)
        return (SLIRow(self.key, (("q_prefill", self.cls, float(1.0 / d.rates.lam[k])),), "<=", self.bound,
                       main=True),)


SLI = PrefillFairness | DecodeFairness | TPOT | MinServedFraction | MaxPrefillWait


def sli_spec(sli: SLI) -> str:
    """The spec string of an SLI (the inverse of :func:`parse_sli`)."""
    if getattr(sli, "cls", None) is not None:
        s = f"{sli.kind}:{sli.cls}={sli.bound:g}"
    else:
        s = f"{sli.kind}={sli.bound:g}"
    if sli.penalty is not None:
        s += f":penalty={sli.penalty:g}"
    return s


def _parse_float(where: str, what: str, text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ScenarioError(f"{where}: expected a number for {what}, got {text!r}") from None
    if not math.isfinite(v):
        raise ScenarioError(f"{where}: expected a finite number for {what}, got {text!r}")
    return v


_CLASS_KINDS = {"served": MinServedFraction, "served_fraction": MinServedFraction,
                "wait": MaxPrefillWait, "prefill_wait": MaxPrefillWait}
_GLOBAL_KINDS = {"tpot": TPOT, "prefill_fairness": PrefillFairness, "decode_fairness": DecodeFairness}


def parse_sli(spec: str, *, where: str = "SLI spec") -> SLI:
    """Parse one SLI spec such as ``tpot=0.03``, ``served:short=0.9`` or ``tpot=0.03:penalty=100``.

    Raises :class:`~fluidopt.core.errors.ScenarioError` naming the spec and what was expected.
    """
    if not isinstance(spec, str):
        raise ScenarioError(f"{where}: expected a string such as 'tpot=0.03', got {spec!r}")
    w = f"{where} {spec!r}"
    name, eq, rest = spec.strip().partition("=")
    name = name.strip()
    if not eq or not name:
        raise ScenarioError(f"{w}: expected NAME=VALUE; {SLI_SPEC_HELP}")
    value_text, *options = rest.split(":")
    penalty: float | None = None
    for opt in options:
        k, eq2, v = opt.partition("=")
        if k.strip() != "penalty" or not eq2:
            raise ScenarioError(f"{w}: unknown option {opt!r}; the only option is ':penalty=WEIGHT'")
        if penalty is not None:
            raise ScenarioError(f"{w}: ':penalty=' given twice")
        penalty = _parse_float(w, "the penalty weight", v.strip())
    value = _parse_float(w, "the bound", value_text.strip())
    kind, colon, cls = name.partition(":")
    kind = kind.strip()
    try:
        if colon:
            if kind not in _CLASS_KINDS:
                raise ScenarioError(
                    f"{w}: unknown per-class SLI {kind!r}; expected served:CLASS or wait:CLASS"
                )
            if not cls:
                raise ScenarioError(f"{w}: missing class name after {kind + ':'!r}")
            return _CLASS_KINDS[kind](cls, value, penalty)
        if kind in _CLASS_KINDS:
            raise ScenarioError(f"{w}: {kind!r} needs a class, e.g. {kind}:CLASS={value_text.strip()}")
        if kind not in _GLOBAL_KINDS:
            raise ScenarioError(
                f"{w}: unknown SLI {kind!r}; expected one of tpot, prefill_fairness, decode_fairness, "
                "served:CLASS, wait:CLASS"
            )
        return _GLOBAL_KINDS[kind](value, penalty)
    except ScenarioError as e:
        msg = str(e)
        if msg.startswith(w):
            raise
        raise ScenarioError(f"{w}: {msg}") from None


def parse_slis(specs: Iterable[str], *, where: str = "SLI spec") -> tuple[SLI, ...]:
    """Parse several specs (see :func:`parse_sli`)."""
    return tuple(parse_sli(s, where=where) for s in specs)


class SLISpecs(tuple):
    """SLI spec strings as written (a tuple of str: for display, ``==`` and TOML round trips) that carry
    their SLI objects, parsed and validated once (``.slis``). A scenario file's ``slis`` is stored so."""

    slis: tuple[SLI, ...]

    def __new__(cls, specs: Iterable[str], slis: Iterable[SLI]) -> SLISpecs:
        self = super().__new__(cls, tuple(specs))
        self.slis = tuple(slis)
        if len(self.slis) != len(self):
            raise ScenarioError(f"slis: {len(self)} spec strings but {len(self.slis)} SLI objects")
        return self

    def __getnewargs__(self):  # pickling and copying keep the parsed objects
        return tuple(self), self.slis


def slis_of(specs: Iterable[str] | None, *, where: str = "slis") -> tuple[SLI, ...]:
    """The SLI objects of spec strings: those parsed once when ``specs`` is an :class:`SLISpecs`,
    else parsed now (a hand-made tuple of strings); () for None or none."""
    if isinstance(specs, SLISpecs):
        return specs.slis
    return parse_slis(list(specs), where=where) if specs else ()


def validate_slis(slis: Sequence[SLI] | None, class_names: Sequence[str]) -> tuple[SLI, ...]:
    """Check SLI objects against a scenario's classes: known types, known classes, no duplicates."""
    if slis is None:
        return ()
    if isinstance(slis, (str, SLIBase)):
        slis = (slis,)
    out: list[SLI] = []
    seen: dict[str, SLI] = {}
    for s in slis:
        if isinstance(s, str):
            s = parse_sli(s)
        if not isinstance(s, SLIBase):
            raise ScenarioError(
                f"slis: expected SLI objects (PrefillFairness, DecodeFairness, TPOT, MinServedFraction, "
                f"MaxPrefillWait, or another SLIBase) or spec strings, got {s!r} ({type(s).__name__})"
            )
        cls = getattr(s, "cls", None)
        if cls is not None and cls not in class_names:
            raise ScenarioError(
                f"sli {sli_spec(s)!r}: unknown class {cls!r}; the scenario's classes are {', '.join(class_names)}"
            )
        if s.key in seen:
            raise ScenarioError(f"sli {s.key}: given twice ({sli_spec(seen[s.key])!r} and {sli_spec(s)!r})")
        seen[s.key] = s
        out.append(s)
    return tuple(out)
