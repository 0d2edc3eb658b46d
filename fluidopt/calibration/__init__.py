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

from fluidopt.calibration.fit import (
    CalibrationFit,
    fit_iteration_time,
    read_measurements,
    synthetic_measurements,
    write_measurements,
)
from fluidopt.calibration.profiles import list_profiles, load_profile, profile_info, profile_names
from fluidopt.calibration.vidur import from_vidur

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
