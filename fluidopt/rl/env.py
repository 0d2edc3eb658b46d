"""A Gymnasium environment over the simulator: the RL router's MDP (needs the ``rl`` extra).

One step is one routing decision for the head-of-line request of the central router queue, at a
decision epoch (multiples of 0.02 s of simulated time): action ``g < m`` sends it to instance g,
action ``m`` waits one epoch. Between decisions the engine advances in place through its stepping
API (``advance``/``pause``): when the router queue is empty the environment jumps straight to the
next arrival (the controller pauses the engine there) and then to the next epoch boundary, so idle
epochs cost nothing. An episode is ``n_requests`` arrivals of the scenario's workload; it
terminates when all of them are resolved and is truncated at ``max_time`` seconds.

Reward of a step (docs/rl.md section 2): ``-(P_before + P_after) / 2 x epochs elapsed
+ r_w x completions + w_k x h`` (with ``RewardConfig(objective="revenue")``: the revenue of the
step's completions, c_p x prompt + c_d x output tokens at the class's prices, + w_k x h; with
``"lost-revenue"``: minus the revenue of the requests that abandoned or were dropped in the step,
+ w_k x h; with ``"time-in-system"``: minus the request-seconds spent in the system, router queue
included, during the step, :meth:`RouterCore.time_in_system`, + w_k x h; the first step of an
episode also carries the time before the first decision, so an episode's rewards without guidance
sum to minus the total time in system of its requests; with ``"request-latency"`` /
``"request-normalized"`` / ``"request-excess"``, per-request credit: the credits of the dispatched
requests that resolved during the step, each minus its own request's time from dispatch to resolution
(or its time to first token plus the predicted output times its time per output token, or that time
less the request's solo service time), + w_k x h, with the credits listed
by dispatching step in ``last_credits``, see :meth:`RouterEnv._credits`), where P is the progress penalty (:meth:`RouterCore.progress_penalty`),
r_w = 60, h the mixing guidance of the action and w_k the variant's guidance weight in the current
episode k (0-based count of resets since the last seeded reset). ``reward_scale`` multiplies it all.
A step spans ``last_epochs`` decision epochs (1 after a wait; more when the environment skipped
epochs with an empty router queue): an agent discounts the next state by ``gamma ** last_epochs``,
which makes the skip equivalent to the paper's one decision per epoch (gamma per epoch). Without
it, waiting would look cheap: it would postpone, in steps, penalties that accrue per second.

``multi_dispatch=True`` (an extension of the paper's MDP, docs/rl.md section 2): after a dispatch
that leaves requests in the router queue the environment does not advance; the next step decides
for the new head at the same epoch (``last_epochs`` 0, so no discount and no progress penalty
between the two), until the agent chooses "wait" or the queue is empty. The paper's MDP (the
default) dispatches at most one request per epoch, 50 per second.

``wait_mask="fits"`` (docs/rl.md section 2): "wait" is valid only when the head of the router queue
fits on no instance (:meth:`RouterCore.head_fits`); :meth:`RouterEnv.action_masks` gives the valid
actions (the sb3-contrib convention), and stepping a masked "wait" is an error. The default
``"none"`` is the paper's MDP.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np

from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario
from fluidopt.rl.core import (
    CREDIT_OBJECTIVES,
    EPOCH,
    STATE_LAYOUT,
    STATE_LAYOUTS,
    WAIT_MASKS,
    RewardConfig,
    RouterCore,
    episode_seed,
    episode_workload,
    obs_dim,
    small_large_groups,
)
from fluidopt.rl.predictors import NoisyOracle
from fluidopt.workloads.base import TraceWarning

__all__ = ["RouterEnv", "episode_seed"]


class RouterEnv(gym.Env):
    """The workload-guided RL router's environment (``Discrete(m + 1)`` actions, ``Box`` state).

    ``scenario``: a Scenario or TOML path (instances = its GPUs). ``variant``: reward variant
    (``baseline``, ``wa``, ``wg``). ``accuracy``: the noisy oracle's bucket accuracy. ``pin``:
    {arrival index: instance} routed without asking the agent (scripted background load).
    ``workload``: a fixed workload for every episode instead of fresh draws (e.g. a trace).
    ``multi_dispatch``: decide again at the same epoch after a dispatch (module doc).
    ``wait_mask``: ``"none"`` (the paper's MDP) or ``"fits"`` (wait only when the head fits on no
    instance; module doc). ``chunked``: the instances run chunked prefill (the paper's Table 3).
    """

    metadata = {"render_modes": []}

    def __init__(self, scenario: Scenario | str, *, variant: str = "wg", n_requests: int = 2000,
                 accuracy: float = 0.79, reward: RewardConfig | None = None, pin: dict | None = None,
                 workload=None, max_time: float | None = None, reward_scale: float = 1.0,
                 backend: str = "auto", seed: int | None = None, multi_dispatch: bool = False,
                 wait_mask: str = "none", chunked: bool = False, layout: str = STATE_LAYOUT):
        if layout not in STATE_LAYOUTS:
            raise ScenarioError(f"RouterEnv: layout: expected one of {', '.join(STATE_LAYOUTS)}, got {layout!r}")
        self.layout = layout
        if not isinstance(scenario, Scenario):
            from fluidopt.scenario import load_scenario

            scenario = load_scenario(scenario)
        self.scenario = scenario
        self.m = scenario.gpus
        self.n_requests = int(n_requests)
        self.accuracy = accuracy
        self.reward_cfg = reward if reward is not None else RewardConfig(variant=variant)
        self.pin = dict(pin or {})
        self.fixed_workload = workload
        self.max_time = max_time
        self.reward_scale = float(reward_scale)
        self.backend = backend
        self.multi_dispatch = bool(multi_dispatch)
        self.wait_mask = wait_mask
        self.chunked = bool(chunked)
        self.action_space = gym.spaces.Discrete(self.m + 1)
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(obs_dim(self.m),), dtype=np.float32)
        self._base = 0 if seed is None else int(seed)
        self._ep = -1
        self.eng = None
        self.last_guidance = 0.0
        self.last_credits: list[tuple[int, float]] = []
        self.last_epochs = 1.0  # decision epochs (0.02 s) the last step spanned: discount gamma ** this

    # ---------------------------------------------------------------------------------------------
    @property
    def wait_mask(self) -> str:
        return self._wait_mask

    @wait_mask.setter
    def wait_mask(self, mask: str) -> None:
        if mask not in WAIT_MASKS:
            raise ScenarioError(f"RouterEnv: wait_mask: expected one of {', '.join(WAIT_MASKS)}, got {mask!r}")
        self._wait_mask = mask

    def wait_valid(self) -> bool:
        """Whether "wait" is a valid action in the current state (always, with ``wait_mask="none"``)."""
        return self.core.wait_valid(self.eng, self._wait_mask)

    def action_masks(self) -> np.ndarray:
        """The valid actions of the current state (bool, m + 1): every instance, and "wait" unless masked."""
        return np.array(self.core.action_mask(self.eng, self._wait_mask), dtype=bool)

    @property
    def episode(self) -> int:
        """Index k of the current episode (resets since the last seeded reset, 0-based)."""
        return self._ep

    @property
    def guidance_weight(self) -> float:
        return self.reward_cfg.guidance_weight(max(self._ep, 0))

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._base = int(seed)
            self._ep = -1
        self._ep += 1
        es = episode_seed(self._base, self._ep)
        from fluidopt.sim.api import make_engine

        wl = self.fixed_workload if self.fixed_workload is not None else episode_workload(self.scenario, self.n_requests, es)
        self.n_total = int(wl.n_requests)
        last = float(wl.duration)
        self.t_max = float(self.max_time) if self.max_time is not None else last + 3600.0
        self.core = RouterCore(self.scenario.gpu, predictor=NoisyOracle(self.accuracy, seed=es),
                               reward=self.reward_cfg, pin=self.pin, chunked=self.chunked)
        self.core.layout = self.layout
        self.core.precompute(wl)  # the episode's predictions in one vectorised pass
        self.core.reserve_out = tuple(float(c.decode) for c in self.scenario.classes)
        if self._wait_mask == "small-large":
            self.core.groups = small_large_groups(self.scenario)
        self._revenue = self.reward_cfg.objective == "revenue"
        self._lost = self.reward_cfg.objective == "lost-revenue"
        self._tis = self.reward_cfg.objective == "time-in-system"
        self._credit = self.reward_cfg.objective in CREDIT_OBJECTIVES
        self._norm = self.reward_cfg.objective == "request-normalized"
        self._excess = self.reward_cfg.objective == "request-excess"
        self.core.log_requests = self._credit
        # r -> (step index, dispatch time, predicted output, output, solo service time or 0)
        self._pending: dict[int, tuple] = {}
        self._nstep = 0  # steps taken in this episode (the index of the next step)
        self.last_credits: list[tuple[int, float]] = []  # (step index, scaled credit) resolved by the last step
        self._area = 0.0  # request-seconds in the system already rewarded (time-in-system objective)
        if self._revenue or self._lost:
            self.core.prices = self.scenario.class_prices()
        if self.eng is not None and not self.eng._finished:
            self.eng.finish()
        self.eng = make_engine(self.scenario, self.core, horizon=self.t_max + 1.0, service="tokens", seed=es,
                               workload=wl, backend=self.backend, progress=False)
        self.eng.handle_sigint = False  # thousands of advance() calls a second: no per-call handler swap
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)  # an episode ends before the horizon by design
            self.eng.start()
        self._w = self.guidance_weight
        self._term = self._trunc = False
        self.core.pause_on_decision = True
        self.core.pause_at_resolved = self.n_total
        self._to_decision()
        if self._credit:  # nothing was dispatched by the agent yet: departures so far (pinned, abandoned) are
            self.core.departures.clear()  # nobody's credit, and their ids may be reused by the first dispatch
        obs, self._p = self.core.observe_with_penalty(self.eng)
        self._t = self.eng.now
        return obs, {}

    def _to_decision(self) -> None:
        """Advance the engine in place to the next decision epoch (a tick with a request in the router
        queue: the controller pauses the engine there) or to the end of the episode."""
        eng = self.eng
        eng.advance(self.t_max)
        if self.core.resolved >= self.n_total:
            self._term = True
        elif eng.now >= self.t_max or eng.done:
            self._trunc = True

    def step(self, action):
        a = int(action)
        if self._term or self._trunc:
            raise ScenarioError("RouterEnv.step: the episode is over; call reset()")
        if not 0 <= a <= self.m:
            raise ScenarioError(f"RouterEnv.step: action: expected an integer in 0..{self.m}, got {action!r}")
        eng, core = self.eng, self.core
        if a == self.m and self._wait_mask != "none" and not self.wait_valid():
            raise ScenarioError(f"RouterEnv.step: action {a} (wait) is masked: the head of the router queue fits on "
                                f"instance {core.head_fits(eng)} (wait_mask={self._wait_mask!r}; see action_masks())")
        if a < self.m and self._wait_mask == "reserve" and not self.core.reserve_feasible(eng)[a]:
            raise ScenarioError(f"RouterEnv.step: action {a} is masked: instance {a} cannot hold the head's prompt plus "
                                f"its predicted output (wait_mask='reserve'; see action_masks())")
        if self._wait_mask == "small-large" and not self.core.action_mask(eng, "small-large")[a]:
            raise ScenarioError(f"RouterEnv.step: action {a} is masked: not in the head's Small-Large group "
                                f"(wait_mask='small-large'; see action_masks())")
        h = 0.0
        if a < self.m:
            r = eng.head(core.router_queue)
            if self._w:
                h = core.guidance(eng, r, a)
            if self._credit:
                out = eng.req_output(r)
                solo = core._ideal_time(eng.req_prompt(r), out) if self._excess else 0.0
                self._pending[r] = (self._nstep, eng.now, core.held[r][1], out, solo)
            core.dispatch(eng, r, a)
        self.last_guidance = h
        c0 = core.completed
        v0 = core.revenue
        l0 = core.lost
        if not (self.multi_dispatch and a < self.m and eng.qlen(core.router_queue)):
            self._to_decision()  # else: another decision for the new head at the same epoch
        obs, p = core.observe_with_penalty(eng)
        t = eng.now
        if self._revenue:
            rew = (core.revenue - v0) + self._w * h
        elif self._lost:
            rew = -(core.lost - l0) + self._w * h
        elif self._credit:
            rew = self._credits(t) + self._w * h
        elif self._tis:
            area = core.time_in_system(t)
            rew = -(area - self._area) + self._w * h
            self._area = area
        else:
            rew = (-0.5 * (self._p + p) * ((t - self._t) / EPOCH) + self.reward_cfg.completion_reward * (core.completed - c0)
                   + self._w * h)
        self.last_epochs = (t - self._t) / EPOCH
        self._p = p
        self._t = t
        self._nstep += 1
        info = {}
        if self._term or self._trunc:
            info = {"completed": core.completed, "resolved": core.resolved, "time": t}
        return obs, rew * self.reward_scale, self._term, self._trunc, info

    def _credits(self, t: float) -> float:
        """Per-request credit (the objectives of ``CREDIT_OBJECTIVES``, docs/rl.md section 2):
        the credits of the dispatched requests that resolved during the step, into ``last_credits`` as
        (index of the step that dispatched the request, credit x reward_scale); returns their sum (unscaled).
        ``request-latency``: minus the time from dispatch to resolution. ``request-normalized``: minus the
        time from dispatch to the first token plus the predicted output d times the time per output token
        after it, (resolution - first token) / max(1, output) (a request resolved without a first token:
        as request-latency). ``request-excess``: minus the time from dispatch to resolution less the
        request's solo service time alpha + beta x prompt + output x tau_solo (a constant of the request,
        whatever the action: the same ranking of actions as request-latency with less of the output
        length's noise). At truncation every request still pending is credited with minus the time from
        its dispatch to the truncation (request-excess: less its solo time, at most 0; censored: a bound
        on its cost)."""
        core, pend = self.core, self._pending
        out = []
        tot = 0.0
        for r, td, ft in core.departures:
            e = pend.pop(r, None)
            if e is None:  # never dispatched by the agent (left from the router queue, or pinned)
                continue
            if self._norm and ft == ft:
                c = -(ft - e[1]) - e[2] * (td - ft) / max(1, e[3])
            else:
                c = -(td - e[1]) + e[4]
            out.append((e[0], c * self.reward_scale))
            tot += c
        core.departures.clear()
        if self._trunc:
            for e in pend.values():
                c = min(0.0, -(t - e[1]) + e[4])
                out.append((e[0], c * self.reward_scale))
                tot += c
            pend.clear()
        self.last_credits = out
        return tot

    def result(self):
        """The finished episode's :class:`~fluidopt.sim.metrics.SimResult` (closes the engine)."""
        return self.eng.finish()

    def close(self):
        if self.eng is not None and not self.eng._finished:
            self.eng.finish()
        self.eng = None
