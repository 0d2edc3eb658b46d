"""The Q-networks' inference in numpy, and the shipped weight files (no torch needed).

Two architectures (docs/rl.md section 4):

* ``mlp`` (:class:`QNetwork`, the paper's): ``obs -> ReLU(W0) -> ReLU(W1) -> W2 -> Q-values``
  (m instances + wait); its shapes fix the number of instances.
* ``shared`` (:class:`SharedQNetwork`): one small MLP scores every instance from its own 6 state
  entries, the mean and the max of the 6 entries over the fleet and the 3 global entries
  (``Q(s, send to g) = f(x_g, mean_x, max_x, global)``, 21 inputs), a second MLP gives the wait
  action's advantage over the mean instance score from the pooled and global entries (15 inputs):
  ``Q(s, wait) = mean_g f(x_g, ...) + w(mean_x, max_x, global)``, so the large value common to
  every action is learnt by the scorer from every transition. The same weights serve any number of
  instances, and the Q-values are permutation-equivariant (no instance is favoured by its index).

A weight file is a numpy ``.npz`` with arrays ``W0, b0, W1, b1, W2, b2`` (float32; ``W`` is
in x out, the transpose of torch's ``Linear.weight``; for ``shared``: the scorer, and ``U0, c0,
...`` the wait head) and metadata arrays: ``layout`` (the state layout's name,
:data:`~fluidopt.rl.core.STATE_LAYOUT` or the log-count layout
:data:`~fluidopt.rl.core.STATE_LAYOUT_LOG`; the router fills the state the file names, any other name is refused), ``n_instances`` (the fleet it was trained on), ``variant``,
``arch`` (``mlp`` when missing), ``dispatch`` (``single``: one decision per epoch, the paper's MDP;
``multi``: decisions for the head until "wait" or an empty queue; ``single`` when missing),
``wait_mask`` (``fits``: "wait" is valid only when the head fits on no instance, in training and
at inference; ``none``, the paper's MDP, when missing),
``command`` (the command that trains it) and ``config`` (the training configuration as JSON).
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from fluidopt.core.errors import ScenarioError
from fluidopt.rl.core import STATE_LAYOUT, STATE_LAYOUTS, WAIT_MASKS, obs_dim

__all__ = ["QNetwork", "SharedQNetwork", "load_weights", "save_weights", "shipped_weights_path", "trained_on"]

INST_FEATURES = 6  # state entries per instance (fluidopt-rl-state-v1)
GLOBAL_FEATURES = 3
SCORER_IN = 3 * INST_FEATURES + GLOBAL_FEATURES  # own + mean + max + global
WAIT_IN = 2 * INST_FEATURES + GLOBAL_FEATURES  # mean + max + global
ARCHS = ("mlp", "shared")
DISPATCH = ("single", "multi")

WEIGHTS_DIR = Path(__file__).parent / "weights"


SCENARIO_WEIGHTS = {
    ("wg", "rl-router-paper-regime"): ("wg-rl-regime.npz", "fluidopt rl imitate examples/scenarios/rl-router-paper-regime.toml "
                                       "--expert small-large --state log --out fluidopt/rl/weights/wg-rl-regime.npz"),
    ("wg", "rl-router-paper-regime-fig4b"): ("wg-rl-regime-fig4b.npz", "fluidopt rl imitate "
                                             "examples/scenarios/rl-router-paper-regime-fig4b.toml --expert small-large "
                                             "--state log --out fluidopt/rl/weights/wg-rl-regime-fig4b.npz"),
    ("wg", "rl-router-v100"): ("wg-rl-tis.npz", "fluidopt rl train examples/scenarios/rl-router-v100.toml --variant wg "
                               "--episodes 30 --requests 2000 --seed 1 --eps-episodes 20 --train-every 4 --objective "
                               "time-in-system --arch shared --multi-dispatch --wait-mask fits --gamma 0.998 "
                               "--out fluidopt/rl/weights/wg-rl-tis.npz"),
}
SCENARIO_WEIGHTS[("wg", "rl-router-v100-8")] = SCENARIO_WEIGHTS[("wg", "rl-router-v100")]
for _algo, _steps in (("dqn", 40000), ("ppo", 40000)):
    SCENARIO_WEIGHTS[(f"sb3-{_algo}", "rl-router-paper-regime")] = (
        f"sb3-{_algo}-regime.npz", f"python examples/rl_sb3.py --algo {_algo} --timesteps {_steps} --requests 2000 "
        f"--seed 0 --out fluidopt/rl/weights/sb3-{_algo}-regime.npz")
    SCENARIO_WEIGHTS[(f"sb3-{_algo}", "rl-router-paper-regime-fig4b")] = SCENARIO_WEIGHTS[
        (f"sb3-{_algo}", "rl-router-paper-regime")]
del _algo, _steps
"""Per-scenario default weights, by (variant, scenario name): (file in ``weights/``, the command that
trains it). The default ``wg-rl`` of each shipped RL scenario is the best shipped router for it
(docs/rl.md section 6b): at the paper's operating point, the router fitted to Small-Large by
imitation on each regime scenario, the time-in-system agent (training seed 1; shared network, so it serves 4 and 8
instances) on the lightly loaded V100 settings. Other scenarios fall back to ``<variant>-rl-<m>.npz``."""


def shipped_weights_path(variant: str, m: int, scenario: str | None = None) -> Path:
    """Path of the shipped weights for a variant (``baseline``, ``wa``, ``wg``) and m instances; for a
    shipped scenario (by name) with weights of its own (:data:`SCENARIO_WEIGHTS`), those."""
    own = SCENARIO_WEIGHTS.get((variant, scenario))
    if own is not None:
        return WEIGHTS_DIR / own[0]
    return WEIGHTS_DIR / f"{variant}-rl-{m}.npz"


SHIPPED_8 = ("--episodes 30 --requests 2000 --seed 0 --eps-episodes 20 --train-every 4 --arch shared "
             "--multi-dispatch")
"""Training options of the shipped 8-instance weights (docs/rl.md section 5; examples/rl_train_all.sh)."""
SHIPPED_8_WAIT_MASK = {"baseline": "fits", "wa": "fits", "wg": "none"}
"""The wait mask of each shipped 8-instance file (WG-RL retrained with the mask was worse: docs/rl.md section 5)."""


def train_command(variant: str, m: int, scenario: str | None = None) -> str:
    own = SCENARIO_WEIGHTS.get((variant, scenario))
    if own is not None:
        return own[1]
    scen = {4: "examples/scenarios/rl-router-v100.toml", 8: "examples/scenarios/rl-router-v100-8.toml"}.get(m, "SCENARIO")
    extra = ""
    if m == 8:
        extra = f" {SHIPPED_8}" + (" --wait-mask fits" if SHIPPED_8_WAIT_MASK.get(variant) == "fits" else "")
    return f"fluidopt rl train {scen} --variant {variant}{extra} --out fluidopt/rl/weights/{variant}-rl-{m}.npz"


SB3_DEFAULT_SCENARIO = "rl-router-paper-regime"
"""The scenario ``examples/rl_sb3.py`` trains on when its command names none."""


def trained_on(path: str | Path) -> str | None:
    """The scenario a weight file was trained on: the file name, without ``.toml``, of the scenario its
    ``command`` names (``fluidopt rl train|imitate SCENARIO ...``; ``examples/rl_sb3.py [--scenario
    SCENARIO]``, whose default is :data:`SB3_DEFAULT_SCENARIO`). None when the file is unreadable or its
    command names no scenario. The shipped scenarios' files are named after their ``name``, so the result
    compares with :attr:`Scenario.name <fluidopt.core.model.Scenario.name>`."""
    import shlex

    try:
        with np.load(Path(path), allow_pickle=False) as z:
            command = str(z["command"]) if "command" in z.files else ""
        words = shlex.split(command)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError):
        return None
    for i, w in enumerate(words):
        if w == "rl" and i + 1 < len(words) and words[i + 1] in ("train", "imitate"):
            scen = next((x for x in words[i + 2:] if not x.startswith("-")), None)
            return Path(scen).stem if scen else None
        if w.endswith("rl_sb3.py"):
            rest = words[i + 1:]
            if "--scenario" in rest and rest.index("--scenario") + 1 < len(rest):
                return Path(rest[rest.index("--scenario") + 1]).stem
            return SB3_DEFAULT_SCENARIO
    return None


@dataclass(frozen=True)
class QNetwork:
    """A ReLU MLP's weights; ``q(obs)`` gives the Q-values, ``act(obs)`` the greedy action."""

    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    n_instances: int
    variant: str = ""
    config: str = "{}"
    dispatch: str = "single"
    wait_mask: str = "none"
    layout: str = STATE_LAYOUT
    arch = "mlp"

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
        return _float64_layers(self.layers)

    def act(self, obs: np.ndarray) -> int:
        return int(np.argmax(self.q(obs)))

    def fits(self, m: int) -> bool:
        """Whether the network serves a fleet of m instances (an MLP: only the one it was built for)."""
        return m == self.n_instances


