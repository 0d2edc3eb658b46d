"""Which policy is best here: many runs, in parallel, against the LP bound.

* :mod:`fluidopt.harness.comparison`: :func:`compare` (policies x scenarios x seeds, each run against
  its scenario's fluid bound; resumable through ``store.jsonl``);
* :mod:`fluidopt.harness.executor`: where runs execute (local worker processes or a Dask cluster), the
  result store and progress;
* :mod:`fluidopt.harness.plots`: figures of a comparison.

``fluidopt.executor`` and ``fluidopt.plots``, the former names, still import.
"""

from fluidopt.harness.comparison import COHORT_RUN_COLUMNS, RUN_COLUMNS, Comparison, compare

__all__ = ["COHORT_RUN_COLUMNS", "Comparison", "compare", "RUN_COLUMNS"]
