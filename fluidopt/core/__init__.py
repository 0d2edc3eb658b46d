"""The small core every layer stands on: the model (frozen dataclasses of GPUs, request classes, fleets and
scenarios; :mod:`fluidopt.core.model`), demand models (:mod:`fluidopt.core.demand`), the GPU table
grammar (:mod:`fluidopt.core.tables`), the error types (:mod:`fluidopt.core.errors`), the interruption
contract (:mod:`fluidopt.core.interrupt`), safe file writing (:mod:`fluidopt.core.files`) and the t
quantiles of the confidence intervals (:mod:`fluidopt.core.tquantile`).

It imports nothing else of fluidopt. The former top-level names (``fluidopt.model``, ``fluidopt.errors``,
``fluidopt.interrupt``, ``fluidopt.demand``, ``fluidopt.tables``) still import.
"""
