"""Demand that responds to price: a class's arrival rate as a function of its price per request.

A class may carry a :class:`Demand` (``[classes.demand]`` in a scenario file). Its arrival rate then
depends on the class's price per request P (currency per request: c_p * prompt + c_d * decode under
token pricing, or a price set per class):

- ``linear``: rate = max_rate - slope * P, floored at 0 (requests per second, whole cluster);
- ``constant-elasticity``: rate = rate_ref * (P / price_ref) ** (-elasticity);
- ``logit``: a multinomial-logit choice among the classes of one ``market``: a shared
  ``market_size`` (potential requests per second), each class a ``utility`` intercept, a common
  ``price_sensitivity`` b (per unit of currency), and, by default, the outside option (not buying,
  utility 0): rate_i = market_size * exp(u_i - b P_i) / (1 + sum_j exp(u_j - b P_j)).

The parameters here are absolute (the curve does not move when the scenario's prices change); the
scenario reader (:mod:`fluidopt.scenario`) derives the missing ones from the class's ``rate`` at the
reference price, so ``rate`` keeps its meaning. Pure functions, numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fluidopt.core.errors import ScenarioError

__all__ = ["DEMAND_MODELS", "Demand", "demand_rates", "check_markets", "price_per_request", "has_demand"]

DEMAND_MODELS = ("linear", "constant-elasticity", "logit")
_MAX = 1e12


def _num(where: str, name: str, value: object, *, positive: bool = True, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ScenarioError(f"{where}.{name}: expected a number, got {value!r} ({type(value).__name__})")
    v = float(value)
    if not math.isfinite(v) or abs(v) > _MAX:
        raise ScenarioError(f"{where}.{name}: expected a finite number of magnitude at most {_MAX:g}, got {value!r}")
    if positive and (v < 0 or (v == 0 and not allow_zero)):
        raise ScenarioError(f"{where}.{name}: expected a number {'>=' if allow_zero else '>'} 0, got {value!r}")
    return v


@dataclass(frozen=True)
class Demand:
    """How one class's arrival rate (requests/s, whole cluster) responds to its price per request.

    ``model``: 'linear' (``max_rate``, ``slope``: requests/s per unit of price), 'constant-elasticity'
    (``rate_ref`` requests/s at ``price_ref``, ``elasticity`` > 0) or 'logit' (``market``,
    ``market_size`` requests/s, ``utility``, ``price_sensitivity`` per unit of price,
    ``outside_option``). Fields another model uses must be left at None.
    """

    model: str
    max_rate: float | None = None
    slope: float | None = None
    rate_ref: float | None = None
    price_ref: float | None = None
    elasticity: float | None = None
    market: str | None = None
    market_size: float | None = None
    utility: float | None = None
    price_sensitivity: float | None = None
    outside_option: bool = True
    where: str = field(default="demand", compare=False, repr=False)  # the field path errors name

    _FIELDS = {
        "linear": ("max_rate", "slope"),
        "constant-elasticity": ("rate_ref", "price_ref", "elasticity"),
        "logit": ("market", "market_size", "utility", "price_sensitivity"),
    }

    def __post_init__(self) -> None:
        w = self.where
        if self.model not in DEMAND_MODELS:
            raise ScenarioError(f"{w}.model: expected one of {', '.join(DEMAND_MODELS)}, got {self.model!r}")
        need = self._FIELDS[self.model]
        for f in ("max_rate", "slope", "rate_ref", "price_ref", "elasticity", "market", "market_size", "utility",
                  "price_sensitivity"):
            v = getattr(self, f)
            if f in need and v is None:
                raise ScenarioError(f"{w}.{f}: missing, needed by model = {self.model!r}")
            if f not in need and v is not None:
                raise ScenarioError(f"{w}.{f}: not a parameter of model = {self.model!r} "
                                    f"(its parameters: {', '.join(need)})")
        if self.model == "linear":
            _num(w, "max_rate", self.max_rate)
            _num(w, "slope", self.slope)
        elif self.model == "constant-elasticity":
            _num(w, "rate_ref", self.rate_ref)
            _num(w, "price_ref", self.price_ref)
            _num(w, "elasticity", self.elasticity)
        else:
            if not isinstance(self.market, str) or not self.market:
                raise ScenarioError(f"{w}.market: expected a non-empty string, got {self.market!r}")
            _num(w, "market_size", self.market_size)
            _num(w, "utility", self.utility, positive=False)
            _num(w, "price_sensitivity", self.price_sensitivity)
            if not isinstance(self.outside_option, bool):
                raise ScenarioError(f"{w}.outside_option: expected true or false, got {self.outside_option!r}")

    def to_dict(self) -> dict:
        """The TOML table (``[classes.demand]``) with the absolute parameters."""
        d: dict = {"model": self.model}
        for f in self._FIELDS[self.model]:
            d[f] = getattr(self, f)
        if self.model == "logit" and not self.outside_option:
            d["outside_option"] = False
        return d

    def rate(self, price: float) -> float:
        """Arrival rate (requests/s) at ``price`` per request (linear and constant-elasticity only)."""
        if self.model == "linear":
            return max(0.0, self.max_rate - self.slope * float(price))
        if self.model == "constant-elasticity":
            if price <= 0:
                return math.inf
            return self.rate_ref * (float(price) / self.price_ref) ** (-self.elasticity)
        raise ValueError("a logit class's rate depends on its whole market: use demand_rates()")


def has_demand(classes: Sequence) -> bool:
    """Whether any class carries a demand model."""
    return any(getattr(c, "demand", None) is not None for c in classes)


def price_per_request(classes: Sequence, prefill_price: float, decode_price: float) -> np.ndarray:
    """Price per request of each class: c_p * prompt + c_d * decode (a class's own token prices first)."""
    return np.array([(prefill_price if c.prefill_price is None else c.prefill_price) * c.prompt
                     + (decode_price if c.decode_price is None else c.decode_price) * c.decode for c in classes])


def markets(classes: Sequence) -> dict[str, list[int]]:
    """Logit markets: name -> indices of the classes in it, in class order."""
    out: dict[str, list[int]] = {}
    for i, c in enumerate(classes):
        d = getattr(c, "demand", None)
        if d is not None and d.model == "logit":
            out.setdefault(d.market, []).append(i)
    return out


def logit_shares(utility: np.ndarray, sensitivity: float, prices: np.ndarray, outside: bool) -> np.ndarray:
    """Market shares exp(u_i - b P_i) / (outside + sum_j exp(u_j - b P_j)), computed stably."""
    v = np.asarray(utility, float) - sensitivity * np.asarray(prices, float)
    top = max(float(np.max(v)), 0.0 if outside else -math.inf)
    e = np.exp(v - top)
    return e / ((math.exp(-top) if outside else 0.0) + e.sum())


def demand_rates(classes: Sequence, prices: Sequence[float]) -> np.ndarray:
    """Arrival rate of every class (requests/s, whole cluster) at ``prices`` per request; a class
    without a demand model keeps its ``rate``."""
    p = np.asarray(prices, dtype=float)
    out = np.array([float(c.rate) for c in classes])
    for i, c in enumerate(classes):
        d = getattr(c, "demand", None)
        if d is not None and d.model != "logit":
            out[i] = d.rate(p[i])
    for idx in markets(classes).values():
        d0 = classes[idx[0]].demand
        u = np.array([classes[i].demand.utility for i in idx])
        out[idx] = d0.market_size * logit_shares(u, d0.price_sensitivity, p[idx], d0.outside_option)
    return out


def check_markets(classes: Sequence) -> None:
    """Every class of a logit market shares its size, price sensitivity and outside option; a market
    without the outside option needs two classes or more (else its class gets the whole market at any
    price, and the price does nothing)."""
    for name, idx in markets(classes).items():
        d0 = classes[idx[0]].demand
        for i in idx[1:]:
            d = classes[i].demand
            for f in ("market_size", "price_sensitivity", "outside_option"):
                if getattr(d, f) != getattr(d0, f):
                    raise ScenarioError(
                        f"classes[{classes[i].name}].demand.{f}: expected {getattr(d0, f)!r}, the value of class "
                        f"{classes[idx[0]].name!r} in logit market {name!r}, got {getattr(d, f)!r}")
        if not d0.outside_option and len(idx) < 2:
            raise ScenarioError(
                f"classes[{classes[idx[0]].name}].demand: logit market {name!r} has one class and no outside option "
                f"(outside_option = false): that class gets the whole market at any price; expected two classes "
                f"or more in the market, or outside_option = true")


# -- reading [classes.demand] tables ----------------------------------------------------------------
_TABLE_KEYS = {
    "linear": {"model", "slope", "max_rate", "price_ref"},
    "constant-elasticity": {"model", "elasticity", "price_ref", "rate_ref"},
    "logit": {"model", "market", "market_size", "price_sensitivity", "utility", "outside_option", "price_ref"},
}
_RTOL = 1e-4  # how far a class's rate may sit off a fully given curve (pasted, rounded parameters)


def _off_curve(where: str, what: str, rate: float, on_curve: float, price: float) -> None:
    if abs(rate - on_curve) > _RTOL * max(abs(rate), abs(on_curve)):
        raise ScenarioError(
            f"{where}: the class's rate ({rate:g} requests/s) must lie on its demand curve at the reference price "
            f"{price:g}, where {what} gives {on_curve:.6g}; fix the rate, or give fewer parameters and let them be "
            f"derived from the rate")


def demands_from_tables(tables: Sequence, classes: Sequence, prefill_price: float, decode_price: float) -> tuple:
    """Attach the :class:`Demand` of each ``[classes.demand]`` table to its class.

    The reference price of a class is its ``price_ref`` (per request) or, by default, its price per request
    at the scenario's prices; the curve passes through (reference price, the class's ``rate``), and the
    parameters not given are derived from that point. A curve given in full must pass through it.
    """
    from dataclasses import replace

    ref = price_per_request(classes, prefill_price, decode_price)
    out = list(classes)
    logit: dict[str, list[tuple[int, dict, float]]] = {}
    for i, (t, c) in enumerate(zip(tables, classes)):
        if not isinstance(t, dict) or "demand" not in t:
            continue
        w = f"classes[{i}].demand"
        d = t["demand"]
        if not isinstance(d, dict):
            raise ScenarioError(f"{w}: expected a table ([classes.demand]), got {d!r} ({type(d).__name__})")
        model = d.get("model")
        if model not in DEMAND_MODELS:
            raise ScenarioError(f"{w}.model: expected one of {', '.join(DEMAND_MODELS)}, got {model!r}")
        unknown = sorted(set(d) - _TABLE_KEYS[model])
        if unknown:
            raise ScenarioError(f"{w}: unknown key {unknown[0]!r} for model = {model!r}; expected one of "
                                f"{', '.join(sorted(_TABLE_KEYS[model]))}")
        p0 = _num(w, "price_ref", d["price_ref"]) if "price_ref" in d else float(ref[i])
        rate = float(c.rate)
        if model == "linear":
            if "slope" not in d and "max_rate" not in d:
                raise ScenarioError(f"{w}.slope: missing (give slope, or max_rate, or both)")
            if "slope" in d:
                slope = _num(w, "slope", d["slope"])
                max_rate = rate + slope * p0
                if "max_rate" in d:
                    given = _num(w, "max_rate", d["max_rate"])
                    _off_curve(w, "max_rate - slope * price", rate, given - slope * p0, p0)
                    max_rate = given
            else:
                max_rate = _num(w, "max_rate", d["max_rate"])
                if p0 <= 0 or max_rate <= rate:
                    raise ScenarioError(f"{w}.max_rate: expected a number above the class's rate {rate:g} (and a "
                                        f"reference price > 0, got {p0:g}) to derive the slope, got {max_rate!r}")
                slope = (max_rate - rate) / p0
            out[i] = replace(c, demand=Demand("linear", max_rate=max_rate, slope=slope, where=w))
        elif model == "constant-elasticity":
            if "elasticity" not in d:
                raise ScenarioError(f"{w}.elasticity: missing, needed by model = 'constant-elasticity'")
            e = _num(w, "elasticity", d["elasticity"])
            if p0 <= 0:
                raise ScenarioError(f"{w}.price_ref: expected a reference price > 0 (the class's price per request at "
                                    f"the scenario's prices is {float(ref[i]):g}), got {p0:g}")
            rate_ref = rate
            if "rate_ref" in d:
                rate_ref = _num(w, "rate_ref", d["rate_ref"])
                _off_curve(w, "rate_ref * (price / price_ref) ** -elasticity", rate,
                           rate_ref * (float(ref[i]) / p0) ** (-e) if ref[i] > 0 else math.inf, float(ref[i]))
            out[i] = replace(c, demand=Demand("constant-elasticity", rate_ref=rate_ref, price_ref=p0, elasticity=e,
                                              where=w))
        else:
            logit.setdefault(str(d.get("market", "")), []).append((i, d, p0))
    for _name, members in logit.items():
        for i, d, _p0 in members:
            w = f"classes[{i}].demand"
            for k in ("market", "market_size", "price_sensitivity"):
                if k not in d:
                    raise ScenarioError(f"{w}.{k}: missing, needed by model = 'logit'")
            if "outside_option" in d and not isinstance(d["outside_option"], bool):
                raise ScenarioError(f"{w}.outside_option: expected true or false, got {d['outside_option']!r}")
        i0, d0, _ = members[0]
        w0 = f"classes[{i0}].demand"
        size = _num(w0, "market_size", d0["market_size"])
        b = _num(w0, "price_sensitivity", d0["price_sensitivity"])
        outside = bool(d0.get("outside_option", True))
        if not outside and len(members) < 2:
            raise ScenarioError(
                f"{w0}: logit market {d0['market']!r} has one class and no outside option (outside_option = false): "
                f"that class gets the whole market at any price; expected two classes or more in the market, or "
                f"outside_option = true")
        idx = [i for i, _, _ in members]
        p0 = np.array([p for _, _, p in members])
        rates = np.array([float(classes[i].rate) for i in idx])
        given = ["utility" in d for _, d, _ in members]
        if any(given) and not all(given):
            j = given.index(not given[0])
            raise ScenarioError(f"classes[{idx[j]}].demand.utility: give a utility for every class of logit market "
                                f"{d0['market']!r} or for none (then they are derived from the rates)")
        if all(given):
            u = np.array([_num(f"classes[{i}].demand", "utility", d["utility"], positive=False) for i, d, _ in members])
            on = size * logit_shares(u, b, p0, outside)
            for k, i in enumerate(idx):
                _off_curve(f"classes[{i}].demand", "the logit market", rates[k], float(on[k]), float(p0[k]))
        else:
            s = rates / size
            s0 = 1.0 - s.sum()
            if outside and s0 <= 0:
                raise ScenarioError(f"{w0}.market_size: expected more than the sum of the rates of logit market "
                                    f"{d0['market']!r} ({rates.sum():g} requests/s; the rest is the outside option), "
                                    f"got {size:g}")
            if not outside and abs(s0) > _RTOL:
                raise ScenarioError(f"{w0}.market_size: without the outside option the rates of logit market "
                                    f"{d0['market']!r} must add up to market_size ({rates.sum():g}), got {size:g}")
            u = np.log(s / s0) + b * p0 if outside else np.log(s) + b * p0
        for k, (i, d, _) in enumerate(members):
            dd = Demand("logit", market=str(d["market"]), market_size=_num(f"classes[{i}].demand", "market_size",
                                                                            d["market_size"]),
                        utility=float(u[k]),
                        price_sensitivity=_num(f"classes[{i}].demand", "price_sensitivity", d["price_sensitivity"]),
                        outside_option=bool(d.get("outside_option", True)), where=f"classes[{i}].demand")
            out[i] = replace(classes[i], demand=dd)
    check_markets(out)
    return tuple(out)
