"""Named GPU profiles: the iteration-time laws shipped in ``calibration/profiles.toml``.

:func:`load_profile` turns a name into a :class:`~fluidopt.core.model.GPUProfile`; :func:`list_profiles`
tabulates them (fitted law, serving settings, R^2, source). Scenario files name a profile with
``gpu = "NAME"``.
"""

from __future__ import annotations

import functools
import importlib.resources
import math
import sys
from typing import TYPE_CHECKING, Any

from fluidopt.core.errors import ScenarioError, did_you_mean
from fluidopt.core.model import GPUProfile
from fluidopt.core.tables import gpu_from_dict

if TYPE_CHECKING:
    import pandas as pd

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PROFILES_FILE = "profiles.toml"
_PROFILE_GPU_KEYS = {"alpha", "beta", "tau_solo", "gamma", "chunk", "batch", "kv_capacity", "kv_time_per_token",
                     "price_per_hour"}
_PROFILE_META_KEYS = {"model", "hardware", "engine", "r2", "source", "notes",
                      # generated from published operator profiles (fluidopt.calibration.vidur): GPUs per replica,
                      # 95% intervals, cross-validation errors, the data file and its hash
                      "gpus", "alpha_ci", "beta_ci", "kv_time_per_token_ci", "cv_median_error", "cv_max_error",
                      "data_file", "data_sha256", "layers_from"}

__all__ = ["PROFILES_FILE", "list_profiles", "load_profile", "profile_info", "profile_names"]

# ------------------------------------------------------------------------------------------------
# Named profiles
# ------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _profiles_table() -> dict[str, dict[str, Any]]:
    text = importlib.resources.files("fluidopt.profiles").joinpath(PROFILES_FILE).read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:  # pragma: no cover - the shipped file is tested
        raise ScenarioError(f"fluidopt.profiles/{PROFILES_FILE}: not valid TOML: {e}") from None
    for name, table in data.items():
        if not isinstance(table, dict):
            raise ScenarioError(f"{PROFILES_FILE}: {name!r}: expected a table [{name}], got {table!r}")
        unknown = sorted(set(table) - _PROFILE_GPU_KEYS - _PROFILE_META_KEYS)
        if unknown:
            raise ScenarioError(
                f"{PROFILES_FILE}[{name}]: unknown key {unknown[0]!r}; expected one of "
                f"{', '.join(sorted(_PROFILE_GPU_KEYS | _PROFILE_META_KEYS))}"
            )
    return data


def profile_names() -> tuple[str, ...]:
    """Names of the shipped GPU profiles, in file order."""
    return tuple(_profiles_table())


def profile_info(name: str) -> dict[str, Any]:
    """The raw table of a named profile (fit values plus r2, source, notes, ...)."""
    table = _profiles_table()
    if name not in table:
        raise ScenarioError(
            f"gpu: unknown GPU profile {name!r}{did_you_mean(name, table)}; known profiles: {', '.join(table)} "
            "(or give a [gpu] table with alpha, beta, tau_solo or gamma, chunk, batch)"
        )
    return dict(table[name])


def load_profile(name: str) -> GPUProfile:
    """The named GPU profile from ``calibration/profiles.toml`` as a :class:`GPUProfile`.

    Unknown names raise :class:`ScenarioError` listing the known ones.
    """
    if not isinstance(name, str):
        raise ScenarioError(f"gpu: expected a profile name (string) or a table, got {name!r}")
    info = profile_info(name)
    gpu_fields = {k: v for k, v in info.items() if k in _PROFILE_GPU_KEYS}
    gpu_fields["name"] = name
    return gpu_from_dict(gpu_fields, where=f"{PROFILES_FILE}[{name}]")


def list_profiles() -> pd.DataFrame:
    """One row per named profile: fitted law, serving settings, GPUs per replica, R^2, the worst
    held-out relative error of a generated profile (``cv_max_error``) and source (index: name)."""
    import pandas as pd  # here only: a stand-in engine loads its profile and builds no table

    rows = []
    for name in profile_names():
        g = load_profile(name)
        info = profile_info(name)
        rows.append(
            {
                "name": name,
                "model": info.get("model", ""),
                "hardware": info.get("hardware", ""),
                "engine": info.get("engine", ""),
                "alpha": g.alpha,
                "beta": g.beta,
                "tau_solo": g.tau_solo,
                "gamma": g.gamma,
                "chunk": g.chunk,
                "batch": g.batch,
                "tau_mix": g.tau_mix,
                "gpus": int(info.get("gpus", 1)),
                "r2": float(info["r2"]) if "r2" in info else math.nan,
                "cv_max_error": float(info["cv_max_error"]) if "cv_max_error" in info else math.nan,
                "kv_capacity": math.nan if g.kv_capacity is None else g.kv_capacity,
                "kv_time_per_token": g.kv_time_per_token,
                "source": info.get("source", ""),
            }
        )
    return pd.DataFrame(rows).set_index("name")
