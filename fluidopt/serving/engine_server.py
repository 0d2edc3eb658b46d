"""A stand-in engine server: one instance emulated in real time behind an OpenAI-compatible API.

Each iteration's duration comes from the iteration-time law and the engine's scheduler
(:class:`fluidopt.engines.live.LiveEngine`, the same rules as :func:`fluidopt.engines.replay`); the
server sleeps it (divided by ``speed``) and then streams each running request's new token. Requests
that arrive during an iteration join the queue for the next one, as in vLLM's engine loop.

Choices where a real engine has a tokenizer: a prompt's length is its number of whitespace-separated
words (a list of token ids counts its ids); each generated token is the text ``" x"``. The output length
is ``max_tokens`` (default 16), as vLLM's benchmark sets it with ``ignore_eos``. Latencies in
``/metrics`` are wall seconds, what a client sees (model seconds / speed).

The prefix cache (on by default, as in vLLM v1; ``prefix_cache=False`` turns it off) is the simulator's
(:mod:`fluidopt.serving.prefix`): block ids are chained hashes of the prompt's words in blocks of
``prefix_block_size``, and a prefill computes only the uncached tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import time
import uuid
from dataclasses import dataclass, field

from fluidopt.calibration.timemodels import IterationLaw
from fluidopt.engines.live import LiveEngine
from fluidopt.engines.stepper import EngineConfig
from fluidopt.serving.prefix import DEFAULT_BLOCK_SIZE, LivePrefixCache, block_ids

# vLLM's histogram buckets (vllm/engine/metrics.py), in seconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
DEFAULT_MAX_TOKENS = 16


class BadRequest(ValueError):
    """A malformed request: answered 400 with this message."""


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, x: float) -> None:
        self.count += 1
        self.sum += x
        for i, b in enumerate(self.buckets):
            if x <= b:
                self.counts[i] += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f"# TYPE {name} histogram"]
        for b, c in zip(self.buckets, self.counts):
            out.append(f'{name}_bucket{{{labels},le="{b}"}} {c}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_count{{{labels}}} {self.count}")
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        return out


@dataclass
class _Live:
    """One request in flight: its token counts arrive on ``queue`` (None: finished)."""

    prompt: int
    output: int
    arrived: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    first: float | None = None


class EngineServer:
    """The emulated instance and its counters. ``speed``: model seconds per wall second."""

    def __init__(self, law: IterationLaw, cfg: EngineConfig, *, speed: float = 1.0, model: str = "fluidopt-standin",
                 engine_name: str = "vllm", prefix_cache: bool = True,
                 prefix_block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if not (speed > 0 and math.isfinite(speed)):
            raise ValueError("speed must be a positive number")
        # the cache shares the instance's KV (cfg.kv_blocks blocks of cfg.block_size tokens)
        self.cache = (LivePrefixCache(prefix_block_size, None if cfg.kv_blocks is None
                                      else cfg.kv_blocks * cfg.block_size) if prefix_cache else None)
        self.engine = LiveEngine(law, cfg, cache=self.cache)
        self.speed = float(speed)
        self.model = model
        self.engine_name = engine_name
        self.live: dict[int, _Live] = {}
        self.ttft, self.tpot, self.e2e = Histogram(TTFT_BUCKETS), Histogram(TPOT_BUCKETS), Histogram(E2E_BUCKETS)
        self.prompt_tokens = self.generation_tokens = self.success = self.preemptions = 0
        self.model_busy_s = 0.0  # model seconds of the iterations run
        self.lag_s = 0.0  # wall seconds the loop ran behind its schedule, summed over iterations
        self.wall_busy_s = 0.0  # wall seconds from each iteration's start to its tokens' delivery
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    # -- the engine loop --------------------------------------------------------------------------
    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def submit(self, prompt: int, output: int, units: list[str] | None = None) -> tuple[int, _Live]:
        """Queue a request of ``prompt`` tokens (``units``: its words or token ids as text, for the prefix
        cache's block ids) and ``output`` tokens."""
        blocks = block_ids(units, self.cache.bs) if self.cache is not None and units else ()
        try:
            r = self.engine.add(prompt, output, blocks)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        lv = _Live(prompt, output, time.monotonic())
        self.live[r] = lv
        self.prompt_tokens += prompt
        assert self._wake is not None
        self._wake.set()
        return r, lv

    async def _run(self) -> None:
        clock = time.monotonic
        due = clock()
        while True:
            if not self.engine.busy():
                self._wake.clear()
                await self._wake.wait()
                due = clock()  # idle until now: the schedule restarts at the arrival
            started = clock()
            s = self.engine.step()
            if s is None:
                continue
            self.model_busy_s += s.duration
            due += s.duration / self.speed
            wait = due - clock()
            if wait > 0:
                await asyncio.sleep(wait)
            else:
                self.lag_s += -wait
                await asyncio.sleep(0)  # let the handlers run even when behind
            self.preemptions = self.engine.n_preemptions
            now = clock()
            self.wall_busy_s += now - started
            for r, k in s.tokens.items():
                lv = self.live.get(r)
                if lv is None:
                    continue
                if lv.first is None:
                    lv.first = now
                    self.ttft.observe(now - lv.arrived)
                lv.queue.put_nowait(k)
            for r in s.finished:
                lv = self.live.pop(r, None)
                if lv is None:
                    continue
                self.success += 1
                self.generation_tokens += lv.output
                self.e2e.observe(now - lv.arrived)
                if lv.output > 1 and lv.first is not None:
                    self.tpot.observe((now - lv.first) / (lv.output - 1))
                lv.queue.put_nowait(None)

    # -- metrics ----------------------------------------------------------------------------------
    def metrics_text(self) -> str:
        e = self.engine
        lab = f'model_name="{self.model}"'
        running = len(e.running) + len(e.prefilling)
        out = []
        for name, kind, value in (
            ("vllm:num_requests_running", "gauge", running),
            ("vllm:num_requests_waiting", "gauge", len(e.waiting)),
            ("vllm:gpu_cache_usage_perc", "gauge", e.kv_usage()),
            ("vllm:kv_cache_usage_perc", "gauge", e.kv_usage()),
            ("vllm:num_preemptions_total", "counter", self.preemptions),
            ("vllm:prompt_tokens_total", "counter", self.prompt_tokens),
            ("vllm:generation_tokens_total", "counter", self.generation_tokens),
            ("vllm:request_success_total", "counter", self.success),
            ("fluidopt:model_busy_seconds_total", "counter", self.model_busy_s),
            ("fluidopt:schedule_lag_seconds_total", "counter", self.lag_s),
            ("fluidopt:wall_busy_seconds_total", "counter", self.wall_busy_s),
            ("fluidopt:iterations_total", "counter", e.iterations),
        ):
            out += [f"# TYPE {name} {kind}", f"{name}{{{lab}}} {value}"]
        if self.cache is not None:
            out += self._prefix_lines(lab)
        out += self.ttft.lines("vllm:time_to_first_token_seconds", lab)
        out += self.tpot.lines("vllm:time_per_output_token_seconds", lab)
        out += self.e2e.lines("vllm:e2e_request_latency_seconds", lab)
        return "\n".join(out) + "\n"

    def _prefix_lines(self, lab: str) -> list[str]:
        """vLLM v1's prefix-cache counters (tokens of every lookup), v0's hit-rate gauge, and the
        simulator's count (cached tokens of each request's first prefill, over its prompt tokens)."""
        e = self.engine
        first = [c for c in e.cached if c >= 0]
        out = []
        for name, kind, value in (
            ("vllm:prefix_cache_queries_total", "counter", e.prefix_queries),
            ("vllm:prefix_cache_hits_total", "counter", e.prefix_hits),
            ("vllm:gpu_prefix_cache_hit_rate", "gauge", e.prefix_hits / e.prefix_queries if e.prefix_queries else 0.0),
            ("fluidopt:prefix_cache_prefills_total", "counter", len(first)),
            ("fluidopt:prefix_cache_prompt_tokens_total", "counter",
             sum(p for p, c in zip(e.P, e.cached) if c >= 0)),
            ("fluidopt:prefix_cache_cached_tokens_total", "counter", sum(first)),
            ("fluidopt:prefix_cache_blocks", "gauge", self.cache.blocks_cached()),
            ("fluidopt:prefix_cache_evictions_total", "counter", self.cache.evictions),
        ):
            out += [f"# TYPE {name} {kind}", f"{name}{{{lab}}} {value}"]
        return out


# -- request parsing ------------------------------------------------------------------------------
def _prompt_units(prompt) -> list[str]:
    """The prompt's tokens: its words, or its token ids as text."""
    if isinstance(prompt, str):
        return prompt.split()
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [str(t) for t in prompt]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0].split()
    raise BadRequest("'prompt' must be a string, a list of token ids, or a list of one string")


