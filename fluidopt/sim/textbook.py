"""Textbook queues as honest configurations of the engine (the simulator's exactness checks).

Each function returns a :class:`~fluidopt.core.model.Scenario` and the controller that together make one
stage of the LLM-serving model a textbook queue; the engine runs them exactly as it runs any policy
(every request still has a prefill and a decode). docs/simulator.md explains the mappings.

* :func:`erlang_setup` (``service="markov"``): ``c`` GPUs each keep one of their B slots for
  prefills (:class:`~fluidopt.control.fcfs.ReservedPrefillFCFS`), so a GPU's prefill slot is
  free exactly when it runs no prefill, whatever the decodes do. One class, prompt P = 1 token,
  chunk C = 1, alpha = 1/mu, beta = 0: the prefill rate is mu_p = C / (P tau_mix) = mu. Arrivals are
  Poisson(lam), patience Exp(theta) while waiting. The prefill queue is then exactly M/M/c+M
  (Erlang A; Erlang C when theta = 0): its wait, abandonment and length are compared with
  :mod:`fluidopt.queueing`. Decodes (1 token) go to any free decode slot (B-1 per GPU, far more than
  they need) and never block a prefill slot.
* :func:`mg1_setup` (``service="tokens"``): GPU 0 only prefills (no decode slot), GPU 1 only decodes.
  With C = 1 and beta = 0 a prompt of P tokens takes exactly P iterations of alpha seconds, so GPU 0
  is an M/G/1 queue with service alpha * P; with the scenario's geometric ("exponential") prompt
  lengths the Pollaczek-Khinchine formula gives its mean wait exactly
  (:func:`fluidopt.queueing.mg1_geometric_wait`).
"""

from __future__ import annotations

from fluidopt.control.fcfs import ReservedPrefillFCFS
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import GPUProfile, RequestClass, Scenario

__all__ = ["erlang_setup", "mg1_setup"]


def erlang_setup(
    servers: int, lam: float, mu: float, theta: float = 0.0, *, batch: int = 8, decode_speed: float | None = None
) -> tuple[Scenario, ReservedPrefillFCFS]:
    """Scenario and controller whose prefill queue is M/M/``servers``+M (rates per second).

    Decodes are one token long; ``decode_speed`` is a solo decode's tokens per second (default
    ``mu``, equal to a mixed decode's, so that the race needs no thinning).
    """
    if mu <= 0 or lam <= 0 or theta < 0:
        raise ScenarioError(f"erlang_setup: expected lam > 0, mu > 0, theta >= 0, got {lam!r}, {mu!r}, {theta!r}")
    tau_solo = 1.0 / (mu if decode_speed is None else decode_speed)
    gpu = GPUProfile(alpha=1.0 / mu, beta=0.0, tau_solo=tau_solo, chunk=1, batch=batch, name="textbook")
    cls = RequestClass("customers", prompt=1.0, decode=1.0, rate=lam, patience=theta, lengths="fixed")
    sc = Scenario(gpu=gpu, gpus=servers, classes=(cls,), prefill_price=1.0, decode_price=0.0,
                  name=f"M/M/{servers}{'+M' if theta else ''}")
    return sc, ReservedPrefillFCFS()


def mg1_setup(lam: float, alpha: float, mean_prompt: float, *, batch: int = 4) -> tuple[Scenario, ReservedPrefillFCFS]:
    """Scenario and controller whose GPU 0 is an M/G/1 queue with service alpha * P, P geometric."""
    if lam * alpha * mean_prompt >= 1:
        raise ScenarioError(f"mg1_setup: load lam * alpha * mean_prompt = {lam * alpha * mean_prompt:g} must be < 1")
    gpu = GPUProfile(alpha=alpha, beta=0.0, tau_solo=alpha, chunk=1, batch=batch, name="textbook")
    cls = RequestClass("customers", prompt=mean_prompt, decode=2.0, rate=lam, patience=0.0, lengths="exponential")
    sc = Scenario(gpu=gpu, gpus=2, classes=(cls,), prefill_price=1.0, decode_price=0.0, name="M/G/1")
    return sc, ReservedPrefillFCFS(prefill_gpus=1, decode_on_prefill_gpus=False)
