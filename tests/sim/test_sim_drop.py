"""A request whose context outgrows every GPU's KV cache is dropped, and its controller is told."""

from fluidopt.control.instance import RoundRobin
from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.sim.api import simulate


class CountingRR(RoundRobin):
    def __init__(self):
        super().__init__(chunked=False)
        self.drops: list[tuple[int, int]] = []
        self.live: set[int] = set()

    def on_arrival(self, ctx, r):
        self.live.add(r)
        super().on_arrival(ctx, r)

    def on_drop(self, ctx, r, g):
        assert ctx.req_gpu(r) == -1  # already evicted from g
        self.drops.append((r, g))
        self.live.discard(r)

    def on_decode_done(self, ctx, r, g):
        self.live.discard(r)

    def on_abandon(self, ctx, r, q):
        self.live.discard(r)


def test_drops_are_reported_to_the_controller():
    # Fixed lengths: 100 prompt + 400 output tokens of context never fit 300 tokens of KV cache.
    gpu = GPUProfile(alpha=0.01, beta=1e-4, tau_solo=0.01, chunk=256, batch=4, kv_capacity=300)
    cls = RequestClass("long", prompt=100, decode=400, rate=2.0, patience=0.0, lengths="fixed")
    sc = Scenario(gpu=gpu, gpus=2, classes=(cls,), prefill_price=0.1, decode_price=0.2)
    ctrl = CountingRR()
    res = simulate(sc, ctrl, horizon=60.0, seed=3, service="tokens", check=True)
    t = res.totals
    assert t["dropped"] > 0 and t["completed"] == 0
    assert len(ctrl.drops) == t["dropped"]
    # every request that left did so through a callback: the controller's view of who is in the system
    assert len(ctrl.live) == t["in_system"]
