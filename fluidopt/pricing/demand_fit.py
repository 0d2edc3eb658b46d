"""Demand fitted from observations: read (price, rate) observations per class, fit each class's demand
model by regression (statsmodels; linear, constant-elasticity, logit), and write the fit as the
scenario's ``[demand]`` tables (``fluidopt price SCENARIO --fit-demand OBS.csv``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from fluidopt.core.errors import UsageError

__all__ = ["FIT_COLUMNS", "demand_toml", "fit_demand", "read_observations"]

FIT_COLUMNS = ("class", "price", "rate")


def _shown(v) -> str:
    """A cell as the file has it: a text quoted, a number plain (not ``np.int64(-1)``)."""
    return repr(v) if isinstance(v, str) else f"{v:g}" if isinstance(v, (int, float, np.number)) else repr(v)


def read_observations(path) -> pd.DataFrame:
    """A CSV of observations: columns ``class``, ``price`` (per request) and ``rate`` (requests/s)."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise UsageError(f"--fit-demand: {p} is a folder, expected a CSV file")
    if not p.is_file():
        raise UsageError(f"--fit-demand: {p}: no such file")
    try:
        # comment lines ('#') and blank lines above the header are skipped, not read as the header
        lead = 0
        with open(p, encoding="utf-8-sig") as f:
            for line in f:
                if line.strip() and not line.lstrip().startswith("#"):
                    break
                lead += 1
        df = pd.read_csv(p, skiprows=lead, encoding="utf-8-sig")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UsageError(f"--fit-demand: {p}: not a readable CSV ({' '.join(str(e).split())})") from None
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in FIT_COLUMNS if c not in df.columns]
    if missing:
        raise UsageError(f"--fit-demand: {p}: missing column {missing[0]!r}; expected columns "
                         f"{', '.join(FIT_COLUMNS)} (class name, price per request, requests per second), "
                         f"got {', '.join(map(str, df.columns)) or 'none'}")
    if df.empty:
        raise UsageError(f"--fit-demand: {p}: no observations (expected rows of class, price, rate)")
    for c in ("price", "rate"):
        v = pd.to_numeric(df[c], errors="coerce")
        bad = df.index[~np.isfinite(v) | (v < 0)]
        if len(bad):
            raise UsageError(f"--fit-demand: {p}: row {int(bad[0]) + 2 + lead}, column {c!r}: expected a number >= 0, "
                             f"got {_shown(df[c].iloc[bad[0]])}")
        df[c] = v.astype(float)
    names = df["class"]
    empty = df.index[names.isna() | (names.astype(str).str.strip() == "")]
    if len(empty):
        raise UsageError(f"--fit-demand: {p}: row {int(empty[0]) + 2 + lead}, column 'class': expected a class name, got an "
                         "empty cell")
    df["class"] = names.astype(str).str.strip()
    return df[list(FIT_COLUMNS) + (["period"] if "period" in df.columns else [])]


def fit_demand(obs: pd.DataFrame, *, alpha: float = 0.05, market_size: float | None = None) -> pd.DataFrame:
    """Fit the linear and the constant-elasticity model to each class's observations (OLS, statsmodels).

    Linear: rate = max_rate - slope * price. Constant elasticity: log rate = log k - elasticity * log price
    (rows with price or rate 0 left out). One row per (class, model): estimates with ``1 - alpha`` CIs, and
    AIC from the residuals on the rate scale for both (n log(SSE/n) + 2k, so the two compare); ``best``
    marks the lower AIC per class. ``df.attrs['toml']``: the ``[classes.demand]`` tables to paste.

    ``market_size`` (requests/s): also fit the logit over all the classes as one market, from a ``period``
    column that groups simultaneous observations: ln(rate_i / M) - ln(s_0) = u_i - b price_i, s_0 the
    outside share of the period (OLS with a utility per class and a common price coefficient).
    """
    import statsmodels.api as sm

    rows = []
    for name, g in obs.groupby("class", sort=False):
        price, rate = g["price"].to_numpy(float), g["rate"].to_numpy(float)
        if len(g) < 3 or np.ptp(price) <= 0:
            raise UsageError(f"--fit-demand: class {name!r}: expected 3 observations or more at 2 prices or more, got "
                             f"{len(g)} at {len(np.unique(price))}")
        lin = sm.OLS(rate, sm.add_constant(price)).fit()
        ci = lin.conf_int(alpha)
        sse = float(np.sum(lin.resid ** 2))
        n = len(g)
        aic = n * math.log(max(sse, 1e-300) / n) + 4
        rows.append({"class": name, "model": "linear", "n": n, "param": "slope", "estimate": -lin.params[1],
                     "ci_low": -ci[1][1], "ci_high": -ci[1][0], "param2": "max_rate", "estimate2": lin.params[0],
                     "ci2_low": ci[0][0], "ci2_high": ci[0][1], "aic": aic, "r2": lin.rsquared})
        ok = (price > 0) & (rate > 0)
        if ok.sum() >= 3 and np.ptp(price[ok]) > 0:
            ce = sm.OLS(np.log(rate[ok]), sm.add_constant(np.log(price[ok]))).fit()
            ci = ce.conf_int(alpha)
            pred = np.exp(ce.params[0]) * price[ok] ** ce.params[1]
            sse = float(np.sum((rate[ok] - pred) ** 2))
            m = int(ok.sum())
            p_ref = float(np.median(price[ok]))
            rows.append({"class": name, "model": "constant-elasticity", "n": m, "param": "elasticity",
                         "estimate": -ce.params[1], "ci_low": -ci[1][1], "ci_high": -ci[1][0],
                         "param2": f"rate at price {p_ref:g}", "estimate2": float(np.exp(ce.params[0]) * p_ref ** ce.params[1]),
                         "ci2_low": np.nan, "ci2_high": np.nan,
                         "aic": m * math.log(max(sse, 1e-300) / m) + 4 if m == n else math.nan, "r2": ce.rsquared})
    if market_size is not None:
        rows += _fit_logit(obs, float(market_size), alpha)
    df = pd.DataFrame(rows)
    df["best"] = False
    for _name, g in df.groupby("class", sort=False):
        df.loc[g["aic"].idxmin() if g["aic"].notna().any() else g.index[0], "best"] = True
    df.attrs["toml"] = demand_toml(df)
    return df


