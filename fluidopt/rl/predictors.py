"""Output-length predictors for the RL router: decode-length buckets (docs/rl.md section 3).

The RL paper classifies each prompt into a decode-length bucket with a fine-tuned DistilBERT
(about 79% accurate when the task is known). fluidopt stands in for it with:

* :class:`NoisyOracle`: the true bucket with probability ``accuracy`` (per class or one number),
  otherwise a neighbouring bucket (uniform over the neighbours). The draw is a hash of the seed and
  the request's own attributes (arrival time, class, prompt and output lengths), never of the
  router's state or of the request id (ids are recycled), so every router in a comparison sees the
  *same* prediction for the same request.
* :class:`BinnedPredictor`: a trainable classifier from request features a trace does carry
  (prompt length and, when present, a class or application label): the majority bucket per
  (class, log2 prompt-length bin) cell, falling back to the class and then the global majority.
  :func:`confusion_matrix` reports how well a predictor does.

Buckets (output tokens): ``[0, 256)``, ``[256, 2048)``, ``[2048, inf)``. A bucket's
*representative* output length (what routers use where they need tokens: the progress fraction of
the reward, the mixing estimate, the token ledger of JSQ / Min-Min / Small-Large) is
:data:`BUCKET_TOKENS`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import numpy as np

from fluidopt.core.errors import ScenarioError

__all__ = [
    "BUCKET_EDGES",
    "BUCKET_TOKENS",
    "N_BUCKETS",
    "BinnedPredictor",
    "BucketTokens",
    "NoisyOracle",
    "TABLE1_ACCURACY",
    "bucket_of",
    "confusion_matrix",
    "scenario_accuracy",
]

BUCKET_EDGES = (256, 2048)
"""Upper edges (output tokens, exclusive) of the first two decode buckets."""
N_BUCKETS = 3
BUCKET_TOKENS = (128.0, 1152.0, 3072.0)
"""Representative output tokens per bucket: the midpoints of [0, 256) and [256, 2048), and 1.5 x 2048."""

_MASK = (1 << 64) - 1


def bucket_of(tokens: float) -> int:
    """The decode bucket (0, 1 or 2) of an output length in tokens."""
    if tokens < BUCKET_EDGES[0]:
        return 0
    if tokens < BUCKET_EDGES[1]:
        return 1
    return 2


def _mix(x: int) -> int:
    """splitmix64's finaliser: a fast, well-spread 64-bit hash step."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _uniform(seed: int, t: float, c: int, p: int, o: int) -> float:
    """A uniform in [0, 1) determined by the seed and the request's attributes."""
    h = _mix(seed & _MASK)
    h = _mix(h ^ struct.unpack("<Q", struct.pack("<d", float(t)))[0])
    c, p, o = int(c), int(p), int(o)  # numpy integers would overflow the 64-bit arithmetic
    h = _mix(h ^ ((c & 0xFFFF) << 48) ^ (p & 0xFFFFFF) << 24 ^ (o & 0xFFFFFF))
    return (h >> 11) * (1.0 / (1 << 53))


_U64 = np.uint64


def _mix_many(x: np.ndarray) -> np.ndarray:
    """:func:`_mix` over a uint64 array (numpy's uint64 arithmetic wraps modulo 2^64, as the mask does)."""
    x = x + _U64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def _uniform_many(seed: int, t, c, p, o) -> np.ndarray:
    """:func:`_uniform` over arrays of request attributes (the same bits, in bulk)."""
    h0 = _U64(_mix(seed & _MASK))
    tb = np.ascontiguousarray(t, dtype=np.float64).view(np.uint64)
    c = np.asarray(c, dtype=np.int64).astype(np.uint64)
    p = np.asarray(p, dtype=np.int64).astype(np.uint64)
    o = np.asarray(o, dtype=np.int64).astype(np.uint64)
    h = _mix_many(h0 ^ tb)
    h = _mix_many(h ^ ((c & _U64(0xFFFF)) << _U64(48)) ^ ((p & _U64(0xFFFFFF)) << _U64(24)) ^ (o & _U64(0xFFFFFF)))
    return (h >> _U64(11)).astype(np.float64) * (1.0 / (1 << 53))


