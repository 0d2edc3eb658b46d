"""Calibrated planning rates: the saturated throughput of one GPU under the simulator's iteration law.

The fluid estimate :func:`fluidopt.fluid.multiperiod.batch_throughput` assumes b decodes always
running, a resident context of prompt + output / 2 per decode and ceil(mean prompt / C) prefill
chunks. A GPU of the simulator (``service="tokens"``, docs/simulator.md section 1.1) kept saturated
at batch limit b differs in three ways, all exact here:

* **Resident context.** A decode of D output tokens holds P + j tokens in its j-th iteration
  (j = 0 .. D-1), so it contributes D P + D (D-1) / 2 token-iterations; a running decode is
  length-biased: with geometric lengths of mean m its mean generated count is m - 1, not m / 2. A
  prefill reserves its whole prompt for its ceil(P / C) iterations (E[ceil(P/C) P] token-iterations).
* **Chunks.** E[ceil(P / C)] over the prompt's law, not ceil(E[P] / C) (1.74, not 2, for a
  geometric prompt of mean 300 and C = 256).
* **Decodes below the limit.** A prefill is admitted only while the decodes are below b and runs one
  at a time, so the decode count n falls below b while a prefill runs and decodes finish. The count
  is a discrete-time Markov chain over iterations on (n, chunks left of the running prefill): each
  decode finishes at the end of an iteration with probability 1 / E[D] (exact for the geometric law
  of ``lengths = "exponential"``, memoryless; an approximation for the others); a finished prefill's
  decode joins at once and a new prefill starts while n < b. Its stationary law gives x, the
  completions per iteration (= E[n] / E[D], Little's law in iterations). It is solved embedded at
  prefill starts (b states; a decode survives K iterations with probability (1 - 1/E[D])^K), which
  equals the iteration-by-iteration chain (b x max K states, kept as a reference) to 1e-12 and stays
  fast for long prompts (a geometric prompt of mean 20,000 tokens: 1.7 s instead of minutes).

With x, renewal-reward in iteration units gives everything else exactly: the mixed share of the
iterations is x E[K] (K = ceil(P / C)), the mean resident KV is x (E[K P] + E[D] E[P] +
E[D (D-1)] / 2), so the mean iteration is tau_solo + x E[K] (tau_mix - tau_solo) + kappa KV and the
throughput is x / (mean iteration) completions per second. Without a KV capacity (no KV
preemption). tests/fluid/test_saturation.py checks it against the simulator within 2%.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import GPUProfile, RequestClass
from fluidopt.fluid.batch import batch_throughput

__all__ = ["LengthLaw", "Saturation", "class_laws", "length_law", "saturated_throughput"]

_TAIL = 1e-12  # probability mass left out of a length law's support


@dataclass(frozen=True)
class LengthLaw:
    """A token-count law on the integers >= 1: ``values`` (tokens) with probabilities ``probs``
    (summing to 1). The simulator's laws (fluidopt.workloads) are built by :func:`length_law`."""

    values: np.ndarray
    probs: np.ndarray

    @property
    def mean(self) -> float:
        """E[L] (tokens)."""
        return float(self.values @ self.probs)

    def expect(self, f) -> float:
        """E[f(L)] for a vectorised function f of the token count."""
        return float(np.asarray(f(self.values), dtype=float) @ self.probs)

    @staticmethod
    def mixture(laws: Sequence[LengthLaw], weights: Sequence[float]) -> LengthLaw:
        """The mixture of ``laws`` with ``weights`` (normalised)."""
        w = np.asarray(weights, dtype=float)
        w = w / w.sum()
        vals = np.concatenate([law.values for law in laws])
        ps = np.concatenate([wi * law.probs for wi, law in zip(w, laws)])
        u, inv = np.unique(vals, return_inverse=True)
        return LengthLaw(u, np.bincount(inv, weights=ps, minlength=len(u)))