def _fit_logit(obs: pd.DataFrame, M: float, alpha: float) -> list[dict]:
    import statsmodels.api as sm

    if not (math.isfinite(M) and M > 0):
        raise UsageError(f"--market-size: expected requests per second > 0, got {M!r}")
    if "period" not in obs.columns:
        raise UsageError("--market-size: the logit fit needs a 'period' column (observations of the market's "
                         "classes at the same time share a period)")
    names = list(dict.fromkeys(obs["class"]))
    wide = obs.pivot_table(index="period", columns="class", values=["price", "rate"], aggfunc="mean")
    if wide.isna().any().any():
        raise UsageError("--fit-demand: the logit fit needs every class observed in every period")
    rates, prices = wide["rate"][names].to_numpy(float), wide["price"][names].to_numpy(float)
    s0 = 1 - rates.sum(axis=1) / M
    if np.any(s0 <= 0):
        k = int(np.argmax(s0 <= 0))
        raise UsageError(f"--market-size: expected more than the rates of every period add up to; period "
                         f"{wide.index[k]!r} has {rates[k].sum():g} requests/s against {M:g}")
    ok = rates > 0
    y = (np.log(np.where(ok, rates, 1.0) / M) - np.log(s0)[:, None])[ok]
    X = np.column_stack([np.broadcast_to(np.arange(len(names)) == j, rates.shape)[ok].astype(float)
                         for j in range(len(names))] + [prices[ok]])
    if len(y) <= X.shape[1]:
        raise UsageError(f"--fit-demand: the logit fit needs more than {X.shape[1]} positive observations, got {len(y)}")
    fit = sm.OLS(y, X).fit()
    ci = fit.conf_int(alpha)
    u, b = fit.params[:-1], -fit.params[-1]
    v = np.exp(u[None, :] - b * prices)
    pred = M * v / (1 + v.sum(axis=1, keepdims=True))
    out = []
    for j, name in enumerate(names):
        n = rates.shape[0]
        sse = float(np.sum((rates[:, j] - pred[:, j]) ** 2))
        out.append({"class": name, "model": "logit", "n": n, "param": "price_sensitivity", "estimate": b,
                    "ci_low": -ci[-1][1], "ci_high": -ci[-1][0], "param2": "utility", "estimate2": u[j],
                    "ci2_low": ci[j][0], "ci2_high": ci[j][1],
                    "aic": n * math.log(max(sse, 1e-300) / n) + 4, "r2": fit.rsquared, "market_size": M})
    return out


def demand_toml(fit: pd.DataFrame) -> str:
    """The best model of each class as a ``[classes.demand]`` table; the class's ``rate`` anchors its level."""
    out = []
    for _, r in fit[fit["best"]].iterrows():
        others = fit[(fit["class"] == r["class"]) & ~fit["best"]]
        alt = "; ".join(f"{o['model']} AIC {o['aic']:.2f}" for _, o in others.iterrows())
        out.append(f"# class {r['class']!r}: {r['model']} fits best (AIC {r['aic']:.2f}{'; ' + alt if alt else ''})")
        if r["model"] == "linear":
            out.append(f"# fitted: rate = {r['estimate2']:.6g} - {r['estimate']:.6g} * price; put under its [[classes]] "
                       f"table, with rate = the fitted rate at the scenario's price")
            out.append("[classes.demand]")
            out.append('model = "linear"')
            out.append(f"slope = {r['estimate']:.6g}   # {1 - 0.05:.0%} CI [{r['ci_low']:.4g}, {r['ci_high']:.4g}]")
        elif r["model"] == "logit":
            out.append(f"# fitted: utility = {r['estimate2']:.6g}; put under its [[classes]] table, with rate = the fitted "
                       f"rate at the scenario's prices (the utilities are derived from the rates)")
            out.append("[classes.demand]")
            out.append('model = "logit"')
            out.append('market = "market"')
            out.append(f"market_size = {r['market_size']:.6g}")
            out.append(f"price_sensitivity = {r['estimate']:.6g}   # 95% CI [{r['ci_low']:.4g}, {r['ci_high']:.4g}]")
        else:
            out.append(f"# fitted: {r['param2']} = {r['estimate2']:.6g}; put under its [[classes]] table, with rate = the "
                       f"fitted rate at the scenario's price")
            out.append("[classes.demand]")
            out.append('model = "constant-elasticity"')
            out.append(f"elasticity = {r['estimate']:.6g}   # 95% CI [{r['ci_low']:.4g}, {r['ci_high']:.4g}]")
        out.append("")
    return "\n".join(out)


# -- checked in simulation --------------------------------------------------------------------------
