"""Controllers in a real serving loop, on loopback (docs/serving.md).

* :mod:`~fluidopt.serving.engine_server`: a stand-in engine, one instance emulated in real time
  (:class:`fluidopt.engines.live.LiveEngine`) behind an OpenAI-compatible HTTP API with vLLM's metrics;
* :mod:`~fluidopt.serving.replayer`: a trace replayer client that records TTFT, TPOT and E2E per request;
* :mod:`~fluidopt.serving.prefix`: the stand-in's prefix cache (the simulator's rules) and block ids;
* :mod:`~fluidopt.serving.litellm_router`: LiteLLM's router driving a fluidopt controller;
* :mod:`~fluidopt.serving.litellm_proxy`: the same in the LiteLLM proxy, loaded from its config file;
* :mod:`~fluidopt.serving.loop`: stand-ins, router and replayer in one command, torn down at the end.

Every server binds 127.0.0.1. The HTTP stack (starlette, uvicorn, httpx) and LiteLLM come with the
``serve`` extra.
"""