def length_law(kind: str, mean: float, sigma: float | None = None) -> LengthLaw:
    """The law of a token count as the simulator draws it (fluidopt.workloads):

    * ``"exponential"``: geometric on {1, 2, ...} with p = 1 / mean;
    * ``"fixed"``: floor(mean) or ceil(mean), with the mean exactly ``mean``;
    * ``"lognormal"``: 1 + R(Y), Y lognormal with E[Y] = mean - 1 and log-sd ``sigma``, R randomised
      rounding (P(R(Y) = j) = E[max(0, 1 - |Y - j|)], the second difference of E[(Y - v)+]).

    The support is cut where less than 1e-12 of the mass is left (the cut mass goes to the last value)."""
    if not (isinstance(mean, (int, float)) and math.isfinite(mean) and mean >= 1):
        raise ScenarioError(f"length_law: mean: expected tokens >= 1, got {mean!r}")
    if kind == "fixed":
        lo = math.floor(mean)
        fr = mean - lo
        if fr == 0:
            return LengthLaw(np.array([lo]), np.array([1.0]))
        return LengthLaw(np.array([lo, lo + 1]), np.array([1.0 - fr, fr]))
    if kind == "exponential":
        p = 1.0 / mean
        if p >= 1.0:
            return LengthLaw(np.array([1]), np.array([1.0]))
        kmax = max(1, math.ceil(math.log(_TAIL) / math.log1p(-p)))
        k = np.arange(1, kmax + 1)
        pr = p * (1.0 - p) ** (k - 1)
        pr[-1] += 1.0 - pr.sum()
        return LengthLaw(k, pr)
    if kind == "lognormal":
        from scipy.stats import norm

        if sigma is None or not sigma > 0:
            raise ScenarioError(f"length_law: sigma: expected a log-scale shape > 0 for lognormal, got {sigma!r}")
        m = mean - 1.0
        if m <= 0:
            return LengthLaw(np.array([1]), np.array([1.0]))
        mu = math.log(m) - 0.5 * sigma**2
        jmax = math.ceil(math.exp(mu + sigma * norm.isf(_TAIL))) + 2

        def Cv(v):  # E[(Y - v)+], the lognormal's stop-loss transform (accurate in the far tail)
            with np.errstate(divide="ignore"):
                lv = np.log(np.maximum(v, 1e-300))
            c = m * norm.cdf((mu + sigma**2 - lv) / sigma) - v * norm.cdf((mu - lv) / sigma)
            return np.where(v > 0, c, m - v)

        j = np.arange(0, jmax + 1, dtype=float)
        # P(R(Y) = j) = E[max(0, 1 - |Y - j|)] = C(j+1) - 2 C(j) + C(j-1)
        pr = Cv(j + 1.0) - 2.0 * Cv(j) + Cv(j - 1.0)
        pr = np.clip(pr, 0.0, None)
        pr[-1] += max(0.0, 1.0 - pr.sum())
        return LengthLaw(1 + j.astype(np.int64), pr / pr.sum())
    raise ScenarioError(f"length_law: kind: expected exponential, fixed or lognormal, got {kind!r}")


def class_laws(c: RequestClass) -> tuple[LengthLaw, LengthLaw]:
    """(prompt law, output law) of class ``c`` as the simulator's scenario workload draws them."""
    return (length_law(c.lengths, c.prompt, c.prompt_sigma), length_law(c.lengths, c.decode, c.decode_sigma))


@dataclass(frozen=True)
class Saturation:
    """One GPU kept saturated at batch limit ``b``: ``rate`` completions/s, ``decodes`` the mean
    decodes running (iteration average, <= b), ``per_iteration`` completions per iteration,
    ``mixed_share`` the share of iterations with a prefill chunk, ``iteration`` the mean iteration (s),
    ``kv`` the mean resident KV cache (tokens), ``fluid`` the fluid estimate's rate (requests/s) for
    comparison."""

    b: int
    rate: float
    decodes: float
    per_iteration: float
    mixed_share: float
    iteration: float
    kv: float
    fluid: float


@functools.lru_cache(maxsize=256)
def _chain(b: int, p: float, kprobs: tuple[float, ...]) -> tuple[float, float]:
    return _prefill_cycles(b, p, np.asarray(kprobs))


