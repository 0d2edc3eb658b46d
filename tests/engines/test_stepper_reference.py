"""The vLLM stepper against an independent, naive implementation of vLLM 0.2's scheduler.

The stepper keeps a decode step O(1) (requests grouped by length modulo the block size, completions on
a heap); the reference below walks every request every iteration, as vLLM's ``Scheduler._schedule``
does, with blocks counted per request. On random workloads that preempt often they must agree on every
request's first token, finish and preemptions.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.engines import engine_config, replay

LAW = IterationLaw(PrefillLaw(0.02, 1.4e-4, 8e-9), DecodeLaw((0.023, 6e-7, 6e-5), (0.020, 5e-7, 1.2e-4), 5))


def naive_vllm(law, arrival, prompt, output, *, max_tokens, max_seqs, kv_blocks, bs=16, watermark=0.01, limit):
    n = len(arrival)
    gen = [0] * n
    blocks = [0] * n
    first = [math.nan] * n
    done = [math.nan] * n
    pre = [0] * n
    waiting, running = [], []
    free, wm = kv_blocks, int(watermark * kv_blocks)
    now, nxt = 0.0, 0
    while True:
        while nxt < n and arrival[nxt] <= now:
            if prompt[nxt] <= limit:
                waiting.append(nxt)
            nxt += 1
        batch, tokens = [], 0
        while waiting:
            r = waiting[0]
            length = prompt[r] + gen[r]
            need = -(-length // bs)
            if tokens + length > max_tokens or free - need < wm or len(running) + len(batch) + 1 > max_seqs:
                break
            waiting.pop(0)
            free -= need
            blocks[r] = need
            batch.append(r)
            tokens += length
        if batch:
            now += law.prefill_time([prompt[r] + gen[r] for r in batch])
            for r in batch:
                gen[r] += 1
                if gen[r] == 1:
                    first[r] = now
                if gen[r] >= output[r]:
                    done[r] = now
                    free += blocks[r]
                else:
                    running = sorted(running + [r])
            continue
        if running:
            queue, kept = list(running), []
            while queue:
                r = queue.pop(0)
                ok = True
                while free < 1:
                    victim = queue.pop() if queue else r
                    free += blocks[victim]
                    blocks[victim] = 0
                    pre[victim] += 1
                    waiting.insert(0, victim)
                    if victim == r:
                        ok = False
                        break
                if ok:
                    if -(-(prompt[r] + gen[r]) // bs) > blocks[r]:
                        blocks[r] += 1
                        free -= 1
                    kept.append(r)
            running = kept
            if running:
                now += law.decode_time(sum(prompt[r] + gen[r] for r in running), len(running))
                for r in list(running):
                    gen[r] += 1
                    if gen[r] >= output[r]:
                        done[r] = now
                        free += blocks[r]
                        running.remove(r)
            continue
        if nxt >= n:
            break
        now = max(now, arrival[nxt])
    return np.array(first), np.array(done), np.array(pre)


@pytest.mark.parametrize("seed", range(6))
def test_vllm_stepper_matches_the_naive_scheduler(seed):
    rng = np.random.default_rng(seed)
    n = 80
    arrival = np.cumsum(rng.exponential(1 / 12.0, n))
    prompt = rng.integers(1, 400, n)
    output = rng.integers(1, 60, n)
    kv_blocks = int(rng.integers(30, 80))
    cfg = engine_config("vllm", kv_tokens=kv_blocks * 16, max_num_batched_tokens=512, max_num_seqs=8,
                        max_model_len=512)
    r = replay(LAW, cfg, arrival, prompt, output)
    first, done, pre = naive_vllm(LAW, list(arrival), [int(x) for x in prompt], [int(x) for x in output],
                                  max_tokens=512, max_seqs=8, kv_blocks=kv_blocks, limit=512)
    np.testing.assert_allclose(r.first_token, first, rtol=0, atol=1e-9)
    np.testing.assert_allclose(r.finish, done, rtol=0, atol=1e-9)
    assert list(r.preemptions) == list(pre)
    assert not np.isnan(done).any()


def test_the_random_workloads_do_preempt():
    rng = np.random.default_rng(0)
    arrival = np.cumsum(rng.exponential(1 / 12.0, 80))
    cfg = engine_config("vllm", kv_tokens=30 * 16, max_num_batched_tokens=512, max_num_seqs=8, max_model_len=512)
    r = replay(LAW, cfg, arrival, rng.integers(1, 400, 80), rng.integers(1, 60, 80))
    assert r.preemptions.sum() > 0


def naive_mixed(law, arrival, prompt, output, *, budget_total, counts_decodes, cap, max_seqs, kv_blocks, bs=16,
                watermark=0.01):
    """Chunked prefill / the paper's rule, request by request: decodes first, then prompt chunks."""
    n = len(arrival)
    gen, blocks, cached = [0] * n, [0] * n, [0] * n
    first, done, pre = [math.nan] * n, [math.nan] * n, [0] * n
    waiting, running, prefilling = [], [], []
    free, wm = kv_blocks, int(watermark * kv_blocks)
    now, nxt = 0.0, 0
    cap = cap or n
    while True:
        while nxt < n and arrival[nxt] <= now:
            waiting.append(nxt)
            nxt += 1
        budget = budget_total - (len(running) if counts_decodes else 0)
        while waiting and len(prefilling) < cap:
            r = waiting[0]
            need = -(-(prompt[r] + gen[r]) // bs)
            if free - need < wm or len(running) + len(prefilling) >= max_seqs:
                break
            waiting.pop(0)
            free -= need
            blocks[r], cached[r] = need, 0
            prefilling.append(r)
        chunks, tokens, att = [], 0, 0
        for r in prefilling[:cap]:
            if budget <= 0:
                break
            o = cached[r]
            m = min(prompt[r] + gen[r] - o, budget)
            chunks.append((r, m))
            tokens, att, budget = tokens + m, att + (o + m) ** 2 - o**2, budget - m
        queue, kept = list(running), []
        while queue:
            r = queue.pop(0)
            ok = True
            while free < 1:
                victim = queue.pop() if queue else r
                free += -(-(prompt[victim] + gen[victim] - 1) // bs)
                pre[victim] += 1
                waiting.insert(0, victim)
                if victim == r:
                    ok = False
                    break
            if ok:
                if (prompt[r] + gen[r]) % bs == 1 % bs:
                    free -= 1
                kept.append(r)
        running = kept
        if tokens == 0 and not running:
            if nxt >= n:
                break
            now = max(now, arrival[nxt])
            continue
        now += law.mixed(tokens, att, sum(prompt[r] + gen[r] for r in running), len(running))
        for r in list(running):
            gen[r] += 1
            if gen[r] >= output[r]:
                done[r] = now
                free += -(-(prompt[r] + gen[r] - 1) // bs)
                running.remove(r)
        for r, m in chunks:
            cached[r] += m
            if cached[r] == prompt[r] + gen[r]:
                prefilling.remove(r)
                gen[r] += 1
                if gen[r] == 1:
                    first[r] = now
                if gen[r] >= output[r]:
                    done[r] = now
                    free += -(-(prompt[r] + gen[r] - 1) // bs)
                else:
                    running = sorted(running + [r])
    return np.array(first), np.array(done), np.array(pre)


@pytest.mark.parametrize("engine, budget, seed", [("chunked", 256, s) for s in range(3)] + [("paper", 128, s) for s in range(3)])
def test_mixed_steppers_match_the_naive_scheduler(engine, budget, seed):
    rng = np.random.default_rng(100 + seed)
    n = 80
    arrival = np.cumsum(rng.exponential(1 / 10.0, n))
    prompt, output = rng.integers(1, 400, n), rng.integers(1, 60, n)
    kv_blocks = int(rng.integers(40, 90))
    cfg = engine_config(engine, kv_tokens=kv_blocks * 16, max_num_batched_tokens=budget, max_num_seqs=8)
    r = replay(LAW, cfg, arrival, prompt, output)
    first, done, pre = naive_mixed(LAW, list(arrival), [int(x) for x in prompt], [int(x) for x in output],
                                   budget_total=budget, counts_decodes=cfg.budget_counts_decodes,
                                   cap=cfg.prefills_per_iteration, max_seqs=8, kv_blocks=kv_blocks)
    np.testing.assert_allclose(r.first_token, first, rtol=0, atol=1e-9)
    np.testing.assert_allclose(r.finish, done, rtol=0, atol=1e-9)
    assert list(r.preemptions) == list(pre)
    assert not np.isnan(done).any()