def _float64_layers(layers) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    return tuple((np.ascontiguousarray(W, dtype=np.float64), np.asarray(b, dtype=np.float64)) for W, b in layers)


def _relu_mlp(X: np.ndarray, layers64) -> np.ndarray:
    """A batch X through float64 ReLU layers (no ReLU after the last), every sum in index order."""
    for i, (W, b) in enumerate(layers64):
        X = _in_order(X, W, b)
        if i < len(layers64) - 1:
            np.maximum(X, 0.0, out=X)
    return X


def _in_order(X: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """X @ W + b for a batch X (rows x in), each unit's products summed in index order (float64).

    The products form an in x rows x out array laid out in C order (forced: with the transposed X
    numpy would otherwise put the input axis innermost and sum it pairwise); numpy reduces its
    first axis slice after slice, so every sum runs in index order whatever the CPU (see
    ``QNetwork.q``)."""
    P = np.multiply(np.ascontiguousarray(X.T)[:, :, None], W[:, None, :], order="C")
    return P.sum(axis=0) + b


def pooled_inputs(obs: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(scorer inputs, m x 21; wait-head inputs, 15) of one state vector, in float64."""
    x = np.asarray(obs, dtype=np.float32).astype(np.float64)
    inst = x[: INST_FEATURES * m].reshape(m, INST_FEATURES)
    glob = x[INST_FEATURES * m:]
    mean = inst.sum(axis=0) / m  # rows added one after another (index order)
    mx = inst.max(axis=0)
    ctx = np.concatenate([mean, mx, glob])
    return np.concatenate([inst, np.broadcast_to(ctx, (m, ctx.size))], axis=1), ctx


@dataclass(frozen=True)
class SharedQNetwork:
    """Per-instance shared-weights scorer plus a wait head (module doc): any number of instances."""

    scorer: tuple[tuple[np.ndarray, np.ndarray], ...]
    wait: tuple[tuple[np.ndarray, np.ndarray], ...]
    n_instances: int
    variant: str = ""
    config: str = "{}"
    dispatch: str = "single"
    wait_mask: str = "none"
    layout: str = STATE_LAYOUT
    arch = "shared"

    @property
    def layers(self) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        return self.scorer + self.wait

    @cached_property
    def _layers64(self):
        return _float64_layers(self.scorer), _float64_layers(self.wait)

    def q(self, obs: np.ndarray) -> np.ndarray:
        """Q-values (float64, m + 1) of one observation of an m-instance fleet (m from its length),
        the same bit for bit on every machine (sums in index order, as ``QNetwork.q``)."""
        obs = np.asarray(obs)
        m = (obs.shape[-1] - GLOBAL_FEATURES) // INST_FEATURES
        X, ctx = pooled_inputs(obs, m)
        sc, wt = self._layers64
        out = np.empty(m + 1)
        X = _relu_mlp(X, sc)
        out[:m] = X[:, 0]
        mean_f = 0.0  # Q(wait) = mean instance score + the wait head; summed in index order
        for v in X[:, 0].tolist():
            mean_f += v
        mean_f /= m
        out[m] = mean_f + _relu_mlp(ctx[None, :], wt)[0, 0]
        return out

    def act(self, obs: np.ndarray) -> int:
        return int(np.argmax(self.q(obs)))

    def fits(self, m: int) -> bool:
        return m >= 1


def save_weights(path: str | Path, net: QNetwork, *, command: str = "") -> Path:
    """Write ``net`` as a weight file (see the module doc)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {}
    main = net.scorer if net.arch == "shared" else net.layers
    for i, (W, b) in enumerate(main):
        arrays[f"W{i}"] = np.asarray(W, dtype=np.float32)
        arrays[f"b{i}"] = np.asarray(b, dtype=np.float32)
    meta = {}
    if net.arch == "shared":
        for i, (W, b) in enumerate(net.wait):
            arrays[f"U{i}"] = np.asarray(W, dtype=np.float32)
            arrays[f"c{i}"] = np.asarray(b, dtype=np.float32)
        meta["arch"] = np.array("shared")
    if net.dispatch != "single":  # files of the paper's MDP stay as they were
        meta["dispatch"] = np.array(net.dispatch)
    if net.wait_mask != "none":
        meta["wait_mask"] = np.array(net.wait_mask)
    from fluidopt.core.files import atomic_path

    with atomic_path(path) as tmp, open(tmp, "wb") as f:  # never a half-written weight file
        np.savez_compressed(f, layout=np.array(net.layout), n_instances=np.array(net.n_instances),
                            variant=np.array(net.variant), config=np.array(net.config),
                            command=np.array(command), **meta, **arrays)
    return path


def load_weights(path: str | Path, *, n_instances: int | None = None, hint: str = "") -> QNetwork | SharedQNetwork:
    """Read a weight file; every problem is one :class:`ScenarioError` line naming the file.

    ``n_instances``: the fleet the weights must be for (an ``mlp`` network serves only the fleet
    it was built for; a ``shared`` one serves any). ``hint``: the command that makes the file.
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
    if layout not in STATE_LAYOUTS:
        raise ScenarioError(f"RL weights {path}: state layout {layout or 'missing'!r}, expected one of "
                            f"{', '.join(map(repr, STATE_LAYOUTS))}{again}")
    arch = str(data.get("arch", "mlp"))
    if arch not in ARCHS:
        raise ScenarioError(f"RL weights {path}: architecture {arch!r}, expected one of {', '.join(ARCHS)}{again}")
    dispatch = str(data.get("dispatch", "single"))
    if dispatch not in DISPATCH:
        raise ScenarioError(f"RL weights {path}: dispatch {dispatch!r}, expected one of {', '.join(DISPATCH)}{again}")
    wait_mask = str(data.get("wait_mask", "none"))
    if wait_mask not in WAIT_MASKS:
        raise ScenarioError(f"RL weights {path}: wait mask {wait_mask!r}, expected one of {', '.join(WAIT_MASKS)}{again}")
    layers = _read_layers(data, "W", "b", path, again)
    try:
        m = int(data["n_instances"])
    except (KeyError, ValueError, TypeError):
        raise ScenarioError(f"RL weights {path}: n_instances missing{again}") from None
    cfg = str(data.get("config", "{}"))
    try:
        json.loads(cfg)
    except ValueError:
        cfg = "{}"
    variant = str(data.get("variant", ""))
    if arch == "shared":
        wait = _read_layers(data, "U", "c", path, again)
        for name, ls, n_in in (("scorer", layers, SCORER_IN), ("wait head", wait, WAIT_IN)):
            if ls[0][0].shape[0] != n_in or ls[-1][0].shape[1] != 1:
                raise ScenarioError(f"RL weights {path}: the {name} maps {ls[0][0].shape[0]} -> {ls[-1][0].shape[1]}, "
                                    f"expected {n_in} -> 1{again}")
        # instance-count independent: n_instances only records the fleet it was trained on
        return SharedQNetwork(tuple(layers), tuple(wait), m, variant, cfg, dispatch, wait_mask, layout)
    if layers[0][0].shape[0] != obs_dim(m) or layers[-1][0].shape[1] != m + 1:
        raise ScenarioError(f"RL weights {path}: the network maps {layers[0][0].shape[0]} -> {layers[-1][0].shape[1]}, "
                            f"expected {obs_dim(m)} -> {m + 1} for {m} instances{again}")
    if n_instances is not None and m != n_instances:
        raise ScenarioError(f"RL weights {path}: trained for {m} instances, the scenario has {n_instances}; "
                            f"train weights for it{again or ' with: fluidopt rl train SCENARIO --out FILE'}")
    return QNetwork(tuple(layers), m, variant, cfg, dispatch, wait_mask, layout)


def _read_layers(data: dict, wk: str, bk: str, path: Path, again: str) -> list:
    layers = []
    i = 0
    while f"{wk}{i}" in data:
        if f"{bk}{i}" not in data:
            raise ScenarioError(f"RL weights {path}: {wk}{i} without {bk}{i}{again}")
        W, b = data[f"{wk}{i}"].astype(np.float32), data[f"{bk}{i}"].astype(np.float32)
        if W.ndim != 2 or b.shape != (W.shape[1],) or (layers and layers[-1][0].shape[1] != W.shape[0]):
            raise ScenarioError(f"RL weights {path}: layer {i} has shapes {W.shape} and {b.shape}, which do not chain{again}")
        if not (np.isfinite(W).all() and np.isfinite(b).all()):
            raise ScenarioError(f"RL weights {path}: layer {i} holds non-finite numbers{again}")
        layers.append((W, b))
        i += 1
    if not layers:
        raise ScenarioError(f"RL weights {path}: no layers ({wk}0, {bk}0, ...){again}")
    return layers
