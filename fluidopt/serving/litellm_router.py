"""LiteLLM's router driving a registered fluidopt controller, and a small HTTP front for it.

:class:`ControllerRouting` is a LiteLLM custom routing strategy (``CustomRoutingStrategyBase``,
registered with ``Router.set_custom_routing_strategy``). It keeps a
:class:`~fluidopt.control.snapshot.ClusterSnapshot` of the fleet (one GPU per deployment) and runs the
controller through the protocol:

* the pick (``async_get_available_deployment``) adds the request to the snapshot with its prompt length
  (words of the prompt) and a *predicted* output length (never ``max_tokens``: the class mean unless a
  predictor is given), calls ``on_arrival`` and awaits the decision; a controller that holds the request
  (a gate) holds it inside the pick until a later event places it;
* a decision is a ``start_prefill(r, g)`` or an ``enqueue`` into GPU g's instance queue: the request goes
  to deployment g;
* the first streamed token ends the prefill; the request then decodes where its KV cache is (a
  one-call-one-backend router cannot move it): the snapshot records ``start_decode(r, g)`` and the
  controller gets ``on_slot_freed(g)``; a decision to decode elsewhere is not taken (docs/serving.md
  lists the controllers this changes);
* the end of the stream (or a failure) ends the decode: ``on_decode_done``, ``on_slot_freed``.

The in-flight counts per deployment are the router's own (requests picked and not finished), and each
engine's ``/metrics`` is scraped every ``scrape_interval`` s (running and waiting requests, KV usage) into
:attr:`ControllerRouting.engine_metrics`; a deployment whose requests fail or whose scrape fails is
marked down for ``down_s`` s and not picked meanwhile (the controller's choice is redirected to the
least-loaded live deployment).

With ``block_size``, each request carries its prompt's block ids (:func:`fluidopt.serving.prefix.block_ids`
of its words, as the stand-ins hash them) into the snapshot, which keeps the router's own index of each
engine's cached blocks (a block enters it when its request's first token arrives), so the cache-aware
controllers (``sglang``, ``llm-d``, ``consistent-hash``, ``dynamo-kv``, ``mooncake``,
``gate-and-route-prefix``) see the prefixes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Callable, Sequence

from fluidopt.control.protocol import DECODE, PREFILL, PREFILL_QUEUE, WAIT_PREFILL, Controller
from fluidopt.control.snapshot import ClusterSnapshot
from fluidopt.core.errors import ActionError

# LiteLLM fetches a model price map from the internet at import unless told to use its bundled copy
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

_METRIC = re.compile(r"^(vllm:[a-z_]+)\{[^}]*\}\s+([0-9.eE+-]+|nan|inf)\s*$")


def prompt_units(messages=None, input=None, request_kwargs=None) -> list[str]:
    """The prompt's words as the stand-in reads them (token ids as text), for the block ids."""
    if messages:
        out: list[str] = []
        for m in messages:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                out += c.split()
            elif isinstance(c, list):
                for part in c:
                    if isinstance(part, dict):
                        out += str(part.get("text", "")).split()
        return out
    p = input if input is not None else (request_kwargs or {}).get("prompt")
    if isinstance(p, str):
        return p.split()
    if isinstance(p, list) and p and all(isinstance(x, int) for x in p):
        return [str(x) for x in p]
    if isinstance(p, list):
        return [w for x in p if isinstance(x, str) for w in x.split()]
    return []


def prompt_words(messages=None, input=None, request_kwargs=None) -> int:
    """The prompt's length as the stand-in counts it: whitespace-separated words."""
    if messages:
        n = 0
        for m in messages:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                n += len(c.split())
            elif isinstance(c, list):
                n += sum(len(str(p.get("text", "")).split()) for p in c if isinstance(p, dict))
        return max(n, 1)
    p = input if input is not None else (request_kwargs or {}).get("prompt")
    if isinstance(p, str):
        return max(len(p.split()), 1)
    if isinstance(p, list):
        return max(sum(len(x.split()) if isinstance(x, str) else 1 for x in p), 1)
    return 1


