"""What a single simulation can hold: checked before any work, so a run too big to finish says so.

The engine keeps per-slot state in flat arrays (about 100 bytes per GPU slot across them) and
per-request state for the requests alive at once, and simulates roughly 10^5 to 10^6 requests per
CPU second (docs/benchmarks-sim.md). A fleet or a horizon far beyond that is a typo (``--horizon
1e12``, ``--gpus 1000000000``), and is refused with the numbers instead of running out of memory
or running for years.
"""

from __future__ import annotations

from fluidopt.core.errors import UsageError
from fluidopt.core.model import Scenario

__all__ = ["MAX_REQUESTS", "MAX_SLOTS", "check_size"]

MAX_SLOTS = 2**26  # GPU slots (gpus x batch): about 7 GB of engine state
MAX_REQUESTS = 2e9  # expected arrivals in one run
_REQUESTS_PER_SECOND = 3e5  # a typical compiled-core speed, for the estimate in the message


def check_size(scenario: Scenario, horizon: float, *, caller: str = "simulate") -> None:
    """Raise :class:`UsageError` when ``scenario`` over ``horizon`` seconds cannot fit or finish."""
    slots = scenario.gpus * scenario.gpu.batch
    if slots > MAX_SLOTS:
        raise UsageError(
            f"{caller}: {scenario.gpus:,} GPUs x batch {scenario.gpu.batch} = {slots:,} slots is more than one "
            f"simulation can hold ({MAX_SLOTS:,}, about 7 GB); simulate a smaller fleet (per-GPU results scale)"
        )
    expected = sum(c.rate for c in scenario.classes) * float(horizon)
    if expected > MAX_REQUESTS:
        hours = expected / _REQUESTS_PER_SECOND / 3600.0
        raise UsageError(
            f"{caller}: horizon {horizon:g} s brings about {expected:.3g} requests (limit {MAX_REQUESTS:.0e} per run; "
            f"about {hours:,.0f} CPU hours); shorten the horizon"
        )
