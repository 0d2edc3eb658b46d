"""Which policy is best here: many runs, in parallel, against the LP bound.

* :mod:`fluidopt.harness.comparison`: :func:`compare` (policies x scenarios x seeds, each run against
  its scenario's fluid bound; resumable through ``store.jsonl``);
* :mod:`fluidopt.harness.executor`: where runs execute (local worker processes or a Dask cluster), the
  result store and progress;
* :mod:`fluidopt.harness.plots`: figures of a comparison.

``fluidopt.executor`` and ``fluidopt.plots``, the former names, still import.
"""

__all__ = ["COHORT_RUN_COLUMNS", "Comparison", "compare", "RUN_COLUMNS"]


def __getattr__(name: str):
    # Loaded on first use: the command line imports fluidopt.harness.executor for every command's options,
    # and the comparison brings pandas and scipy.stats (about 1 s of imports) that most commands never use.
    if name in __all__:
        from fluidopt.harness import comparison

        return getattr(comparison, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
