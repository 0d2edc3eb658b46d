# The controllers' compiled fast path registers itself with the control layer here, so that it is in
# place whenever the simulator is (fluidopt.sim.controller_fastpath; docs/simulator.md section 9).
from fluidopt.sim import controller_fastpath as _controller_fastpath  # noqa: F401
