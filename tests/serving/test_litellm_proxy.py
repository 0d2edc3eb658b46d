"""The LiteLLM proxy's config file with a fluidopt controller (examples/serving/litellm_proxy.yaml): LiteLLM's
own resolver (``get_instance_fn``, what ``litellm --config`` uses for ``router_settings.plugins`` and
``litellm_settings.callbacks``) loads our plugin and callbacks from the shipped file, they share one
controller, and a Router built from the file's settings sends each call where the controller says and
tells it of the call's end. In process, with LiteLLM's mock responses: the proxy itself needs
``litellm[proxy]``, which does not install here (docs/serving.md, section 3)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from fluidopt.core.errors import UsageError

# on the wait lane beside the loop tests (tests/conftest.py), so that one process pays LiteLLM's import (5 CPU-s)
pytestmark = pytest.mark.waits

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "serving" / "litellm_proxy.yaml"


@pytest.mark.integration  # imports LiteLLM (about 5 s here, shared with the loop tests of the same worker)
def test_the_proxy_config_loads_our_plugin_and_routes_through_the_controller(monkeypatch):
    litellm = pytest.importorskip("litellm")
    yaml = pytest.importorskip("yaml")
    from litellm import Router
    from litellm.proxy.types_utils.utils import get_instance_fn

    doc = yaml.safe_load(CONFIG.read_text())
    plugins = [get_instance_fn(v, config_file_path=str(CONFIG)) for v in doc["router_settings"]["plugins"]]
    callbacks = [get_instance_fn(v, config_file_path=str(CONFIG)) for v in doc["litellm_settings"]["callbacks"]]
    (plugin,), (cb,) = plugins, callbacks
    st = plugin.strategy
    assert cb.strategy is st  # the proxy executes the module twice; both share one controller
    settings = {k: v for k, v in doc["router_settings"].items() if k != "plugins"}
    router = Router(model_list=doc["model_list"], plugins=plugins, **settings)
    monkeypatch.setattr(litellm, "callbacks", callbacks)
    picks = []
    real_pick = st.async_get_available_deployment

    async def spy(*a, **kw):
        dep = await real_pick(*a, **kw)
        picks.append(st.deployments.index(dep))
        return dep

    monkeypatch.setattr(st, "async_get_available_deployment", spy)

    async def main():
        served = []
        for _ in range(4):
            resp = await router.atext_completion(model="fluidopt-standin", prompt="w " * 100, max_tokens=3,
                                                 mock_response="x y z")
            served.append(resp._hidden_params["api_base"])
        deadline = time.monotonic() + 5
        while sum(st.in_flight) and time.monotonic() < deadline:  # the success events are logged async
            await asyncio.sleep(0.05)
        return served

    served = asyncio.run(main())
    bases = [d["litellm_params"]["api_base"] for d in doc["model_list"]]
    assert len(picks) == 4 and served == [bases[g] for g in picks]  # every call went to the controller's deployment
    assert sum(st.sent) == 4 and st.in_flight == [0, 0] and not st.snap.requests()  # ends reported


def test_each_deployment_needs_its_own_model(tmp_path):
    pytest.importorskip("litellm")
    from fluidopt.serving.litellm_proxy import proxy_hooks

    cfg = tmp_path / "c.yaml"
    cfg.write_text("model_list:\n" + "".join(
        f"  - model_name: m\n    litellm_params: {{model: openai/same, api_base: 'http://127.0.0.1:{p}/v1'}}\n"
        for p in (1, 2)))
    with pytest.raises(UsageError, match="its own litellm_params.model"):
        proxy_hooks(cfg, policy="round-robin")
    cfg.write_text("model_list: []\n")
    with pytest.raises(UsageError, match="model_list must list deployments"):
        proxy_hooks(cfg, policy="round-robin")
