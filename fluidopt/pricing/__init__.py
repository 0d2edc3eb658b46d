"""What do prices and SLIs do to revenue, and what should each class pay?

* :mod:`fluidopt.pricing.grids`: revenue over a grid of prefill and decode prices (bundled against
  separate pricing), shadow prices, SLI Pareto curves, simulated checks of grid points;
* :mod:`fluidopt.pricing.optimize`: prices chosen by a concave program over the fleet's capacity when
  demand responds to price (demand models: :mod:`fluidopt.core.demand`), prices with fleet size, demand
  fitted from observations.

The names below are the package's public API. ``fluidopt.pricing_opt``, the optimiser's former name,
still imports.
"""

from fluidopt.pricing.grids import (
    grid_figure,
    pareto,
    pareto_figure,
    parse_range,
    price_grid,
    shadow_prices,
    simulate_points,
)
from fluidopt.pricing.optimize import (
    FleetResult,
    PriceResult,
    demand_grid,
    optimize_fleet,
    optimize_prices,
    priced_scenario,
)

__all__ = ["price_grid", "grid_figure", "shadow_prices", "pareto", "pareto_figure", "simulate_points",
           "parse_range", "optimize_prices", "optimize_fleet", "PriceResult", "FleetResult", "demand_grid",
           "priced_scenario"]