class ControllerRouting:
    """A fluidopt controller as LiteLLM's routing strategy over ``deployments`` (LiteLLM model-list
    entries, one per engine). ``batch``: concurrent requests per engine the controller plans for (the
    profile's B); ``predict``: prompt tokens -> predicted output tokens (default: ``mean_output``).
    Times in seconds."""

    def __init__(self, controller: Controller, deployments: Sequence[dict], *, batch: int, mean_output: float,
                 predict: Callable[[int], float] | None = None, class_names: Sequence[str] = ("all",),
                 scrape_interval: float = 0.5, down_s: float = 5.0, hold_timeout: float = 600.0,
                 block_size: int | None = None) -> None:
        self.ctrl = controller
        self.block_size = block_size
        self.deployments = list(deployments)
        n = len(self.deployments)
        self.t0 = time.monotonic()
        self.snap = ClusterSnapshot(n, batch, list(class_names), clock=lambda: time.monotonic() - self.t0,
                                    service="tokens", block_size=block_size)
        self.predict = predict or (lambda prompt: mean_output)
        self.scrape_interval, self.down_s, self.hold_timeout = scrape_interval, down_s, hold_timeout
        self.in_flight = [0] * n
        self.sent = [0] * n
        self.failures = [0] * n
        self.down_until = [0.0] * n
        self.engine_metrics: list[dict[str, float]] = [{} for _ in range(n)]
        self.off_book = 0  # requests the controller lost track of (an action it could not take)
        self.picks: list[tuple[float, int]] = []  # (monotonic s, deployment) of every pick
        self.failed_at: list[tuple[float, int]] = []  # (monotonic s, deployment) of every failed call
        self.redirected = 0
        self._waiting: dict[int, asyncio.Future] = {}
        self._where: dict[int, int] = {}
        self._scraper: asyncio.Task | None = None
        self.snap.setup(self.ctrl)

    # -- the pick ---------------------------------------------------------------------------------
    async def async_get_available_deployment(self, model: str, messages=None, input=None, specific_deployment=False,
                                             request_kwargs=None):
        if self._scraper is None and self.scrape_interval > 0:
            self._scraper = asyncio.get_running_loop().create_task(self._scrape())
        holder = self._holder(request_kwargs)
        st = self.snap
        prompt = prompt_words(messages, input, request_kwargs)
        blocks = None
        if self.block_size:
            from fluidopt.serving.prefix import block_ids

            blocks = block_ids(prompt_units(messages, input, request_kwargs), self.block_size)
        r = st.add_request(0, prompt, max(1, round(self.predict(prompt))), blocks=blocks)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[r] = fut
        self.ctrl.on_arrival(st, r)
        if st.req_phase(r) == WAIT_PREFILL and st.req_queue(r) < 0:
            st.enqueue(r, PREFILL_QUEUE)  # unplaced: the protocol's default
        self._flush()
        try:
            g = await asyncio.wait_for(fut, self.hold_timeout)
        except BaseException:  # timed out, or the caller cancelled the pick: r leaves the snapshot
            self._waiting.pop(r, None)
            if r in st._req:
                phase = st.req_phase(r)
                if phase == PREFILL:
                    g_pre = st.preempted(r)
                    st.abandon(r)
                    self._freed(g_pre)
                elif phase == WAIT_PREFILL:
                    st.abandon(r)
            raise
        h = self._live(g)
        if h != g:
            self._move(r, g, h)
            g = h
        self._where[r] = g
        self.in_flight[g] += 1
        self.sent[g] += 1
        self.picks.append((time.monotonic(), g))
        if holder is not None:
            holder["r"], holder["g"] = r, g
        return self.deployments[g]

    def get_available_deployment(self, *a, **kw):  # LiteLLM's sync path: not used by the async router
        raise NotImplementedError("ControllerRouting routes async calls only (Router.acompletion / atext_completion)")

    @staticmethod
    def _holder(request_kwargs) -> dict | None:
        for key in ("metadata", "litellm_metadata"):
            md = (request_kwargs or {}).get(key)
            if isinstance(md, dict) and isinstance(md.get("fluidopt"), dict):
                return md["fluidopt"]
        return None

    def _live(self, g: int) -> int:
        now = time.monotonic()
        if self.down_until[g] <= now:
            return g
        live = [h for h in range(len(self.deployments)) if self.down_until[h] <= now]
        if not live:
            return g
        self.redirected += 1
        return min(live, key=lambda h: self.in_flight[h])

    def _move(self, r: int, g: int, h: int) -> None:
        """The controller placed r on g, which is down: r goes to h; the snapshot follows and g's freed
        prefill slot is offered to the controller."""
        st = self.snap
        if st.req_phase(r) == PREFILL:
            st.preempted(r)
            try:
                st.start_prefill(r, h)
            except ActionError:
                st.abandon(r)
                self.off_book += 1
        elif st.req_phase(r) == WAIT_PREFILL:  # in g's instance queue: out of the snapshot's books
            st.abandon(r)
            self.off_book += 1
        self._freed(g)

    def _freed(self, *gpus: int) -> None:
        """Capacity freed on ``gpus``: the controller's on_slot_freed for each, then the decisions out."""
        for g in dict.fromkeys(gpus):
            self.ctrl.on_slot_freed(self.snap, g)
        self._flush()

    def _flush(self) -> None:
        """Send the controller's decisions: a prefill on g or a request put in g's instance queue."""
        st = self.snap
        n = st.n_gpus
        for kind, r, x in st.outbox:
            g = x if kind == "prefill" else (x - 2 if kind.startswith("enqueue") and 2 <= x < 2 + n else None)
            if g is None:
                continue
            fut = self._waiting.pop(r, None)
            if fut is not None and not fut.done():
                fut.set_result(g)
        st.outbox.clear()

    # -- events from the front (callbacks) -----------------------------------------------------------
    def first_token(self, r: int) -> None:
        """r's first token arrived: its prefill is over; it decodes where its KV cache is."""
        st = self.snap
        g = self._where.get(r)
        if g is None or r not in st._req:
            return
        if st.req_phase(r) != PREFILL:
            # sent from an instance queue: the engine started it; the snapshot places it now
            try:
                st.start_prefill(r, g)
            except ActionError:
                st.abandon(r) if st.req_phase(r) == WAIT_PREFILL else None
                self.off_book += 1
                return
        g_pre = st.prefill_finished(r)  # the snapshot's GPU: g unless a move failed
        try:
            st.start_decode(r, g)
        except ActionError:  # a cap the controller set on g: the engine decodes it anyway, off the books
            st.abandon(r)
            self.off_book += 1
        self._freed(g_pre, g)

    def finished(self, r: int, ok: bool = True) -> None:
        """r's stream ended (``ok``) or failed: it leaves the snapshot, its slot is free."""
        st = self.snap
        g = self._where.pop(r, None)
        if g is None:
            return
        self.in_flight[g] -= 1
        if not ok:
            self.failures[g] += 1
            self.failed_at.append((time.monotonic(), g))
            self.down_until[g] = time.monotonic() + self.down_s
        if r in st._req:
            phase = st.req_phase(r)
            if phase == DECODE:
                st.decode_finished(r)
                self.ctrl.on_decode_done(st, r, g)
            elif phase == PREFILL:
                g_pre = st.preempted(r)
                st.abandon(r)
                self._freed(g_pre, g)
                return
            else:
                st.abandon(r)
            self._freed(g)

    # -- engine metrics -------------------------------------------------------------------------
    async def _scrape(self) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=max(self.scrape_interval, 0.5)) as client:
            while True:
                for g, d in enumerate(self.deployments):
                    base = d["litellm_params"]["api_base"].rstrip("/").removesuffix("/v1")
                    try:
                        text = (await client.get(base + "/metrics")).text
                    except httpx.ConnectError:  # refused: the engine is gone (a slow answer is not a fault)
                        self.down_until[g] = time.monotonic() + self.down_s
                        continue
                    except httpx.HTTPError:
                        continue
                    m = {}
                    for line in text.splitlines():
                        hit = _METRIC.match(line)
                        if hit:
                            m[hit.group(1)] = float(hit.group(2))
                    self.engine_metrics[g] = m
                await asyncio.sleep(self.scrape_interval)

    async def close(self) -> None:
        if self._scraper is not None:
            self._scraper.cancel()
            try:
                await self._scraper
            except asyncio.CancelledError:
                pass


