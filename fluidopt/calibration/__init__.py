"""How fast is this GPU: the iteration-time law, fitted from a profile, named, or composed from Vidur's
operator profiles.

* :mod:`fluidopt.calibration.fit`: read measurements and fit tau = alpha + beta * C by OLS
  (statsmodels; confidence intervals, HC3, diagnostics, plot);
* :mod:`fluidopt.calibration.profiles`: the named GPU profiles shipped with the package;
* :mod:`fluidopt.calibration.vidur`: iterations composed from Vidur's published A100/A40/H100 operator
  profiles, and the law fitted to them.

The names below are this package's public API (``from fluidopt.calibration import fit_iteration_time``);
``fluidopt.calibrate``, the module's former name, still imports them.
"""

__all__ = [
    "CalibrationFit",
    "fit_iteration_time",
    "from_vidur",
    "list_profiles",
    "load_profile",
    "profile_info",
    "profile_names",
    "read_measurements",
    "synthetic_measurements",
    "write_measurements",
]

# Loaded on first use: the time models (fluidopt.calibration.timemodels), which every engine and server
# imports, would otherwise bring the fit's pandas and statsmodels into each process.
_WHERE = {"CalibrationFit": "fit", "fit_iteration_time": "fit", "read_measurements": "fit",
          "synthetic_measurements": "fit", "write_measurements": "fit", "list_profiles": "profiles",
          "load_profile": "profiles", "profile_info": "profiles", "profile_names": "profiles",
          "from_vidur": "vidur"}


def __getattr__(name: str):
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"fluidopt.calibration.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