def _prefill_cycles(b: int, p: float, kprobs: np.ndarray) -> tuple[float, float]:
    """The same chain as :func:`_decode_chain`, embedded at prefill starts (b states, not b x R).

    A cycle starts when a prefill of K chunks starts next to n < b decodes. Each decode survives an
    iteration with probability 1 - p, independently (geometric lengths), so after the K iterations
    Bin(n, (1-p)^K) survive and the prefill's decode joins: m = survivors + 1. If m < b the next cycle
    starts at once with m decodes; if m = b (all n = b-1 survived) the GPU runs solo with b decodes
    until at least one finishes (Geometric(q) iterations, q = 1 - (1-p)^b) and the next cycle starts
    with b - j decodes, j ~ Bin(b, p) given j >= 1. Per cycle: one completion (in steady state), K + W
    iterations and n (1 - (1-p)^K) / p + b W decode-iterations; renewal-reward over the stationary law
    of the cycle's start gives (mean decodes, completions per iteration)."""
    from scipy.stats import binom

    ks = np.flatnonzero(kprobs > 0) + 1  # chunk counts
    pk = kprobs[ks - 1]
    surv = (1.0 - p) ** ks  # P(a decode survives K iterations), per K
    q = 1.0 - (1.0 - p) ** b
    jj = np.arange(1, b + 1)
    after_wait = binom.pmf(jj, b, p) / q if q > 0 else np.zeros(b)  # j >= 1 finish: next start b - j
    M = np.zeros((b, b))
    T = np.zeros(b)  # expected iterations of a cycle starting with n decodes
    Dn = np.zeros(b)  # expected decode-iterations
    EK = float(pk @ ks)
    dec_k = (1.0 - surv) / p if p > 0 else ks.astype(float)  # sum_{i<K} (1-p)^i
    for n in range(b):
        S = np.arange(n + 1)
        ps = pk @ binom.pmf(S[None, :], n, surv[:, None])  # survivors' law, mixed over K
        full = ps[n] if n == b - 1 else 0.0  # m = b: all b - 1 survived
        keep = ps.copy()
        if n == b - 1:
            keep[n] = 0.0
        ok = S + 1 < b
        M[n, S[ok] + 1] += keep[ok]
        if full > 0:
            M[n, b - jj] += full * after_wait
        wait = full / q if q > 0 else 0.0
        T[n] = EK + wait
        Dn[n] = n * float(pk @ dec_k) + b * wait
    # stationary law of the cycle start: pi (M - I) = 0, sum pi = 1
    A = (M.T - np.eye(b))
    A[-1, :] = 1.0
    rhs = np.zeros(b)
    rhs[-1] = 1.0
    pi = np.linalg.solve(A, rhs)
    pi = np.clip(pi, 0.0, None)
    pi /= pi.sum()
    it = float(pi @ T)
    return float(pi @ Dn) / it, 1.0 / it


