"""The Python module examples/serving/litellm_proxy.yaml names: a fluidopt controller (here FCFS admission
with the work-stealing prefill, ``fi-wsp``) for the LiteLLM proxy, planned for one class of requests.
Edit the policy and the class to yours; ``fluidopt simulate --list-policies`` lists the policies, and
docs/serving.md says which fit a one-call-one-backend router."""

from pathlib import Path

from fluidopt.serving.litellm_proxy import proxy_hooks

plugin, callbacks = proxy_hooks(Path(__file__).with_name("litellm_proxy.yaml"), policy="fi-wsp",
                                profile="qwen-8b-a100", prompt=1500, output=20, rate=10.0)
