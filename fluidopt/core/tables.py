"""Validated reading of TOML-like tables: the field checks every input file shares.

Scenario files (:mod:`fluidopt.scenario`) and the named GPU profiles (:mod:`fluidopt.calibration`) both
read GPU tables with :func:`gpu_from_dict`; keeping it here, below both, means neither imports the
other to read a table. Every error is a :class:`~fluidopt.core.errors.ScenarioError` naming the field,
the value and what was expected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fluidopt.core.errors import ScenarioError, did_you_mean
from fluidopt.core.model import GPUProfile

__all__ = ["gpu_from_dict"]

_GPU_REQUIRED = ("alpha", "beta", "chunk", "batch")
_GPU_OPTIONAL = {"tau_solo", "gamma", "name", "kv_capacity", "kv_time_per_token", "price_per_hour"}


def _expect_table(where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{where}: expected a table, got {value!r} ({type(value).__name__})")
    return value


def _reject_unknown(where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ScenarioError(
            f"{where}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], allowed)}; expected one of "
            f"{', '.join(sorted(allowed))}"
        )


def _require(where: str, table: Mapping[str, Any], keys: tuple[str, ...]) -> None:
    for k in keys:
        if k not in table:
            raise ScenarioError(f"{where}.{k}: missing required field")


def _number(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(f"{where}: expected a number, got {value!r} ({type(value).__name__})")
    return value


def _integer(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ScenarioError(f"{where}: expected an integer, got {value!r} ({type(value).__name__})")
    return value


def gpu_from_dict(table: Mapping[str, Any], where: str = "gpu") -> GPUProfile:
    """Build a :class:`GPUProfile` from a TOML-like table, validating every field."""
    table = _expect_table(where, table)
    _reject_unknown(where, table, set(_GPU_REQUIRED) | _GPU_OPTIONAL)
    _require(where, table, _GPU_REQUIRED)
    has_tau, has_gamma = "tau_solo" in table, "gamma" in table
    if has_tau == has_gamma:
        raise ScenarioError(
            f"{where}: give exactly one of tau_solo (s per decode-only iteration) or gamma (tokens/s), "
            f"got {'both' if has_tau else 'neither'}"
        )
    kw: dict[str, Any] = {}
    for k in ("alpha", "beta"):
        kw[k] = _number(f"{where}.{k}", table[k])
    for k in ("chunk", "batch"):
        kw[k] = _integer(f"{where}.{k}", table[k])
    if has_tau:
        kw["tau_solo"] = _number(f"{where}.tau_solo", table["tau_solo"])
    else:
        gamma = _number(f"{where}.gamma", table["gamma"])
        if not math.isfinite(gamma) or gamma <= 0:
            raise ScenarioError(f"{where}.gamma: expected a finite number > 0, got {gamma!r}")
        kw["tau_solo"] = 1.0 / gamma
    if "name" in table:
        if not isinstance(table["name"], str):
            raise ScenarioError(f"{where}.name: expected a string, got {table['name']!r}")
        kw["name"] = table["name"]
    if "kv_capacity" in table:
        kw["kv_capacity"] = _number(f"{where}.kv_capacity", table["kv_capacity"])
    if "kv_time_per_token" in table:
        kw["kv_time_per_token"] = _number(f"{where}.kv_time_per_token", table["kv_time_per_token"])
    if "price_per_hour" in table:
        kw["price_per_hour"] = _number(f"{where}.price_per_hour", table["price_per_hour"])
    return GPUProfile(**kw)