class NoisyOracle:
    """The paper's bucket classifier as a noisy oracle: ``bucket(ctx, r)`` (0..2).

    ``accuracy``: probability of the true bucket, one number or one per class (the paper's
    classifier is about 0.79 overall). ``seed``: the same seed gives the same predictions for the
    same requests, whatever router asks.
    """

    def __init__(self, accuracy: float | Sequence[float] = 0.79, *, seed: int = 0):
        accs = [accuracy] if isinstance(accuracy, (int, float)) else list(accuracy)
        for a in accs:
            if isinstance(a, bool) or not isinstance(a, (int, float)) or not (0.0 <= a <= 1.0):
                raise ScenarioError(f"predictor: accuracy: expected a probability in [0, 1] (or one per class), got {accuracy!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ScenarioError(f"predictor: seed: expected an integer >= 0, got {seed!r}")
        self.accuracy = tuple(float(a) for a in accs)
        self.seed = int(seed)

    def predict(self, t: float, c: int, p: int, o: int) -> int:
        """The predicted bucket of a request (arrival time t s, class c, prompt p, output o tokens)."""
        true = bucket_of(o)
        acc = self.accuracy[c] if len(self.accuracy) > 1 else self.accuracy[0]
        u = _uniform(self.seed, t, c, p, o)
        if u < acc:
            return true
        # a neighbouring bucket, uniform over the neighbours (re-use the remaining randomness)
        v = (u - acc) / (1.0 - acc) if acc < 1.0 else 0.0
        if true == 0:
            return 1
        if true == N_BUCKETS - 1:
            return N_BUCKETS - 2
        return true - 1 if v < 0.5 else true + 1

    def predict_many(self, t, c, p, o) -> np.ndarray:
        """:meth:`predict` over arrays (arrival times s, classes, prompt and output tokens): the same
        buckets, computed in bulk (the environment does this once per episode)."""
        o = np.asarray(o, dtype=np.int64)
        c = np.asarray(c, dtype=np.int64)
        true = np.where(o < BUCKET_EDGES[0], 0, np.where(o < BUCKET_EDGES[1], 1, 2))
        acc = np.asarray(self.accuracy, dtype=np.float64)[c] if len(self.accuracy) > 1 else np.full(o.shape, self.accuracy[0])
        u = _uniform_many(self.seed, t, c, p, o)
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where(acc < 1.0, (u - acc) / (1.0 - acc), 0.0)
        wrong = np.where(true == 0, 1, np.where(true == N_BUCKETS - 1, N_BUCKETS - 2, np.where(v < 0.5, true - 1, true + 1)))
        return np.where(u < acc, true, wrong).astype(np.int64)

    def bucket(self, ctx, r: int) -> int:
        """The predicted bucket of request r in a running simulation (ctx: the cluster view)."""
        return self.predict(ctx.req_arrival(r), ctx.req_class(r), ctx.req_prompt(r), ctx.req_output(r))

    def __repr__(self) -> str:
        return f"NoisyOracle(accuracy={list(self.accuracy) if len(self.accuracy) > 1 else self.accuracy[0]}, seed={self.seed})"


class BucketTokens:
    """Adapter: a bucket predictor as a token predictor ``f(ctx, r) -> tokens`` (the heuristic
    balancers' ``predictor=`` option), the bucket's representative length (:data:`BUCKET_TOKENS`)."""

    def __init__(self, bucket_predictor):
        self.bp = bucket_predictor

    def __call__(self, ctx, r: int) -> float:
        return BUCKET_TOKENS[self.bp.bucket(ctx, r)]

    def __repr__(self) -> str:
        return f"BucketTokens({self.bp!r})"


class BinnedPredictor:
    """A trainable bucket classifier from (class label, prompt length): majority vote per cell.

    Cells are (class, floor(log2(prompt))) pairs; a cell seen fewer than ``min_count`` times defers
    to its class's majority, then to the global majority. ``fit(prompt, output, cls=None)`` takes
    arrays of tokens (and class indices when the trace has labels).
    """

    def __init__(self, *, min_count: int = 5):
        self.min_count = int(min_count)
        self.table: dict[tuple[int, int], int] = {}
        self.by_class: dict[int, int] = {}
        self.default = 0

    @staticmethod
    def _bin(p: np.ndarray) -> np.ndarray:
        return np.floor(np.log2(np.maximum(np.asarray(p, dtype=float), 1.0))).astype(np.int64)

    def fit(self, prompt, output, cls=None) -> BinnedPredictor:
        p = np.asarray(prompt)
        y = np.array([bucket_of(o) for o in np.asarray(output)], dtype=np.int64)
        c = np.zeros_like(p, dtype=np.int64) if cls is None else np.asarray(cls, dtype=np.int64)
        if not (p.shape == y.shape == c.shape) or p.size == 0:
            raise ScenarioError("BinnedPredictor.fit: expected non-empty arrays of equal length")
        b = self._bin(p)
        self.default = int(np.bincount(y, minlength=N_BUCKETS).argmax())
        self.by_class, self.table = {}, {}
        for ci in np.unique(c):
            m = c == ci
            self.by_class[int(ci)] = int(np.bincount(y[m], minlength=N_BUCKETS).argmax())
            for bi in np.unique(b[m]):
                mm = m & (b == bi)
                if mm.sum() >= self.min_count:
                    self.table[(int(ci), int(bi))] = int(np.bincount(y[mm], minlength=N_BUCKETS).argmax())
        return self

    def predict_many(self, prompt, cls=None) -> np.ndarray:
        p = np.asarray(prompt)
        c = np.zeros_like(p, dtype=np.int64) if cls is None else np.asarray(cls, dtype=np.int64)
        b = self._bin(p)
        return np.array([self._one(int(ci), int(bi)) for ci, bi in zip(c, b)], dtype=np.int64)

    def _one(self, c: int, b: int) -> int:
        v = self.table.get((c, b))
        if v is not None:
            return v
        return self.by_class.get(c, self.default)

    def bucket(self, ctx, r: int) -> int:
        p = ctx.req_prompt(r)
        return self._one(ctx.req_class(r), int(math.floor(math.log2(max(p, 1)))))


def confusion_matrix(true_buckets, predicted) -> np.ndarray:
    """Counts: rows the true bucket, columns the predicted one (N_BUCKETS x N_BUCKETS)."""
    t = np.asarray(true_buckets, dtype=np.int64)
    p = np.asarray(predicted, dtype=np.int64)
    m = np.zeros((N_BUCKETS, N_BUCKETS), dtype=np.int64)
    np.add.at(m, (t, p), 1)
    return m


TABLE1_ACCURACY = {"translation": 0.931, "eli5": 0.704, "imdb": 0.799, "squad": 0.653, "wnut": 0.951}
"""Per-task decode-bucket accuracies of the RL router paper's Table 1 (Jain et al.), by task name, in
the order the paper lists its tasks (translation, ELI5, IMDb, SQuAD, WNUT)."""
TABLE1_SCENARIOS = ("rl-router-paper-regime", "rl-router-paper-regime-fig4b")
"""Scenarios whose default predictor accuracies are :data:`TABLE1_ACCURACY` (by class name)."""


def scenario_accuracy(scenario, default: float = 0.79):
    """The noisy oracle's default accuracy for ``scenario``: per class from :data:`TABLE1_ACCURACY`
    for the scenarios of :data:`TABLE1_SCENARIOS`, else ``default`` (the paper's overall 79%)."""
    if scenario.name in TABLE1_SCENARIOS and all(n in TABLE1_ACCURACY for n in scenario.class_names):
        return tuple(TABLE1_ACCURACY[n] for n in scenario.class_names)
    return default