def deployments_for(urls: Sequence[str], model: str = "fluidopt-standin") -> list[dict]:
    """LiteLLM model-list entries, one per engine base URL (OpenAI-compatible, any key)."""
    return [{"model_name": model, "litellm_params": {"model": f"openai/{model}", "api_base": u.rstrip("/") + "/v1",
                                                       "api_key": "none", "stream_timeout": 600},
             "model_info": {"id": f"engine-{i}"}} for i, u in enumerate(urls)]


def make_router(urls: Sequence[str], router: str, *, scenario=None, batch: int = 16, mean_output: float = 128.0,
                model: str = "fluidopt-standin", options: dict | None = None, block_size: int | None = None):
    """(LiteLLM Router, ControllerRouting or None) for ``router`` = ``litellm:POLICY`` (a registered fluidopt
    policy, built for ``scenario``) or ``litellm-builtin:STRATEGY`` (LiteLLM's own, e.g. ``simple-shuffle``,
    ``least-busy``). ``block_size``: the stand-ins' prefix-cache block, for the snapshot's block ids."""
    import litellm  # noqa: F401  (the environment variable above must be set first)
    from litellm import Router

    from fluidopt.core.errors import UsageError

    kind, _, name = router.partition(":")
    dep = deployments_for(urls, model)
    if kind == "litellm-builtin":
        known = ("simple-shuffle", "least-busy", "latency-based-routing", "usage-based-routing")
        if name not in known:
            raise UsageError(f"--router {router!r}: expected litellm-builtin:STRATEGY with STRATEGY one of {', '.join(known)}")
        return Router(model_list=dep, routing_strategy=name, num_retries=0), None
    if kind != "litellm" or not name:
        raise UsageError(f"--router {router!r}: expected litellm:POLICY or litellm-builtin:STRATEGY")
    from fluidopt.control.registry import make_controller

    ctrl = make_controller(name, scenario, **(options or {}))
    strategy = _strategy_class()(ctrl, dep, batch=batch, mean_output=mean_output,
                                 class_names=scenario.class_names if scenario is not None else ("all",),
                                 block_size=block_size)
    r = Router(model_list=dep, num_retries=0)
    r.set_custom_routing_strategy(strategy)
    return r, strategy


