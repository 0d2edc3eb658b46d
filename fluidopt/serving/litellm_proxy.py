"""A fluidopt controller in the LiteLLM proxy, loaded from its config file (docs/serving.md, section 3).

LiteLLM 1.110's proxy takes no custom routing strategy (``CustomRoutingStrategyBase``) from its config
(``router_settings.routing_strategy`` names only its built-in strategies), but it loads two kinds of
Python objects by dotted path, resolved next to the config file (``get_instance_fn``):

* ``router_settings.plugins``: routing plugins, objects with an async ``run(context)`` that narrow
  ``context.candidate_models`` (the deployments' ``litellm_params.model``) before the router picks
  (``litellm/router_rust/steps/plugins.py``; docs.litellm.ai, "Routing Plugins");
* ``litellm_settings.callbacks``: ``CustomLogger`` instances, told of each streamed chunk
  (``async_post_call_streaming_deployment_hook``), of each success and of each failure.

:func:`proxy_hooks` makes one of each around one :class:`~fluidopt.serving.litellm_router.ControllerRouting`:
the plugin runs the controller's pick (it may hold the request: ``run`` awaits) and narrows the
candidates to the chosen deployment, and leaves the request's id in the plugin signals that LiteLLM
copies into the request's metadata; the callbacks read it back there and report the first token, the
end and failures, as the loop's HTTP front does. Each deployment therefore needs its own
``litellm_params.model`` (``openai/engine-0``, ``openai/engine-1``, ...: the stand-in answers any model
name). The proxy executes the module named in the config once per reference, so the hooks are made
once per (config, settings) and shared.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from fluidopt.core.errors import UsageError
from fluidopt.serving.litellm_router import ControllerRouting

# LiteLLM fetches a model price map from the internet at import unless told to use its bundled copy
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

SIGNAL = "fluidopt"  # the key of the plugin's signal: {"r": request id in the snapshot, "g": deployment}


class ControllerPlugin:
    """LiteLLM routing plugin: the controller picks, the candidates narrow to its deployment."""

    def __init__(self, strategy: ControllerRouting, models: list[str]) -> None:
        if len(set(models)) != len(models):
            raise UsageError("litellm proxy: every deployment needs its own litellm_params.model (a routing plugin "
                             f"picks by it), got {models}")
        self.strategy, self.models = strategy, list(models)

    async def run(self, context):
        holder: dict = {}
        await self.strategy.async_get_available_deployment(
            "", messages=context.structured_messages or [{"role": "user", "content": "x"}],
            request_kwargs={"metadata": {SIGNAL: holder}})
        context.signals[SIGNAL] = dict(holder)
        context.candidate_models = [self.models[holder["g"]]]
        return context


def _signal(data) -> dict | None:
    """The plugin's signal in a callback's request data (the metadata LiteLLM passes, under any of its keys)."""
    if not isinstance(data, dict):
        return None
    lp = data.get("litellm_params") if isinstance(data.get("litellm_params"), dict) else {}
    for md in (data.get("metadata"), data.get("litellm_metadata"), lp.get("metadata"), lp.get("litellm_metadata")):
        if isinstance(md, dict):
            sig = (md.get("routing_plugin_signals") or {}).get(SIGNAL)
            if isinstance(sig, dict) and "r" in sig:
                return sig
    return None


def _callbacks_class():
    from litellm.integrations.custom_logger import CustomLogger

    class ControllerCallbacks(CustomLogger):
        """The first token, the end and the failures of each routed request, to the strategy."""

        def __init__(self, strategy: ControllerRouting) -> None:
            super().__init__()
            self.strategy = strategy
            self.started: set[int] = set()

        def _first(self, r: int) -> None:
            if r not in self.started:
                self.started.add(r)
                self.strategy.first_token(r)

        async def async_post_call_streaming_deployment_hook(self, request_data, response_chunk, call_type):
            sig = _signal(request_data)
            if sig is not None and sig["r"] not in self.started:
                d = response_chunk.model_dump() if hasattr(response_chunk, "model_dump") else {}
                if any((c.get("text") or (c.get("delta") or {}).get("content")) for c in d.get("choices") or ()):
                    self._first(sig["r"])
            return None

        async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
            sig = _signal(kwargs)
            if sig is not None:
                self._first(sig["r"])  # a call that was not streamed: its prefill ended with it
                self.started.discard(sig["r"])
                self.strategy.finished(sig["r"], ok=True)

        async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
            sig = _signal(kwargs)
            if sig is not None:
                self.started.discard(sig["r"])
                self.strategy.finished(sig["r"], ok=False)

    return ControllerCallbacks


@functools.cache
def _hooks(config: str, policy: str, profile: str, prompt: float, output: float, rate: float,
           block_size: int | None):
    import yaml

    from fluidopt.calibration.profiles import load_profile
    from fluidopt.control.registry import make_controller
    from fluidopt.core.model import RequestClass, Scenario
    from fluidopt.serving.litellm_router import _strategy_class

    try:
        doc = yaml.safe_load(Path(config).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise UsageError(f"litellm proxy config {config!r}: {' '.join(str(e).split())}") from None
    deps = (doc or {}).get("model_list") if isinstance(doc, dict) else None
    if not isinstance(deps, list) or not deps or not all(
            isinstance(d, dict) and isinstance(d.get("litellm_params"), dict) and "api_base" in d["litellm_params"]
            and "model" in d["litellm_params"] for d in deps):
        raise UsageError(f"litellm proxy config {config!r}: model_list must list deployments with litellm_params.model "
                         "and litellm_params.api_base")
    gpu = load_profile(profile)
    sc = Scenario(gpu=gpu, gpus=len(deps), classes=(RequestClass("all", prompt, output, rate),), prefill_price=1.0,
                  decode_price=1.0, name="litellm-proxy")
    strategy = _strategy_class()(make_controller(policy, sc), deps, batch=gpu.batch, mean_output=output,
                                 block_size=block_size)
    plugin = ControllerPlugin(strategy, [d["litellm_params"]["model"] for d in deps])
    return plugin, _callbacks_class()(strategy)


def proxy_hooks(config: str | Path, *, policy: str, profile: str = "qwen-8b-a100", prompt: float = 1000.0,
                output: float = 100.0, rate: float = 1.0, block_size: int | None = None):
    """(routing plugin, callbacks) running fluidopt policy ``policy`` over the deployments of the LiteLLM
    proxy config ``config`` (its ``model_list``), planned for one request class of ``prompt`` and
    ``output`` tokens (means) at ``rate`` requests per s on GPUs of ``profile``. The output length the
    controller sees is that mean (a prediction), never a request's ``max_tokens``. ``block_size``: the
    engines' prefix-cache block, so that cache-aware controllers see the prefixes. Made once per
    arguments: the proxy loads the module that calls this once for the plugin and once for the callbacks,
    and both must share one controller."""
    return _hooks(str(Path(config).resolve()), policy, profile, float(prompt), float(output), float(rate),
                  block_size)
