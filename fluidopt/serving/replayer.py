"""A trace replayer: sends a trace's requests at their timestamps to an OpenAI-compatible endpoint,
streams the answers and records per-request TTFT, TPOT, E2E, status and errors.

Prompts: where the trace has block hashes (Mooncake JSON lines), the prompt is one deterministic text
chunk of the block size per hash id (``block_size`` words ``h<id>.<j>``), so requests that share blocks
send identical text and a cache-aware router or engine sees the trace's reuse; it is cut or padded to
the trace's prompt length with words unique to the request. Elsewhere every word is unique to the
request. The stand-in counts one token per word, so it sees the trace's lengths exactly. Each request
asks for ``max_tokens`` = the trace's output length with ``ignore_eos``, as vLLM's serving benchmark.

Times: requests go out at ``time / speed`` wall seconds after the start; recorded latencies are
multiplied back by ``speed``, so they are on the trace's (the model's) clock. ``tpot``: (E2E - TTFT) /
(tokens - 1), vLLM's definition (0 for one token).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fluidopt.core.errors import TraceError, UsageError


@dataclass
class Record:
    """One request's outcome. Times in model seconds (wall x speed); NaN where not reached."""

    index: int
    scheduled_s: float
    prompt_tokens: int
    output_tokens: int
    received_tokens: int = 0
    status: int = 0  # HTTP status; 0: no response
    error: str = ""
    ttft_s: float = math.nan
    tpot_s: float = math.nan
    e2e_s: float = math.nan

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error


def read_trace(path: str | Path, requests: int | None = None):
    """The trace as a frame (``time`` s from the first request, ``prompt``, ``output``, ``hashes`` where
    present; ``attrs["block_size"]``), its first ``requests`` rows. Format by content, as ``--trace``."""
    from fluidopt.workloads.jsonl import is_jsonl, read_jsonl_trace
    from fluidopt.workloads.traces import _is_azure, read_azure_trace, read_trace_csv

    p = Path(path)
    if p.is_dir():
        raise TraceError(f"trace file {str(p)!r}: is a folder, expected a file")
    if not p.is_file():
        raise TraceError(f"trace file {str(p)!r}: no such file")
    if is_jsonl(p):
        df = read_jsonl_trace(p)
    elif _is_azure(p):
        df = read_azure_trace(p)
    else:
        df = read_trace_csv(p)
    if requests is not None:
        df = df.iloc[:requests]
    return df


def prompt_text(index: int, prompt: int, hashes=None, block_size: int = 512) -> str:
    """The prompt of request ``index``: ``prompt`` words, from its block hashes where it has them."""
    words: list[str] = []
    if hashes is not None:
        for h in hashes:
            if len(words) >= prompt:
                break
            words.extend(f"h{int(h)}.{j}" for j in range(block_size))
    del words[prompt:]
    words.extend(f"r{index}.{j}" for j in range(len(words), prompt))
    return " ".join(words)


async def _one(client, url: str, rec: Record, body: dict, t_start: float, speed: float, timeout: float) -> None:
    delay = t_start + rec.scheduled_s / speed - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    t0 = time.perf_counter()
    marks = {"first": None, "last": t0}

    async def stream() -> None:
        async with client.stream("POST", url, json=body) as r:
            rec.status = r.status_code
            if r.status_code != 200:
                text = (await r.aread()).decode("utf-8", "replace")
                try:
                    text = json.loads(text)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    pass
                rec.error = " ".join(str(text).split())[:300] or f"HTTP {r.status_code}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    c = json.loads(data)
                except ValueError:
                    rec.error = "a stream event that is not JSON"
                    return
                if "error" in c:
                    rec.error = " ".join(str(c["error"]).split())[:300]
                    return
                for ch in c.get("choices") or ():
                    text = ch.get("text")
                    if text is None:
                        text = (ch.get("delta") or {}).get("content")
                    if text:
                        if marks["first"] is None:
                            marks["first"] = time.perf_counter()
                        rec.received_tokens += len(text.split())
                        marks["last"] = time.perf_counter()

    try:
        await asyncio.wait_for(stream(), timeout)
    except asyncio.TimeoutError:
        rec.error = f"no complete answer within {timeout:g} s"
    except Exception as e:  # connection refused or reset, a broken stream: recorded, never raised
        rec.error = f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]
    finally:
        first, last = marks["first"], marks["last"]
        if first is not None:
            rec.ttft_s = (first - t0) * speed
            rec.e2e_s = (last - t0) * speed
            n = rec.received_tokens
            rec.tpot_s = (rec.e2e_s - rec.ttft_s) / (n - 1) if n > 1 else 0.0
        if rec.status == 200 and not rec.error and rec.received_tokens < rec.output_tokens:
            rec.error = f"the stream ended after {rec.received_tokens} of {rec.output_tokens} tokens"


