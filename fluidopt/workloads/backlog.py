"""Batch backlogs on top of ongoing arrivals: :class:`Backlog`, :class:`BacklogWorkload`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from fluidopt.core.errors import ScenarioError
from fluidopt.workloads.base import ArrivalBatch, _check_horizon, _check_size, _children, _num
from fluidopt.workloads.synthetic import LengthDistribution

__all__ = ["Backlog", "BacklogWorkload"]

# --------------------------------------------------------------------------------------------
# Batch backlogs on top of ongoing arrivals
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Backlog:
    """``n`` requests of class ``cls`` (a name) all arriving at time ``at`` (seconds): a batch job's
    queue dumped at once, with prompt and output lengths drawn from the given laws."""

    cls: str
    n: int
    at: float
    prompt: LengthDistribution
    output: LengthDistribution

    def __post_init__(self) -> None:
        w = f"Backlog({self.cls!r})"
        if isinstance(self.n, bool) or not isinstance(self.n, (int, np.integer)) or self.n < 0:
            raise ScenarioError(f"{w}.n: expected an integer >= 0 (requests), got {self.n!r}")
        _num(f"{w}.at", self.at, minimum=0.0, strict=False)
        for f in ("prompt", "output"):
            if not isinstance(getattr(self, f), LengthDistribution):
                raise ScenarioError(f"{w}.{f}: expected a LengthDistribution (Exponential, ...), got {getattr(self, f)!r}")


class BacklogWorkload:
    """A base workload plus batch backlogs (:class:`Backlog`) injected at given times.

    ``class_names``: the full class list (default: the base's); the base's classes and every
    backlog's class must be in it. At equal times base arrivals come before backlog requests, and
    backlogs in the order given. The backlog's lengths come from their own child streams of ``rng``,
    so adding a backlog leaves the base's arrivals unchanged for a given seed.
    """

    def __init__(self, base, backlogs: Sequence[Backlog], class_names: Sequence[str] | None = None):
        names = tuple(base.class_names if class_names is None else class_names)
        for nm in base.class_names:
            if nm not in names:
                raise ScenarioError(f"BacklogWorkload: base class {nm!r} is not among class_names {list(names)}")
        for b in backlogs:
            if not isinstance(b, Backlog):
                raise ScenarioError(f"BacklogWorkload.backlogs: expected Backlog items, got {b!r}")
            if b.cls not in names:
                raise ScenarioError(f"BacklogWorkload: backlog class {b.cls!r} is not among class_names {list(names)}")
        self.base = base
        self.backlogs = tuple(backlogs)
        self.class_names = names
        self._map = np.array([names.index(nm) for nm in base.class_names], dtype=np.int64)

    def __repr__(self) -> str:
        return f"BacklogWorkload({self.base!r}, {list(self.backlogs)!r})"

    def batches(self, rng: np.random.Generator, horizon: float, size: int = 65536) -> Iterator[ArrivalBatch]:
        horizon = _check_horizon(horizon)
        size = _check_size(size)
        base_rng, *gens = _children(rng, 1 + 2 * len(self.backlogs))
        bt, bc, bp, bo = [], [], [], []
        for j, b in enumerate(self.backlogs):
            if b.n and b.at < horizon:
                bt.append(np.full(b.n, float(b.at)))
                bc.append(np.full(b.n, self.class_names.index(b.cls), dtype=np.int64))
                bp.append(b.prompt.sample(gens[2 * j], b.n))
                bo.append(b.output.sample(gens[2 * j + 1], b.n))
        if bt:
            t = np.concatenate(bt)
            order = np.argsort(t, kind="stable")
            q = [t[order], np.concatenate(bc)[order], np.concatenate(bp)[order], np.concatenate(bo)[order]]
        else:
            q = [np.empty(0), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)]
        pos = 0
        for batch in self.base.batches(base_rng, horizon, size):
            if len(batch) == 0:
                continue
            k = int(np.searchsorted(q[0], batch.time[-1], side="left"))  # backlog strictly before the batch end
            if k > pos:
                src = np.concatenate([np.zeros(len(batch), dtype=np.int64), np.ones(k - pos, dtype=np.int64)])
                tt = np.concatenate([batch.time, q[0][pos:k]])
                order = np.lexsort((src, tt))
                parts = [tt[order], np.concatenate([self._map[batch.cls], q[1][pos:k]])[order],
                         np.concatenate([batch.prompt, q[2][pos:k]])[order],
                         np.concatenate([batch.output, q[3][pos:k]])[order]]
                pos = k
            else:
                parts = [batch.time, self._map[batch.cls], batch.prompt, batch.output]
            for s in range(0, parts[0].size, size):
                yield ArrivalBatch(*(p[s:s + size] for p in parts))
        for s in range(pos, q[0].size, size):
            yield ArrivalBatch(*(p[s:s + size] for p in q))
