"""Queueing theory for the simulator's checks and for quick capacity answers.

* :mod:`fluidopt.queueing.closed_forms`: Erlang B, Erlang C (M/M/c), M/M/c/K, Erlang A (M/M/c+M),
  square-root staffing and the Pollaczek-Khinchine M/G/1 wait.
* :mod:`fluidopt.queueing.runlength`: exact asymptotic variances of M/M/c and M/M/c+M time and
  customer averages, and the run length a simulation needs for a given precision.

Everything here is a pure function of rates (per second) and server counts; nothing imports the
simulator or the LP stack.
"""

from fluidopt.queueing.closed_forms import (
    ErlangAMetrics,
    MMCKMetrics,
    MMCMetrics,
    erlang_a,
    erlang_b,
    erlang_c,
    mg1_geometric_wait,
    mmc_mean_wait,
    mmc_metrics,
    mmc_staffing,
    mmc_wait_tail,
    mmck_metrics,
)
from fluidopt.queueing.runlength import (
    RunLengthReport,
    customers_for_precision,
    erlang_a_abandon_relative_sd,
    mmc_mean_wait_relative_sd,
    mmc_time_average_variance,
    run_length_report,
)

__all__ = [
    "ErlangAMetrics",
    "MMCKMetrics",
    "MMCMetrics",
    "RunLengthReport",
    "customers_for_precision",
    "erlang_a",
    "erlang_a_abandon_relative_sd",
    "erlang_b",
    "erlang_c",
    "mg1_geometric_wait",
    "mmc_mean_wait",
    "mmc_mean_wait_relative_sd",
    "mmc_metrics",
    "mmc_staffing",
    "mmc_time_average_variance",
    "mmc_wait_tail",
    "mmck_metrics",
    "run_length_report",
]