def _message_units(messages) -> list[str]:
    """The words of every message's content, in order (the cache sees the conversation as one text)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects")
    n: list[str] = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("each message must be an object with a string 'role'")
        c = m.get("content")
        if isinstance(c, str):
            n += c.split()
        elif isinstance(c, list):
            for part in c:
                if not isinstance(part, dict) or not isinstance(part.get("text", ""), str):
                    raise BadRequest("message content parts must be objects with a string 'text'")
                n += part.get("text", "").split()
        else:
            raise BadRequest("message 'content' must be a string or a list of parts")
    return n


def parse_request(body: bytes, chat: bool) -> tuple[int, int, bool, bool, str, list[str]]:
    """(prompt tokens, output tokens, stream, include usage in the stream, model, the prompt's tokens as
    text) of a request body."""
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(req, dict):
        raise BadRequest("the request body must be a JSON object")
    if chat:
        units = _message_units(req.get("messages"))
    else:
        if "prompt" not in req:
            raise BadRequest("'prompt' is required")
        units = _prompt_units(req["prompt"])
    prompt = len(units)
    if prompt < 1:
        raise BadRequest("the prompt is empty (its length is counted in whitespace-separated words)")
    mt = req.get("max_tokens", req.get("max_completion_tokens", DEFAULT_MAX_TOKENS))
    if mt is None:
        mt = DEFAULT_MAX_TOKENS
    if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
        raise BadRequest(f"'max_tokens' must be an integer >= 1, got {mt!r}")
    n = req.get("n", 1)
    if n != 1:
        raise BadRequest("only n = 1 is supported")
    stream = req.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false")
    opts = req.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise BadRequest("'stream_options' must be an object")
    model = req.get("model", "")
    if not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    return prompt, mt, stream, bool(opts.get("include_usage", False)), model, units


# -- the ASGI app ---------------------------------------------------------------------------------
def build_app(server: EngineServer):
    """The starlette application over ``server``."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": status}},
                            status_code=status)

    async def completions(request, chat: bool):
        try:
            prompt, out, stream, usage, model, units = parse_request(await request.body(), chat)
            rid, lv = server.submit(prompt, out, units)
        except BadRequest as e:
            return error(400, str(e))
        name = model or server.model
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        usage_obj = {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out}

        def chunk(text: str | None, finish: str | None, first: bool = False) -> str:
            if chat:
                delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                kind = "chat.completion.chunk"
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
                kind = "text_completion"
            return "data: " + json.dumps({"id": ident, "object": kind, "created": created, "model": name,
                                          "choices": [choice]}) + "\n\n"

        if stream:
            async def events():
                sent = 0
                if chat:
                    yield chunk(None, None, first=True)
                while True:
                    k = await lv.queue.get()
                    if k is None:
                        break
                    if k > sent:
                        yield chunk(" x" * (k - sent), None)
                        sent = k
                yield chunk(None, "length")
                if usage:
                    yield "data: " + json.dumps({"id": ident, "object": "chat.completion.chunk" if chat else obj,
                                                 "created": created, "model": name, "choices": [],
                                                 "usage": usage_obj}) + "\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        while (await lv.queue.get()) is not None:
            pass
        text = " x" * out
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                  if chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"})
        return JSONResponse({"id": ident, "object": obj, "created": created, "model": name, "choices": [choice],
                             "usage": usage_obj})

    async def comp(request):
        return await completions(request, chat=False)

    async def chat(request):
        return await completions(request, chat=True)

    async def health(request):
        return PlainTextResponse("")

    async def metrics(request):
        return PlainTextResponse(server.metrics_text(), media_type="text/plain; version=0.0.4")

    async def model_info(request):  # SGLang's router asks its workers for these two
        return JSONResponse({"model_path": server.model, "tokenizer_path": None, "is_generation": True})

    async def server_info(request):
        cfg = server.engine.cfg
        return JSONResponse({"model_path": server.model, "engine": server.engine_name, "speed": server.speed,
                             "max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_num_batched_tokens,
                             "kv_blocks": cfg.kv_blocks, "block_size": cfg.block_size,
                             "enable_prefix_caching": server.cache is not None,
                             "prefix_block_size": server.cache.bs if server.cache is not None else None})

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": server.model, "object": "model",
                                                         "owned_by": "fluidopt"}]})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.start()
        try:
            yield
        finally:
            await server.stop()

    return Starlette(routes=[
        Route("/v1/completions", comp, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        *(Route(p, model_info, methods=["GET"]) for p in ("/model_info", "/get_model_info")),
        *(Route(p, server_info, methods=["GET"]) for p in ("/server_info", "/get_server_info")),
    ], lifespan=lifespan)


def bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:``port`` (0: a free port); loopback only, by design."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(1024)
    return s


def serve(server: EngineServer, sock: socket.socket, *, on_ready=None) -> None:
    """Run the app on ``sock`` until SIGINT / SIGTERM (uvicorn's handlers: a graceful stop)."""
    serve_app(build_app(server), sock, on_ready=on_ready)


def serve_app(app, sock: socket.socket, *, on_ready=None) -> None:
    """Run an ASGI ``app`` on ``sock`` with uvicorn until SIGINT / SIGTERM; ``on_ready()`` once it listens."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="auto", timeout_graceful_shutdown=2)
    userver = uvicorn.Server(config)

    async def main():
        task = asyncio.create_task(userver.serve(sockets=[sock]))
        while not userver.started and not task.done():
            await asyncio.sleep(0.01)
        if on_ready is not None and userver.started:
            on_ready()
        await task

    asyncio.run(main())


DEFAULT_PROFILE = "qwen-8b-a100"


def law_and_config(engine: str = "paper", *, profile: str | None = None, timemodel: str | None = None,
                   kv_tokens: int | None = None) -> tuple[IterationLaw, EngineConfig]:
    """The instance a stand-in emulates: a named GPU profile's straight line (default
    ``qwen-8b-a100``) or a ``[timemodel]`` TOML file, under ``engine``'s scheduler. With a profile, the
    ``paper`` engine takes the profile's chunk and batch, so it is the simulator's own GPU. Bad input
    raises :class:`~fluidopt.core.errors.UsageError` or the loader's error, one line."""
    from fluidopt.core.errors import UsageError
    from fluidopt.engines import ENGINES, engine_config

    if engine not in ENGINES:
        engine_config(engine)  # raises the "did you mean" error
    if profile is not None and timemodel is not None:
        raise UsageError("give --profile NAME or --timemodel TOML, not both")
    if kv_tokens is not None and kv_tokens < 1:
        raise UsageError(f"--kv-tokens {kv_tokens}: expected a positive number of tokens")
    over = {}
    if timemodel is not None:
        from fluidopt.calibration.timemodels import load_law_toml

        law = load_law_toml(timemodel)
    else:
        from fluidopt.calibration.profiles import load_profile

        gpu = load_profile(profile or DEFAULT_PROFILE)
        law = IterationLaw.from_gpu_profile(gpu)
        if engine == "paper":
            over = dict(max_num_batched_tokens=gpu.chunk, max_num_seqs=gpu.batch)
        if kv_tokens is None and gpu.kv_capacity is not None:
            kv_tokens = int(gpu.kv_capacity)
    return law, engine_config(engine, kv_tokens=kv_tokens, **over)
