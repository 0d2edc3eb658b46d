"""The Q-network's inference in numpy, and the shipped weight files (no torch needed).

A weight file is a numpy ``.npz`` with arrays ``W0, b0, W1, b1, W2, b2`` (float32; ``W`` is
in x out, the transpose of torch's ``Linear.weight``) and metadata arrays: ``layout`` (the state
layout's name, :data:`~fluidopt.rl.core.STATE_LAYOUT`), ``n_instances``, ``variant``, ``command``
(the command that trains it) and ``config`` (the training configuration as JSON). The network is
``obs -> ReLU(W0) -> ReLU(W1) -> W2 -> Q-values`` (m instances + wait).
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from fluidopt.errors import ScenarioError
from fluidopt.rl.core import STATE_LAYOUT, obs_dim

__all__ = ["QNetwork", "load_weights", "save_weights", "shipped_weights_path"]

WEIGHTS_DIR = Path(__file__).parent / "weights"


def shipped_weights_path(variant: str, m: int) -> Path:
    """Path of the shipped weights for a variant (``baseline``, ``wa``, ``wg``) and m instances."""
    return WEIGHTS_DIR / f"{variant}-rl-{m}.npz"


def train_command(variant: str, m: int) -> str:
    scen = {4: "examples/scenarios/rl-router-v100.toml", 8: "examples/scenarios/rl-router-v100-8.toml"}.get(m, "SCENARIO")
    return f"fluidopt rl train {scen} --variant {variant} --out fluidopt/rl/weights/{variant}-rl-{m}.npz"


@dataclass(frozen=True)
class QNetwork:
    """A ReLU MLP's weights; ``q(obs)`` gives the Q-values, ``act(obs)`` the greedy action."""

    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    n_instances: int
    variant: str = ""
    config: str = "{}"

    def q(self, obs: np.ndarray) -> np.ndarray:
        """Q-values (float64) of one observation, the same bit for bit on every machine.

        A BLAS matrix-vector product (``x @ W``) sums in an order that depends on the CPU's kernel,
        and an argmax between near-equal Q-values then differs between machines. Here each product
        of two float32 numbers is exact in float64 and the sums run in index order (numpy reduces
        the rows of a C-ordered array one after another), so routing decisions reproduce anywhere.
        """
        x = np.asarray(obs, dtype=np.float32).astype(np.float64)
        for i, (W, b) in enumerate(self._layers64):
            x = (x[:, None] * W).sum(axis=0) + b
            if i < len(self._layers64) - 1:
                np.maximum(x, 0.0, out=x)
        return x

    @cached_property
    def _layers64(self) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """The layers in float64, converted once (the frozen dataclass keeps its float32 fields)."""
        return tuple((np.ascontiguousarray(W, dtype=np.float64), np.asarray(b, dtype=np.float64))
                     for W, b in self.layers)

    def act(self, obs: np.ndarray) -> int:
        return int(np.argmax(self.q(obs)))


def save_weights(path: str | Path, net: QNetwork, *, command: str = "") -> Path:
    """Write ``net`` as a weight file (see the module doc)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for i, (W, b) in enumerate(net.layers):
        arrays[f"W{i}"] = np.asarray(W, dtype=np.float32)
        arrays[f"b{i}"] = np.asarray(b, dtype=np.float32)
    with open(path, "wb") as f:
        np.savez_compressed(f, layout=np.array(STATE_LAYOUT), n_instances=np.array(net.n_instances),
                            variant=np.array(net.variant), config=np.array(net.config),
                            command=np.array(command), **arrays)
    return path


def load_weights(path: str | Path, *, n_instances: int | None = None, hint: str = "") -> QNetwork:
    """Read a weight file; every problem is one :class:`ScenarioError` line naming the file.

    ``n_instances``: the fleet the weights must be for. ``hint``: the command that makes the file.
    """
    path = Path(path)
    again = f"; train them with: {hint}" if hint else ""
    if not path.is_file():
        raise ScenarioError(f"RL weights {path}: no such file{again}")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise ScenarioError(f"RL weights {path}: not a readable weight file ({type(e).__name__}: {e}){again}") from None
    layout = str(data.get("layout", ""))
    if layout != STATE_LAYOUT:
        raise ScenarioError(f"RL weights {path}: state layout {layout or 'missing'!r}, expected {STATE_LAYOUT!r}{again}")
    layers = []
    i = 0
    while f"W{i}" in data:
        if f"b{i}" not in data:
            raise ScenarioError(f"RL weights {path}: W{i} without b{i}{again}")
        W, b = data[f"W{i}"].astype(np.float32), data[f"b{i}"].astype(np.float32)
        if W.ndim != 2 or b.shape != (W.shape[1],) or (layers and layers[-1][0].shape[1] != W.shape[0]):
            raise ScenarioError(f"RL weights {path}: layer {i} has shapes {W.shape} and {b.shape}, which do not chain{again}")
        if not (np.isfinite(W).all() and np.isfinite(b).all()):
            raise ScenarioError(f"RL weights {path}: layer {i} holds non-finite numbers{again}")
        layers.append((W, b))
        i += 1
    if not layers:
        raise ScenarioError(f"RL weights {path}: no layers (W0, b0, ...){again}")
    try:
        m = int(data["n_instances"])
    except (KeyError, ValueError, TypeError):
        raise ScenarioError(f"RL weights {path}: n_instances missing{again}") from None
    if layers[0][0].shape[0] != obs_dim(m) or layers[-1][0].shape[1] != m + 1:
        raise ScenarioError(f"RL weights {path}: the network maps {layers[0][0].shape[0]} -> {layers[-1][0].shape[1]}, "
                            f"expected {obs_dim(m)} -> {m + 1} for {m} instances{again}")
    if n_instances is not None and m != n_instances:
        raise ScenarioError(f"RL weights {path}: trained for {m} instances, the scenario has {n_instances}; "
                            f"train weights for it{again or ' with: fluidopt rl train SCENARIO --out FILE'}")
    cfg = str(data.get("config", "{}"))
    try:
        json.loads(cfg)
    except ValueError:
        cfg = "{}"
    return QNetwork(tuple(layers), m, str(data.get("variant", "")), cfg)
