"""The shipped RL routers as registered controllers: ``baseline-rl``, ``wa-rl``, ``wg-rl``.

Each is a :class:`~fluidopt.rl.core.RouterCore` that decides every 0.02 s (``on_tick``): when the
router queue holds a request, the greedy action of the trained Q-network (numpy inference, no
torch) sends its head to an instance or waits. Weights trained with multi-dispatch epochs
(``dispatch = "multi"`` in the file) decide again for the new head after each dispatch, in the same
tick, until the network chooses "wait" or the router queue is empty (docs/rl.md section 2). Weights ship in ``fluidopt/rl/weights/`` as
``<variant>-rl-<m>.npz`` (m = instances); ``weights=PATH`` loads another file. Options:
``weights`` (path), ``accuracy`` (the noisy oracle's bucket accuracy, default 0.79),
``predictor_seed`` (the oracle's seed; the same seed gives every router the same predictions) and
``max_wait`` (epochs; 0, the default, means none): once the head of the router queue has been kept
waiting that many consecutive decisions, the router sends it to the instance with the highest
Q-value instead of waiting again. A guard at inference only, not part of training: a greedy policy
whose wait value exceeds every dispatch in a state that waiting does not change (an idle fleet)
would otherwise wait for ever (docs/rl.md section 5). Weights trained with the ``fits`` wait mask
(``wait_mask = "fits"`` in the file) apply it here as in training: while the head fits on some
instance the router takes the best instance, not "wait" (docs/rl.md section 2). The router fills the
state layout its file names (``layout``: ``fluidopt-rl-state-v1``, or the log-count layout of the
regime routers, docs/rl.md section 6b).
"""

from __future__ import annotations

from fluidopt.control.protocol import Context
from fluidopt.control.registry import register
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario
from fluidopt.rl.core import RouterCore, small_large_groups
from fluidopt.rl.mlp import QNetwork, SharedQNetwork, load_weights, shipped_weights_path, train_command
from fluidopt.rl.predictors import NoisyOracle

__all__ = ["RLRouter", "make_rl_router", "weights_path", "foreign_weights"]

WEIGHTED = {"baseline-rl": "baseline", "wa-rl": "wa", "wg-rl": "wg", "sb3-dqn": "sb3-dqn", "sb3-ppo": "sb3-ppo"}
"""The registered routers that run on a weight file (and their ``-chunked`` forms), by their variant."""


class RLRouter(RouterCore):
    """A trained Q-network routing the head of the router queue every ``EPOCH`` seconds."""


    def __init__(self, scenario: Scenario, net: QNetwork | SharedQNetwork, *, predictor=None, name: str = "rl",
                 max_wait: int = 0, chunked: bool = False):
        super().__init__(scenario.gpu, predictor=predictor, chunked=chunked)
        if isinstance(max_wait, bool) or not isinstance(max_wait, int) or max_wait < 0:
            raise ScenarioError(f"{name}: max_wait: expected an integer >= 0 (epochs; 0 = no limit), got {max_wait!r}")
        self.max_wait = max_wait
        self.forced = 0  # waits overridden by max_wait
        self._head_waits = 0
        self.net = net
        self.layout = net.layout  # the router fills the state layout its weights were trained on
        self.name = name
        self.multi = net.dispatch == "multi"
        self.decisions = 0
        self.waits = 0
        self.masked_waits = 0  # decisions where the network's argmax was a masked "wait"
        self._reserve_out = tuple(float(c.decode) for c in scenario.classes)
        self._reserve = net.wait_mask in ("reserve", "small-large")
        self._groups = small_large_groups(scenario) if net.wait_mask == "small-large" else None

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self.reserve_out = self._reserve_out
        self.groups = self._groups
        self.sent = [0] * self.n  # dispatches per instance (the action histogram)
        if not self.net.fits(ctx.n_gpus):
            raise ScenarioError(f"{self.name}: weights for {self.net.n_instances} instances, the scenario has {ctx.n_gpus}")

    def on_tick(self, ctx: Context) -> None:
        q = self.router_queue
        qnet = self.net.q
        n = self.n
        while ctx.qlen(q):
            if self._reserve:  # a rule's mask (reserve, small-large): the best valid instance, else wait
                ok = self.action_mask(ctx, self.net.wait_mask)[:n]
                self.decisions += 1
                if not any(ok):
                    self.waits += 1
                    return
                qv = qnet(self.observe(ctx))
                a = max((g for g in range(n) if ok[g]), key=lambda g: qv[g])
                self.sent[a] += 1
                self.dispatch(ctx, ctx.head(q), a)
                if not self.multi:
                    return
                continue
            qv = qnet(self.observe(ctx))
            if self.max_wait and self._head_waits >= self.max_wait:
                a = int(qv[:n].argmax())
                self.forced += 1
            else:
                a = int(qv.argmax())
                if a >= n and not self.wait_valid(ctx, self.net.wait_mask):
                    a = int(qv[:n].argmax())  # "wait" is masked: the head fits on an instance
                    self.masked_waits += 1
            self.decisions += 1
            if a >= self.n:
                self.waits += 1
                self._head_waits += 1
                return
            self._head_waits = 0
            self.sent[a] += 1
            self.dispatch(ctx, ctx.head(q), a)
            if not self.multi:
                return


def weights_path(policy: str, scenario: Scenario, weights: str | None = None):
    """The weight file ``policy`` runs on for ``scenario`` (``weights`` if given, else the shipped
    default); None for a router without weights."""
    from pathlib import Path

    variant = WEIGHTED.get(policy.removesuffix("-chunked"))
    if variant is None:
        return None
    return Path(weights) if weights is not None else shipped_weights_path(variant, scenario.gpus, scenario.name)