def _strategy_class():
    from litellm.types.router import CustomRoutingStrategyBase

    return type("FluidoptRouting", (ControllerRouting, CustomRoutingStrategyBase), {})


# -- one HTTP client for every call LiteLLM makes ------------------------------------------------------
def shared_http_client():
    """The ``httpx.AsyncClient`` LiteLLM sends every engine call through (``litellm.aclient_session``).

    Without it LiteLLM 1.110 builds a new client for each call (with a new TLS context: about 0.12 s of
    CPU) and never closes it; the client's finalizer then schedules its ``aclose()`` on whatever event
    loop runs in the thread that happens to collect it. With the front in a thread beside the replayer,
    that was the replayer's loop for 13% of the calls (64 of 507 over 16 runs): the front loop's sockets
    were aborted, and its selector and ready queue changed, from a foreign thread, which asyncio does not
    allow (its debug mode raises "Non-thread-safe operation invoked on an event loop other than the
    current one").
    It is the defect we found behind the front's rare stall (docs/serving.md). One client, made and
    closed on the front's own loop, leaves no finalizer work.

    Idle connections expire after 1 s, before an engine's keep-alive timeout (uvicorn: 5 s) can close one
    under a new request."""
    import httpx

    return httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0), follow_redirects=True,
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=256,
                                                 keepalive_expiry=1.0))


@contextlib.asynccontextmanager
async def litellm_session():
    """``litellm.aclient_session`` set to :func:`shared_http_client` for the block, on the running loop;
    closed and restored after it (for a program that calls the router without :func:`build_front`)."""
    import litellm

    prev, client = litellm.aclient_session, shared_http_client()
    litellm.aclient_session = client
    try:
        yield client
    finally:
        litellm.aclient_session = prev
        await client.aclose()