def _decode_chain(b: int, p: float, kprobs: np.ndarray) -> tuple[float, float]:
    """(A reference, iteration by iteration; :func:`_prefill_cycles` computes the same faster.)
    The stationary (mean decodes, completions per iteration) of the chain in the module docstring:
    decode count n in 0..b, chunks left r in 1..R of the running prefill (r = 0 only at n = b);
    each decode finishes with probability ``p`` per iteration; ``kprobs[k-1]`` = P(K = k)."""
    from scipy.sparse import coo_array
    from scipy.sparse.linalg import spsolve
    from scipy.stats import binom

    R = len(kprobs)
    nst = b * R + 1  # (n, r) for n < b, r = 1..R; then (b, 0)
    top = nst - 1

    def idx(n, r):
        return n * R + (r - 1)

    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    kidx = np.arange(1, R + 1)

    def add(src, dst, pr):
        rows.append(np.full(np.size(dst), src))
        cols.append(np.atleast_1d(dst))
        vals.append(np.atleast_1d(pr))

    def start(src, n_after, pr_n):
        """A new prefill starts (n_after < b) with prob pr_n: spread over its chunk count."""
        add(src, idx(n_after, kidx), pr_n * kprobs)

    for n in range(b + 1):
        jmax = n
        js = np.arange(0, jmax + 1)
        pj = binom.pmf(js, n, p) if n else np.array([1.0])
        keep = (pj > 1e-15) | (js == 0)
        js, pj = js[keep], pj[keep]
        if n == b:
            src = top
            add(src, top, pj[js == 0].sum())
            for j, q in zip(js[js > 0], pj[js > 0]):
                start(src, b - j, q)
            continue
        rr = np.arange(2, R + 1)
        for j, q in zip(js, pj):
            m = n - j
            if R > 1:  # the prefill goes on: one chunk fewer
                rows.append(idx(n, rr))
                cols.append(idx(m, rr - 1))
                vals.append(np.full(R - 1, q))
            src = idx(n, 1)  # its last chunk: its decode joins
            if m + 1 < b:
                start(src, m + 1, q)
            else:
                add(src, top, q)
    P = coo_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(nst, nst)).tocsr()
    A = (P.T - coo_array((np.ones(nst), (np.arange(nst), np.arange(nst))), shape=(nst, nst))).tolil()
    A[top, :] = np.ones(nst)
    rhs = np.zeros(nst)
    rhs[top] = 1.0
    pi = spsolve(A.tocsc(), rhs)
    pi = np.clip(pi, 0.0, None)
    pi /= pi.sum()
    n_of = np.concatenate([np.repeat(np.arange(b), R), [b]])
    mean_n = float(pi @ n_of)
    return mean_n, mean_n * p


def saturated_throughput(gpu: GPUProfile, b: int, prompt: LengthLaw, output: LengthLaw,
                         weights: Sequence[float] | None = None) -> Saturation:
    """Completions per second of one GPU kept saturated with at most ``b`` decodes (module docstring).

    ``prompt`` / ``output``: the token-count laws (one pair, or sequences of pairs for a mixture of
    classes with ``weights``, each class's prompt and output independent). Chunked prefill, one
    prefill at a time, admitted only while the decodes are below ``b``; no KV capacity."""
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
        raise ScenarioError(f"saturated_throughput: b: expected a batch limit >= 1, got {b!r}")
    pl = list(prompt) if isinstance(prompt, (list, tuple)) else [prompt]
    ol = list(output) if isinstance(output, (list, tuple)) else [output]
    w = np.ones(len(pl)) if weights is None else np.asarray(weights, dtype=float)
    w = w / w.sum()
    C = gpu.chunk

    def chunks(v):
        return np.ceil(v / C)

    EK = sum(wi * law.expect(chunks) for wi, law in zip(w, pl))
    EKP = sum(wi * law.expect(lambda v: chunks(v) * v) for wi, law in zip(w, pl))
    ED = sum(wi * law.mean for wi, law in zip(w, ol))
    EDP = sum(wi * pa.mean * oa.mean for wi, pa, oa in zip(w, pl, ol))
    EDD = sum(wi * law.expect(lambda v: v * (v - 1.0) / 2.0) for wi, law in zip(w, ol))
    kmix = LengthLaw.mixture([LengthLaw(np.unique(chunks(law.values)).astype(int),
                                        np.bincount(np.searchsorted(np.unique(chunks(law.values)), chunks(law.values)),
                                                    weights=law.probs)) for law in pl], w)
    R = int(kmix.values.max())
    kprobs = np.zeros(R)
    kprobs[kmix.values.astype(int) - 1] = kmix.probs
    mean_n, x = _chain(int(b), float(1.0 / ED), tuple(float(v) for v in kprobs))
    mixed = x * EK
    kv = x * (EKP + EDP + EDD)
    it = gpu.tau_solo + mixed * (gpu.tau_mix - gpu.tau_solo) + gpu.kv_time_per_token * kv
    Pm = sum(wi * law.mean for wi, law in zip(w, pl))
    return Saturation(b=int(b), rate=x / it, decodes=mean_n, per_iteration=x, mixed_share=mixed, iteration=it, kv=kv,
                      fluid=batch_throughput(gpu, int(b), Pm, ED))