def foreign_weights(policy: str, scenario: Scenario, weights: str | None = None) -> str | None:
    """The scenario ``policy``'s weights were trained on (:func:`~fluidopt.rl.mlp.trained_on`) when it is
    not ``scenario``; None for a router trained on it, without weights, or whose file names no scenario.
    Such a router's gains measure a transfer, not the method (docs/rl.md section 5)."""
    from fluidopt.rl.mlp import trained_on

    path = weights_path(policy, scenario, weights)
    if path is None or not path.is_file():
        return None
    on = trained_on(path)
    return on if on is not None and on != scenario.name else None


def make_rl_router(variant: str, scenario: Scenario, *, weights: str | None = None, accuracy: float = 0.79,
                   predictor_seed: int = 0, max_wait: int = 0, chunked: bool = False) -> RLRouter:
    """Build the ``<variant>-rl`` router for ``scenario`` from its weights."""
    if not isinstance(scenario, Scenario):
        raise ScenarioError(f"{variant}-rl: expected a Scenario, got {type(scenario).__name__}")
    m = scenario.gpus
    path = weights if weights is not None else shipped_weights_path(variant, m, scenario.name)
    net = load_weights(path, n_instances=m, hint=train_command(variant, m, scenario.name))  # a shared network fits any m
    return RLRouter(scenario, net, predictor=NoisyOracle(accuracy, seed=predictor_seed),
                    name=f"{variant}-rl" + ("-chunked" if chunked else ""), max_wait=max_wait, chunked=chunked)


@register("baseline-rl", description="RL router (Double DQN), reward: progress + completions (Jain et al.)")
def make_baseline_rl(scenario: Scenario, *, weights: str | None = None, accuracy: float = 0.79,
                     predictor_seed: int = 0, max_wait: int = 0) -> RLRouter:
    return make_rl_router("baseline", scenario, weights=weights, accuracy=accuracy, predictor_seed=predictor_seed,
                          max_wait=max_wait)


@register("wa-rl", description="workload-aware RL router: + fixed mixing penalty (Jain et al.)")
def make_wa_rl(scenario: Scenario, *, weights: str | None = None, accuracy: float = 0.79,
               predictor_seed: int = 0, max_wait: int = 0) -> RLRouter:
    return make_rl_router("wa", scenario, weights=weights, accuracy=accuracy, predictor_seed=predictor_seed,
                          max_wait=max_wait)


@register("wg-rl", description="workload-guided RL router: annealed mixing guidance (Jain et al.)")
def make_wg_rl(scenario: Scenario, *, weights: str | None = None, accuracy: float = 0.79,
               predictor_seed: int = 0, max_wait: int = 0) -> RLRouter:
    return make_rl_router("wg", scenario, weights=weights, accuracy=accuracy, predictor_seed=predictor_seed,
                          max_wait=max_wait)


def make_sb3_router(algo: str, scenario: Scenario, *, weights: str | None = None, accuracy: float = 0.79,
                    predictor_seed: int = 0, chunked: bool = False) -> RLRouter:
    """A stable-baselines3 reference agent (``dqn`` or ``ppo``) exported to numpy (:mod:`fluidopt.rl.sb3`)."""
    if not isinstance(scenario, Scenario):
        raise ScenarioError(f"sb3-{algo}: expected a Scenario, got {type(scenario).__name__}")
    m = scenario.gpus
    variant = f"sb3-{algo}"
    hint = train_command(variant, m, scenario.name)
    if hint.startswith("fluidopt rl train"):  # no shipped file for this scenario
        hint = f"python examples/rl_sb3.py --algo {algo} --scenario SCENARIO --out FILE"
    path = weights if weights is not None else shipped_weights_path(variant, m, scenario.name)
    net = load_weights(path, n_instances=m, hint=hint)
    return RLRouter(scenario, net, predictor=NoisyOracle(accuracy, seed=predictor_seed),
                    name=variant + ("-chunked" if chunked else ""), chunked=chunked)


@register("sb3-dqn", description="reference agent: stable-baselines3 DQN on the regime router's environment")
def make_sb3_dqn(scenario: Scenario, *, weights: str | None = None, accuracy: float = 0.79,
                 predictor_seed: int = 0) -> RLRouter:
    return make_sb3_router("dqn", scenario, weights=weights, accuracy=accuracy, predictor_seed=predictor_seed)


@register("sb3-ppo", description="reference agent: stable-baselines3 PPO on the regime router's environment")
def make_sb3_ppo(scenario: Scenario, *, weights: str | None = None, accuracy: float = 0.79,
                 predictor_seed: int = 0) -> RLRouter:
    return make_sb3_router("ppo", scenario, weights=weights, accuracy=accuracy, predictor_seed=predictor_seed)


def _chunked(base: str, make) -> None:
    """Register ``<base>-chunked``: the same router (same weights) over chunked-prefill instances."""

    def factory(scenario: Scenario, *, weights: str | None = None, accuracy: float = 0.79,
                predictor_seed: int = 0) -> RLRouter:
        return make(scenario, weights=weights, accuracy=accuracy, predictor_seed=predictor_seed, chunked=True)

    register(f"{base}-chunked", factory, description=f"{base} over instances with chunked prefill (Sarathi)")


for _base, _variant in (("baseline-rl", "baseline"), ("wa-rl", "wa"), ("wg-rl", "wg")):
    _chunked(_base, lambda sc, _v=_variant, **kw: make_rl_router(_v, sc, **kw))
for _algo in ("dqn", "ppo"):
    _chunked(f"sb3-{_algo}", lambda sc, _a=_algo, **kw: make_sb3_router(_a, sc, **kw))
del _base, _variant, _algo