# -- an HTTP front: the OpenAI API in, LiteLLM's router out ------------------------------------------
def build_front(router, strategy: ControllerRouting | None, model: str = "fluidopt-standin"):
    """A starlette app serving ``/v1/completions`` and ``/v1/chat/completions`` (streaming) through
    ``router``, telling ``strategy`` of first tokens and ends; ``/health``; ``/stats`` (JSON). Serve it with
    its lifespan on: that is where LiteLLM's shared HTTP client is made and closed (:func:`litellm_session`),
    and where the scraper stops."""
    import json

    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    def error(status: int, msg: str) -> JSONResponse:
        return JSONResponse({"error": {"message": msg, "type": "invalid_request_error", "code": status}},
                            status_code=status)

    async def handle(request, chat: bool):
        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            return error(400, "the request body is not a JSON object")
        kw = {k: body[k] for k in ("max_tokens", "temperature") if k in body}
        holder: dict = {}
        md = {"fluidopt": holder}
        extra = {"ignore_eos": True} if body.get("ignore_eos") else {}
        try:
            if chat:
                if not isinstance(body.get("messages"), list):
                    return error(400, "'messages' must be a list")
                resp = await router.acompletion(model=model, messages=body["messages"], stream=True, metadata=md,
                                                extra_body=extra, **kw)
            else:
                if "prompt" not in body:
                    return error(400, "'prompt' is required")
                resp = await router.atext_completion(model=model, prompt=body["prompt"], stream=True, metadata=md,
                                                     extra_body=extra, **kw)
        except Exception as e:  # no deployment answered: the client gets 502 with the reason
            if strategy is not None and "r" in holder:
                strategy.finished(holder["r"], ok=False)
            return error(502, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")

        async def events():
            first = True
            ok = False
            try:
                async for chunk in resp:
                    d = chunk.model_dump() if hasattr(chunk, "model_dump") else dict(chunk)
                    texts = [(c.get("text") or (c.get("delta") or {}).get("content") or "") for c in d.get("choices") or ()]
                    if first and any(texts):
                        first = False
                        if strategy is not None and "r" in holder:
                            strategy.first_token(holder["r"])
                    yield "data: " + json.dumps(d, default=str) + "\n\n"
                ok = True
                yield "data: [DONE]\n\n"
            except Exception as e:
                yield "data: " + json.dumps({"error": f"{type(e).__name__}: {str(e)[:300]}"}) + "\n\n"
            finally:
                if strategy is not None and "r" in holder:
                    strategy.finished(holder["r"], ok=ok)

        return StreamingResponse(events(), media_type="text/event-stream")

    async def comp(request):
        return await handle(request, False)

    async def chat(request):
        return await handle(request, True)

    async def health(request):
        return PlainTextResponse("")

    async def stats(request):
        if strategy is None:
            return JSONResponse({})
        st = strategy.snap
        return JSONResponse({"sent": strategy.sent, "in_flight": strategy.in_flight, "failures": strategy.failures,
                             "off_book": strategy.off_book, "redirected": strategy.redirected,
                             "held": len(strategy._waiting), "snapshot_requests": len(st.requests()),
                             "prefill_queue": st.qlen(PREFILL_QUEUE),
                             "prefilling": [st.gpu_prefill(g) for g in range(st.n_gpus)],
                             "engine_metrics": strategy.engine_metrics})

    async def tasks(request):  # what the router's event loop is waiting on: for a run that does not finish
        import io

        out = io.StringIO()
        for t in asyncio.all_tasks():
            if t is not asyncio.current_task():
                t.print_stack(limit=8, file=out)
        return PlainTextResponse(out.getvalue())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with litellm_session():
            try:
                yield
            finally:
                if strategy is not None:
                    await strategy.close()

    return Starlette(lifespan=lifespan, routes=[Route("/v1/completions", comp, methods=["POST"]),
                             Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/health", health, methods=["GET"]), Route("/stats", stats, methods=["GET"]),
                             Route("/debug/tasks", tasks, methods=["GET"])])