async def replay_async(frame, url: str, *, speed: float = 1.0, model: str = "fluidopt-standin", chat: bool = False,
                       timeout: float = 600.0, progress: bool = True) -> tuple[list[Record], float]:
    """Send every request of ``frame`` to ``url`` (its base, e.g. ``http://127.0.0.1:8000``); the records
    and the wall duration (s)."""
    import httpx

    path = "/v1/chat/completions" if chat else "/v1/completions"
    target = url.rstrip("/") + path
    has_hashes = "hashes" in frame.columns
    B = int(frame.attrs.get("block_size", 512))
    recs, bodies = [], []
    for i, row in enumerate(frame.itertuples(index=False)):
        prompt, output = int(row.prompt), int(row.output)
        recs.append(Record(i, float(row.time), prompt, output))
        text = prompt_text(i, prompt, row.hashes if has_hashes else None, B)
        body = {"model": model, "max_tokens": output, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        body.update({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text})
        bodies.append(body)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(recs), desc="replay", unit="req", leave=False)
    # One connection per request, never a kept-alive one: reusing a connection the server is closing (its
    # keep-alive timer) can lose a request between client and server, which a benchmark must not do; a
    # loopback connect costs well under a millisecond.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    _dump_on_sigusr1()
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout)) as client:
        t_start = time.perf_counter()

        async def run(rec, body):
            await _one(client, target, rec, body, t_start, speed, timeout)
            if bar is not None:
                bar.update(1)

        await asyncio.gather(*(run(r, b) for r, b in zip(recs, bodies)))
        wall = time.perf_counter() - t_start
    if bar is not None:
        bar.close()
    return recs, wall


def _dump_on_sigusr1() -> None:
    """SIGUSR1 prints where every unfinished request waits (stderr): for a run that does not finish."""
    import signal
    import sys

    if not hasattr(signal, "SIGUSR1"):
        return
    loop = asyncio.get_running_loop()

    def dump():
        for t in asyncio.all_tasks(loop):
            t.print_stack(limit=12, file=sys.stderr)

    try:
        loop.add_signal_handler(signal.SIGUSR1, dump)
    except (RuntimeError, ValueError):  # not the main thread
        pass


def summarize(recs: list[Record], wall_s: float, speed: float) -> dict:
    """vLLM-benchmark-style figures; latencies in model seconds, ``duration_s`` in wall seconds."""
    ok = [r for r in recs if r.ok]

    def stats(name: str, xs: list[float]) -> dict:
        a = np.asarray([x for x in xs if not math.isnan(x)], dtype=float)
        if a.size == 0:
            return {f"{name}_mean_s": None, f"{name}_median_s": None, f"{name}_p99_s": None}
        return {f"{name}_mean_s": float(a.mean()), f"{name}_median_s": float(np.median(a)),
                f"{name}_p99_s": float(np.percentile(a, 99))}

    out = {"requests": len(recs), "completed": len(ok), "failed": len(recs) - len(ok), "duration_s": wall_s,
           "speed": speed, "total_input_tokens": int(sum(r.prompt_tokens for r in ok)),
           "total_output_tokens": int(sum(r.received_tokens for r in ok))}
    model_s = wall_s * speed
    out["request_throughput"] = len(ok) / model_s if model_s > 0 else None
    out["output_throughput"] = out["total_output_tokens"] / model_s if model_s > 0 else None
    out |= stats("ttft", [r.ttft_s for r in ok])
    out |= stats("tpot", [r.tpot_s for r in ok if r.received_tokens > 1])
    out |= stats("e2e", [r.e2e_s for r in ok])
    errors: dict[str, int] = {}
    for r in recs:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
    out["errors"] = dict(sorted(errors.items(), key=lambda kv: -kv[1])[:5])
    return out


def summary_text(s: dict) -> str:
    """The summary in the shape of vLLM's ``benchmark_serving.py`` (ms; per model second)."""
    def ms(x):
        return "n/a" if x is None else f"{1000 * x:.2f}"

    def num(x, f=".2f"):
        return "n/a" if x is None else format(x, f)

    lines = ["{s:{c}^50}".format(s=" Serving Benchmark Result ", c="="),
             f"{'Successful requests:':<40}{s['completed']:<10}",
             f"{'Failed requests:':<40}{s['failed']:<10}",
             f"{'Benchmark duration (s, wall):':<40}{s['duration_s']:<10.2f}",
             f"{'Speed-up (model s per wall s):':<40}{s['speed']:<10g}",
             f"{'Total input tokens:':<40}{s['total_input_tokens']:<10}",
             f"{'Total generated tokens:':<40}{s['total_output_tokens']:<10}",
             f"{'Request throughput (req/s):':<40}{num(s['request_throughput']):<10}",
             f"{'Output token throughput (tok/s):':<40}{num(s['output_throughput']):<10}"]
    for title, key, label in (("Time to First Token", "ttft", "TTFT"),
                              ("Time per Output Token (excl. 1st token)", "tpot", "TPOT"),
                              ("End-to-end Latency", "e2e", "E2EL")):
        lines.append("{s:{c}^50}".format(s=title, c="-"))
        lines += [f"{'Mean ' + label + ' (ms):':<40}{ms(s[key + '_mean_s']):<10}",
                  f"{'Median ' + label + ' (ms):':<40}{ms(s[key + '_median_s']):<10}",
                  f"{'P99 ' + label + ' (ms):':<40}{ms(s[key + '_p99_s']):<10}"]
    for err, n in s["errors"].items():
        lines.append(f"failed x{n}: {err}")
    lines.append("=" * 50)
    return "\n".join(lines)


def write_outputs(out_dir: str | Path, recs: list[Record], summary: dict) -> tuple[Path, Path]:
    """``requests.csv`` (one row per request) and ``summary.json`` in ``out_dir``."""
    import pandas as pd

    from fluidopt.core.files import atomic_path

    d = Path(out_dir)
    if d.exists() and not d.is_dir():
        raise UsageError(f"--out {str(d)!r}: is a file, expected a folder")
    d.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = d / "requests.csv", d / "summary.json"
    with atomic_path(csv_path) as tmp:
        pd.DataFrame([asdict(r) for r in recs]).to_csv(tmp, index=False)
    with atomic_path(json_path) as tmp:
        Path(tmp).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return csv_path, json_path
