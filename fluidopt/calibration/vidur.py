"""Iteration-time laws from Vidur's published operator profiles (A100, A40, H100; eight models).

Vidur (Agrawal et al., MLSys 2024; github.com/microsoft/vidur, MIT licence) measured the GPU time of
every token-parallel operator of one transformer layer at many token counts and tensor-parallel
degrees (``compute/GPU/ORG/MODEL/mlp.csv``, milliseconds). This module composes from them the time
of one engine iteration that runs a prefill chunk of ``C`` tokens next to ``D`` decodes, and fits
the iteration law ``tau = alpha + beta * C`` (plus ``kv_time_per_token`` per resident KV token) with
:func:`fluidopt.calibration.fit_iteration_time`. Sections of docs/calibration.md ("Published operator
profiles (Vidur)") give the derivation; in short, one iteration on a replica of ``tp`` GPUs takes

    tau = L * (ops(T) + attn_prefill + attn_decode + 2 * allreduce(T)) + emb(T) + lm_head(D + 1)

seconds, ``T = C + D`` tokens, ``L`` layers:

* ``ops(T)``: the measured median per-layer operators (two norms, QKV projection, rotary, output
  projection, MLP up / activation / down, two residual adds), linearly interpolated in ``T``;
* ``emb(T)``: the measured embedding lookup, once per iteration;
* ``lm_head(n)``: the vocabulary projection of the ``n`` sampled rows, scaled from the measured MLP
  up-projection (the same GEMM shape with ``vocab`` instead of the MLP width);
* attention, which the tables lack: the roofline of :class:`AttentionModel`, validated against the
  older A100 attention profile (:func:`validate_attention`);
* ``allreduce``: a ring all-reduce of the layer's activations over NVLink/PCIe (tp > 1 only; a
  documented model, no collective profile is in the data).

Times are GPU kernel time only (no CPU scheduling overhead): real engines add a few milliseconds to
alpha. A profile is for one *replica* of ``tp`` GPUs: fleets planned with it count replicas.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fluidopt.calibration.fit import CalibrationFit, fit_iteration_time
from fluidopt.core.errors import CalibrationError

VIDUR_COMMIT = "7d47513"  # microsoft/vidur commit of compute/ (data README)
LEGACY_COMMIT = "e2d00e9"  # commit of legacy/a100/attention.csv
BYTES_PER_VALUE = 2  # fp16 / bf16 weights and KV cache
MEMORY_UTILISATION = 0.9  # fraction of GPU memory an engine takes (vLLM's default gpu_memory_utilization)
ALLREDUCE_LATENCY = 8e-6  # s per all-reduce call (assumed NCCL small-message latency inside a node)
REFERENCE_CONTEXT = 2048  # tokens of KV per request used to size the batch from the KV capacity
MAX_BATCH = 128  # cap on the batch size B of a generated profile
CHUNK = 1024  # serving setting C of a generated profile (tokens): the middle of FIT_CHUNKS
FIT_CHUNKS = tuple(range(512, 2049, 32))  # chunk sizes composed; even positions fitted, odd held out
KV_CONTEXTS = tuple(range(0, 4097, 256))  # KV tokens per decode for the kv_time_per_token fit

# the per-layer operators of mlp.csv summed for one layer (``add`` runs twice: two residual adds)
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add", "add")
REQUIRED_OPS = ("emb", "attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


# ------------------------------------------------------------------------------------------------
# Published hardware numbers and model geometry the CSVs do not carry
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPUSpec:
    """Published peak numbers of one GPU (dense fp16/bf16 tensor throughput, HBM bandwidth)."""

    key: str
    name: str
    memory: float  # bytes of GPU memory
    peak_flops: float  # FLOP/s, dense fp16 tensor cores
    bandwidth: float  # bytes/s, HBM
    link_bandwidth: float  # bytes/s per direction between GPUs of a replica (all-reduce)
    source: str


GPUS: dict[str, GPUSpec] = {
    "a100": GPUSpec("a100", "NVIDIA A100-SXM4-80GB", 80e9, 312e12, 2.039e12, 300e9,
                    "NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOPS fp16 dense, 2,039 GB/s, NVLink 600 GB/s"),
    "h100": GPUSpec("h100", "NVIDIA H100-SXM5-80GB", 80e9, 989.4e12, 3.35e12, 450e9,
                    "NVIDIA H100 datasheet (SXM5): 989 TFLOPS fp16 dense, 3.35 TB/s, NVLink 900 GB/s"),
    "a40": GPUSpec("a40", "NVIDIA A40-48GB", 48e9, 149.7e12, 696e9, 32e9,
                   "NVIDIA A40 datasheet: 149.7 TFLOPS fp16 dense, 696 GB/s; PCIe 4.0 x16 (~32 GB/s) between GPUs"),
}


@dataclass(frozen=True)
class ModelGeometry:
    """What the operator tables do not say about a model: layers, parameter count, profile slug."""

    name: str  # ORG/MODEL as in the data folder
    slug: str  # short name used in profile names
    layers: int
    params: float  # published parameter count
    n_head: int = 0
    n_kv_head: int = 0
    n_embd: int = 0
    n_expanded_embd: int = 0
    vocab_size: int = 0
    gated: bool = True

    @property
    def head_dim(self) -> int:
        """Channels per attention head."""
        return self.n_embd // self.n_head

    def params_from_geometry(self) -> float:
        """Parameter count implied by the geometry (attention, MLP, untied embedding and LM head)."""
        attn = self.n_embd * (self.n_head + 2 * self.n_kv_head) * self.head_dim + self.n_embd * self.n_embd
        mlp = (3 if self.gated else 2) * self.n_embd * self.n_expanded_embd
        return self.layers * (attn + mlp) + 2 * self.vocab_size * self.n_embd

    def kv_bytes_per_token(self, tp: int) -> float:
        """Bytes of KV cache one token takes on each GPU of a ``tp`` replica (K and V, every layer)."""
        return 2.0 * self.layers * max(1.0, self.n_kv_head / tp) * self.head_dim * BYTES_PER_VALUE


# layers and published parameter counts (model cards / config.json num_hidden_layers)
MODELS: dict[str, ModelGeometry] = {m.name: m for m in (
    ModelGeometry("meta-llama/Llama-2-7b-hf", "llama-2-7b", 32, 6.74e9),
    ModelGeometry("meta-llama/Llama-2-70b-hf", "llama-2-70b", 80, 68.98e9),
    ModelGeometry("meta-llama/Meta-Llama-3-8B", "llama-3-8b", 32, 8.03e9),
    ModelGeometry("meta-llama/Meta-Llama-3-70B", "llama-3-70b", 80, 70.55e9),
    ModelGeometry("codellama/CodeLlama-34b-Instruct-hf", "codellama-34b", 48, 33.74e9),
    ModelGeometry("internlm/internlm-20b", "internlm-20b", 60, 20.0e9),
    ModelGeometry("Qwen/Qwen-72B", "qwen-72b", 80, 72.29e9),
    ModelGeometry("microsoft/phi-2", "phi-2", 32, 2.78e9),
)}


# ------------------------------------------------------------------------------------------------
# Attention roofline
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionModel:
    """Roofline time of one layer's attention kernel on one GPU (seconds).

    Prefill of a chunk of ``C`` tokens over ``K`` cached tokens is compute-bound: its causal part
    (the chunk against itself, ``2 C^2 d h`` FLOPs) and its prefix part (the chunk against the cache,
    ``4 C K d h`` FLOPs; ``d`` head dim, ``h`` query heads on the GPU) run at fractions
    ``causal_efficiency`` and ``prefix_efficiency`` of the GPU's peak. Decode of ``D`` streams over
    ``K`` cached tokens each is bandwidth-bound: it reads ``2 D K d h_kv`` values (K and V) at
    ``decode_efficiency`` of the peak bandwidth. Each phase adds a launch time. The efficiencies
    are fitted on half the rows of the A100 profile and are carried to other GPUs as fractions of
    their own peaks (:func:`validate_attention` reports the held-out error).
    """

    prefill_launch: float = 2.274e-5  # s
    causal_efficiency: float = 0.1738  # fraction of peak FLOP/s
    prefix_efficiency: float = 0.4157  # fraction of peak FLOP/s
    decode_launch: float = 1.348e-5  # s
    decode_efficiency: float = 0.7644  # fraction of peak bandwidth

    def prefill(self, spec: GPUSpec, chunk: np.ndarray | float, context: np.ndarray | float, q_heads: float,
                head_dim: int) -> np.ndarray:
        """Seconds of one layer's prefill attention: ``chunk`` new tokens over ``context`` cached."""
        c = np.asarray(chunk, dtype=float)
        k = np.asarray(context, dtype=float)
        causal = 2.0 * c * c * head_dim * q_heads / (self.causal_efficiency * spec.peak_flops)
        prefix = 4.0 * c * k * head_dim * q_heads / (self.prefix_efficiency * spec.peak_flops)
        return np.where(c > 0, self.prefill_launch + causal + prefix, 0.0)

    def decode(self, spec: GPUSpec, decodes: np.ndarray | float, context: np.ndarray | float, kv_heads: float,
               head_dim: int) -> np.ndarray:
        """Seconds of one layer's decode attention: ``decodes`` streams over ``context`` cached tokens each."""
        d = np.asarray(decodes, dtype=float)
        k = np.asarray(context, dtype=float)
        read = 2.0 * d * k * head_dim * kv_heads * BYTES_PER_VALUE
        return np.where(d > 0, self.decode_launch + read / (self.decode_efficiency * spec.bandwidth), 0.0)


ATTENTION = AttentionModel()
PEAK_ROOFLINE = AttentionModel(0.0, 1.0, 1.0, 0.0, 1.0)  # the bare roofline at the published peaks


def _legacy_frame(data_dir: str | Path) -> tuple[pd.DataFrame, Path]:
    path = Path(data_dir) / "legacy" / "a100" / "attention.csv"
    if not path.is_file():
        raise CalibrationError(f"{path}: the A100 attention profile is missing; expected legacy/a100/attention.csv "
                               "under the Vidur profiling folder")
    d = _read_csv(path, [])
    need = {"is_prefill", "prefill_chunk_size", "kv_cache_size", "batch_size", "n_q_head", "n_kv_head", "n_embd",
            "num_tensor_parallel_workers", "time_stats.attn_prefill.median", "time_stats.attn_decode.median"}
    missing = sorted(need - set(d.columns))
    if missing:
        raise CalibrationError(f"{path}: missing column {missing[0]!r}; expected Vidur's attention profile columns")
    return d, path


def _legacy_design(d: pd.DataFrame) -> dict[str, Any]:
    """Heads per GPU, head dim and the two phases (prefill and decode rows) of the attention profile."""
    tp = int(d["num_tensor_parallel_workers"].iloc[0])
    hq = int(d["n_q_head"].iloc[0]) / tp
    hkv = max(1.0, int(d["n_kv_head"].iloc[0]) / tp)
    hd = int(d["n_embd"].iloc[0]) // int(d["n_q_head"].iloc[0])
    pre = d[d["is_prefill"].astype(str).str.lower() == "true"]
    dec = d[d["is_prefill"].astype(str).str.lower() != "true"]
    return {"hq": hq, "hkv": hkv, "hd": hd, "pre": pre, "dec": dec}


def fit_attention(data_dir: str | Path) -> AttentionModel:
    """Fit the :class:`AttentionModel` constants on the even-position rows of each phase of the A100
    profile (weighted least squares on relative error). The shipped :data:`ATTENTION` holds these
    values rounded to four digits; a test checks them against this refit."""
    d, _ = _legacy_frame(data_dir)
    g = _legacy_design(d)
    spec = GPUS["a100"]
    pre, dec = g["pre"], g["dec"]
    c = pre["prefill_chunk_size"].to_numpy(float)
    k = pre["kv_cache_size"].to_numpy(float)
    y = pre["time_stats.attn_prefill.median"].to_numpy(float) * 1e-3
    tr = np.arange(len(y)) % 2 == 0
    X = np.column_stack([np.ones_like(c), 2 * c * c * g["hd"] * g["hq"] / spec.peak_flops,
                         4 * c * k * g["hd"] * g["hq"] / spec.peak_flops])
    w = 1.0 / y[tr]
    p = np.linalg.lstsq(X[tr] * w[:, None], y[tr] * w, rcond=None)[0]
    dd = dec["batch_size"].to_numpy(float)
    kk = dec["kv_cache_size"].to_numpy(float)
    yd = dec["time_stats.attn_decode.median"].to_numpy(float) * 1e-3
    trd = np.arange(len(yd)) % 2 == 0
    Xd = np.column_stack([np.ones_like(dd), 2 * dd * kk * g["hd"] * g["hkv"] * BYTES_PER_VALUE / spec.bandwidth])
    wd = 1.0 / yd[trd]
    q = np.linalg.lstsq(Xd[trd] * wd[:, None], yd[trd] * wd, rcond=None)[0]
    return AttentionModel(float(p[0]), float(1 / p[1]), float(1 / p[2]), float(q[0]), float(1 / q[1]))


@dataclass(frozen=True)
class AttentionValidation:
    """Relative error (predicted / measured - 1) of an attention model on the A100 profile's held-out rows."""

    prefill_median_abs: float
    prefill_p90_abs: float
    prefill_median: float  # signed
    decode_median_abs: float
    decode_p90_abs: float
    decode_median: float  # signed
    n_prefill: int
    n_decode: int


def validate_attention(data_dir: str | Path, model: AttentionModel = ATTENTION) -> AttentionValidation:
    """Errors of ``model`` on the odd-position (held-out) rows of each phase of the A100 profile."""
    d, _ = _legacy_frame(data_dir)
    g = _legacy_design(d)
    spec = GPUS["a100"]
    pre, dec = g["pre"].iloc[1::2], g["dec"].iloc[1::2]
    yp = pre["time_stats.attn_prefill.median"].to_numpy(float) * 1e-3
    ep = model.prefill(spec, pre["prefill_chunk_size"].to_numpy(float), pre["kv_cache_size"].to_numpy(float),
                       g["hq"], g["hd"]) / yp - 1
    yd = dec["time_stats.attn_decode.median"].to_numpy(float) * 1e-3
    ed = model.decode(spec, dec["batch_size"].to_numpy(float), dec["kv_cache_size"].to_numpy(float),
                      g["hkv"], g["hd"]) / yd - 1
    return AttentionValidation(float(np.median(np.abs(ep))), float(np.quantile(np.abs(ep), 0.9)), float(np.median(ep)),
                               float(np.median(np.abs(ed))), float(np.quantile(np.abs(ed), 0.9)), float(np.median(ed)),
                               len(yp), len(yd))


# ------------------------------------------------------------------------------------------------
# Operator tables
# ------------------------------------------------------------------------------------------------
def available(data_dir: str | Path) -> dict[str, dict[str, tuple[int, ...]]]:
    """``{gpu: {model: (tp degrees)}}`` of the operator tables under ``data_dir`` (sorted)."""
    root = Path(data_dir)
    comp = root / "compute"
    if not root.is_dir():
        raise CalibrationError(f"--vidur {data_dir}: not a folder; expected Vidur's profiling folder (compute/GPU/ORG/MODEL/mlp.csv)")
    if not comp.is_dir() or not any(comp.glob("*/*/*/mlp.csv")):
        raise CalibrationError(
            f"--vidur {data_dir}: not a Vidur profiling folder; expected compute/GPU/ORG/MODEL/mlp.csv under it, "
            f"found {_some(sorted(p.name for p in root.iterdir()))}"
        )
    out: dict[str, dict[str, tuple[int, ...]]] = {}
    for f in sorted(comp.glob("*/*/*/mlp.csv")):
        gpu, org, model = f.parts[-4], f.parts[-3], f.parts[-2]
        out.setdefault(gpu, {})[f"{org}/{model}"] = _tp_degrees(f)
    return out


def _some(names: list[str], k: int = 8) -> str:
    """The first ``k`` names, and how many more."""
    if not names:
        return "nothing"
    more = f" and {len(names) - k} more" if len(names) > k else ""
    return ", ".join(names[:k]) + more


GEOMETRY_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size")


def _read_csv(path: Path, columns: Sequence[str]) -> pd.DataFrame:
    """``path`` as a DataFrame whose ``columns`` are present and numeric; CalibrationError otherwise."""
    try:
        d = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError) as e:
        raise CalibrationError(f"{path}: not a readable Vidur profile table: {type(e).__name__}: {e}") from None
    missing = [c for c in columns if c not in d.columns]
    if missing:
        raise CalibrationError(f"{path}: missing column {missing[0]!r}; expected Vidur's profile columns")
    for c in columns:
        v = pd.to_numeric(d[c], errors="coerce")
        if v.isna().any() or not np.all(np.isfinite(v.to_numpy(float))):
            r = int(np.flatnonzero(v.isna().to_numpy() | ~np.isfinite(v.to_numpy(float)))[0])
            raise CalibrationError(f"{path}: row {r + 2}: {c} = {d[c].iloc[r]!r}: expected a finite number")
        d[c] = v
    return d


def _tp_degrees(path: Path) -> tuple[int, ...]:
    st = path.stat()
    return _tp_degrees_cached(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _tp_degrees_cached(path: Path, mtime_ns: int, size: int) -> tuple[int, ...]:
    d = _read_csv(path, ["num_tensor_parallel_workers"])
    return tuple(sorted(int(v) for v in d["num_tensor_parallel_workers"].unique()))


@dataclass(frozen=True)
class OperatorTable:
    """One (GPU, model, TP) slice of an operator table: per-layer and embedding time against tokens."""

    gpu: GPUSpec
    model: ModelGeometry  # with the geometry read from the CSV
    tp: int
    tokens: np.ndarray = field(repr=False)  # profiled token counts, ascending
    layer_ops: np.ndarray = field(repr=False)  # s, per-layer operators (LAYER_OPS) at each token count
    emb: np.ndarray = field(repr=False)  # s, embedding at each token count
    up_proj: np.ndarray = field(repr=False)  # s, MLP up-projection at each token count (LM head scaling)
    path: Path = Path()
    sha256: str = ""
    layers_from: str = ""  # the model whose layer table stands in for this one's ("" for its own)

    def interp(self, values: np.ndarray, tokens: np.ndarray | float) -> np.ndarray:
        """``values`` linearly interpolated at ``tokens`` (within the profiled range)."""
        t = np.asarray(tokens, dtype=float)
        if np.any(t > self.tokens[-1]) or np.any(t < 0):
            raise CalibrationError(
                f"{self.path}: {float(np.max(t)):g} tokens in one iteration is outside the profiled range "
                f"{self.tokens[0]}-{self.tokens[-1]}; use a smaller chunk or batch"
            )
        return np.where(t > 0, np.interp(t, self.tokens, values), 0.0)


def _geometry_row(path: Path) -> dict[str, Any]:
    """The model geometry columns of the first row of an mlp.csv."""
    d = _read_csv(path, GEOMETRY_COLUMNS)
    first = d.iloc[0]
    out: dict[str, Any] = {c: int(first[c]) for c in GEOMETRY_COLUMNS}
    out["gated"] = str(first.get("use_gated_mlp", True)).lower() == "true"
    if out["n_head"] < 1 or out["n_embd"] < out["n_head"] or out["n_kv_head"] < 1:
        raise CalibrationError(f"{path}: geometry n_head = {out['n_head']}, n_kv_head = {out['n_kv_head']}, "
                               f"n_embd = {out['n_embd']}: expected n_embd >= n_head >= 1 and n_kv_head >= 1")
    return out


def _layer_shape(geo: dict[str, Any]) -> tuple:
    """What a layer's operator times depend on: heads, widths and the MLP kind (not the vocabulary)."""
    return tuple(geo[k] for k in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "gated"))


def _model_geometry(data_dir: str | Path, have: dict[str, dict[str, tuple[int, ...]]], model: str) -> dict | None:
    """The geometry of ``model`` from its table on any GPU (first in name order); None if it has none."""
    for gpu in sorted(have):
        if model in have[gpu]:
            return _geometry_row(Path(data_dir) / "compute" / gpu / model / "mlp.csv")
    return None


def stand_ins(data_dir: str | Path, gpu: str, model: str) -> list[str]:
    """Models profiled on ``gpu`` whose layers have the shapes of ``model``'s (e.g. Llama-2-70B for
    Llama-3-70B on H100): their layer table can stand in for ``model``'s (``layers_from=``)."""
    have = available(data_dir)
    geo = _model_geometry(data_dir, have, model)
    if geo is None or gpu not in have or model in have[gpu]:
        return []
    return [m for m in have[gpu] if m in MODELS and
            _layer_shape(_geometry_row(Path(data_dir) / "compute" / gpu / m / "mlp.csv")) == _layer_shape(geo)]


def read_operator_table(data_dir: str | Path, gpu: str, model: str, tp: int, *,
                        layers_from: str | None = None) -> OperatorTable:
    """The (``gpu``, ``model``, ``tp``) slice of ``DATA_DIR/compute/GPU/MODEL/mlp.csv``.

    ``layers_from``: another model profiled on ``gpu`` whose layers have exactly ``model``'s shapes
    (heads, widths, MLP kind; the vocabulary may differ): its per-layer times stand in for the
    missing table, ``model``'s geometry (read from its table on another GPU), layer count and size
    are kept. Unknown GPU, model or TP degree raise :class:`CalibrationError` naming what the folder holds.
    """
    have = available(data_dir)
    g = str(gpu).lower()
    if g not in have:
        raise CalibrationError(f"--gpu {gpu!r}: no operator tables for it; the folder has {', '.join(sorted(have))}")
    if g not in GPUS:  # pragma: no cover - the data has exactly the three GPUs of GPUS
        raise CalibrationError(f"--gpu {gpu!r}: no published peak numbers; known: {', '.join(GPUS)}")
    if layers_from is None and model not in have[g]:
        alt = stand_ins(data_dir, g, model) if model in MODELS else []
        hint = f" ({alt[0]} has the same layer shapes: --layers-from {alt[0]})" if alt else ""
        raise CalibrationError(f"--model {model!r}: no table for {g}; it has {', '.join(have[g])}{hint}")
    if model not in MODELS:
        raise CalibrationError(f"--model {model!r}: no geometry (layers, parameters) in fluidopt.calibration.vidur.MODELS; "
                               f"known: {', '.join(MODELS)}")
    if layers_from is None:
        source = model
        geo_model = None
    else:
        if layers_from not in have[g]:
            raise CalibrationError(f"--layers-from {layers_from!r}: no table for {g}; it has {', '.join(have[g])}")
        geo_model = _model_geometry(data_dir, have, model)
        if geo_model is None:
            raise CalibrationError(f"--model {model!r}: no table on any GPU to read its geometry from")
        source = layers_from
    if isinstance(tp, bool) or not isinstance(tp, (int, np.integer)) or int(tp) not in have[g][source]:
        raise CalibrationError(f"--tp {tp!r}: {g} {source} was profiled at tensor-parallel degrees "
                               f"{', '.join(map(str, have[g][source]))}")
    path = Path(data_dir) / "compute" / g / source / "mlp.csv"
    raw = path.read_bytes()
    d = _read_csv(path, ["num_tokens", "num_tensor_parallel_workers", *GEOMETRY_COLUMNS,
                         *(f"time_stats.{op}.median" for op in REQUIRED_OPS)])
    d = d[d["num_tensor_parallel_workers"] == int(tp)].sort_values("num_tokens", kind="stable")
    # A token count profiled twice (h100 Llama-2-70B tp 4 has two rows at 2,048 and at 4,096 tokens): the
    # later row in the file wins. The sort is stable so that the choice does not depend on numpy's
    # quicksort, which orders equal keys differently across releases and so changed the fitted profiles.
    d = d.drop_duplicates("num_tokens", keep="last")
    if len(d) < 2 or d["num_tokens"].iloc[0] < 1:
        raise CalibrationError(f"{path}: tp {tp}: expected rows at two or more token counts >= 1, got "
                               f"{d['num_tokens'].tolist()}")
    geo_src = _geometry_row(path)
    if geo_model is not None and _layer_shape(geo_model) != _layer_shape(geo_src):
        raise CalibrationError(
            f"--layers-from {layers_from!r}: its layers (n_head, n_kv_head, n_embd, n_expanded_embd, gated) = "
            f"{_layer_shape(geo_src)} differ from {model}'s {_layer_shape(geo_model)}; expected identical shapes"
        )
    geo = geo_model or geo_src
    m = MODELS[model]
    m = ModelGeometry(m.name, m.slug, m.layers, m.params, geo["n_head"], geo["n_kv_head"], geo["n_embd"],
                      geo["n_expanded_embd"], geo["vocab_size"], geo["gated"])
    ms = 1e-3
    # an operator the model does not have is absent (phi-2 has one norm per layer): it counts 0
    ops = sum(pd.to_numeric(d[f"time_stats.{op}.median"], errors="coerce").fillna(0.0).to_numpy(float)
              for op in LAYER_OPS if f"time_stats.{op}.median" in d.columns) * ms
    return OperatorTable(GPUS[g], m, int(tp), d["num_tokens"].to_numpy(float), ops,
                         d["time_stats.emb.median"].to_numpy(float) * ms,
                         d["time_stats.mlp_up_proj.median"].to_numpy(float) * ms, path,
                         hashlib.sha256(raw).hexdigest(), "" if layers_from is None else layers_from)


# ------------------------------------------------------------------------------------------------
# One iteration
# ------------------------------------------------------------------------------------------------
def iteration_time(table: OperatorTable, chunk: np.ndarray | float, decodes: np.ndarray | float,
                   context: np.ndarray | float = 0.0, *, prefix: np.ndarray | float = 0.0,
                   attention: AttentionModel = ATTENTION) -> np.ndarray:
    """Seconds of one engine iteration on a replica: a prefill chunk of ``chunk`` tokens (over
    ``prefix`` already cached tokens of its prompt) next to ``decodes`` decodes with ``context``
    resident KV tokens each. Broadcasts over array arguments."""
    c = np.asarray(chunk, dtype=float)
    dec = np.asarray(decodes, dtype=float)
    t = c + dec
    m, tp, spec = table.model, table.tp, table.gpu
    hq, hkv = m.n_head / tp, max(1.0, m.n_kv_head / tp)
    ops = table.interp(table.layer_ops, t)
    attn = attention.prefill(spec, c, prefix, hq, m.head_dim) + attention.decode(spec, dec, context, hkv, m.head_dim)
    if tp > 1:
        bytes_ = t * m.n_embd * BYTES_PER_VALUE
        allreduce = 2.0 * (ALLREDUCE_LATENCY + 2.0 * (tp - 1) / tp * bytes_ / spec.link_bandwidth)
    else:
        allreduce = 0.0
    rows = dec + (c > 0)  # sampled rows: one per decode, one for the prefill
    scale = m.vocab_size / (m.n_expanded_embd * (2 if m.gated else 1))
    lm_head = table.interp(table.up_proj, rows) * scale
    return m.layers * (ops + attn + allreduce) + table.interp(table.emb, t) + lm_head


def kv_capacity(table: OperatorTable) -> float:
    """KV-cache tokens a replica holds: (GPU memory x 0.9 - weights / tp) / KV bytes per token per GPU."""
    free = table.gpu.memory * MEMORY_UTILISATION - table.model.params * BYTES_PER_VALUE / table.tp
    return free / table.model.kv_bytes_per_token(table.tp)


# ------------------------------------------------------------------------------------------------
# The fit
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VidurFit:
    """The iteration law of one (GPU, model, TP) replica fitted to composed iteration times.

    ``fit`` is the OLS of tau = alpha + beta * C on the even-position chunk sizes of
    :data:`FIT_CHUNKS` with ``batch - 1`` decodes (no resident KV); ``cv_max_error`` is the largest
    |relative error| of the law at the odd-position (held-out) chunk sizes, at ``cv_worst_chunk``
    (``cv_median_error`` the median).
    ``kv_time_per_token`` (s per resident KV token) is the OLS slope of decode-only iterations of
    ``batch`` decodes against their total resident KV, with its 95% interval.
    """

    table: OperatorTable
    fit: CalibrationFit
    chunk: int
    batch: int
    kv_capacity: float  # tokens per replica
    kv_time_per_token: float  # s per resident KV token
    kv_time_per_token_ci: tuple[float, float]
    cv_max_error: float
    cv_worst_chunk: int
    cv_median_error: float

    @property
    def name(self) -> str:
        """Profile name, e.g. ``h100-llama-2-70b-tp4``."""
        return profile_name(self.table.gpu.key, self.table.model.name, self.table.tp)

    def to_profile(self):
        """The :class:`~fluidopt.core.model.GPUProfile` of one replica (no price: give your own)."""
        from fluidopt.core.model import GPUProfile

        f = self.fit
        return GPUProfile(alpha=f.alpha, beta=f.beta, tau_solo=f.tau_solo, chunk=self.chunk, batch=self.batch,
                          name=self.name, kv_capacity=self.kv_capacity, kv_time_per_token=self.kv_time_per_token)

    def summary(self) -> str:
        """The fit's table plus the Vidur specifics (what ``fluidopt calibrate --vidur`` prints)."""
        t = self.table
        lo, hi = self.kv_time_per_token_ci
        return "\n".join([
            f"Vidur operator profile: {t.gpu.name}, {t.model.name}, tensor parallel {t.tp} ({self.name})",
            *([f"layer times: {t.layers_from}'s table (same layer shapes; {t.model.name} has none for {t.gpu.key})"]
              if t.layers_from else []),
            f"data: {t.path} (sha256 {t.sha256[:16]}, vidur@{VIDUR_COMMIT}); attention: roofline "
            f"(fluidopt.calibration.vidur.ATTENTION); batch B = {self.batch}, chunk C = {self.chunk}",
            "",
            self.fit.summary(),
            f"kv_time_per_token = {self.kv_time_per_token:.4g} s per resident KV token  95% CI [{lo:.4g}, {hi:.4g}]",
            f"KV capacity = {self.kv_capacity:,.0f} tokens per replica ({t.gpu.memory / 1e9:g} GB x "
            f"{MEMORY_UTILISATION:g} per GPU - {t.model.params * BYTES_PER_VALUE / 1e9:.1f} GB weights / {t.tp})",
            f"cross-validation at {len(FIT_CHUNKS) // 2} held-out chunk sizes: median |relative error| "
            f"{100 * self.cv_median_error:.2f}%, worst {100 * self.cv_max_error:.2f}% (C = {self.cv_worst_chunk})",
        ])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: the fit's keys plus the Vidur specifics."""
        d = self.fit.to_dict()
        d.update({"profile": self.name, "gpu": self.table.gpu.key, "model": self.table.model.name, "tp": self.table.tp,
                  "kv_capacity": self.kv_capacity, "kv_time_per_token": self.kv_time_per_token,
                  "kv_time_per_token_ci": list(self.kv_time_per_token_ci), "cv_max_error": self.cv_max_error,
                  "cv_worst_chunk": self.cv_worst_chunk, "cv_median_error": self.cv_median_error, "data_file": str(self.table.path),
                  "data_sha256": self.table.sha256, "layers_from": self.table.layers_from or None})
        return d


def profile_name(gpu: str, model: str, tp: int) -> str:
    """``{gpu}-{model slug}-tp{tp}``, the name of a generated profile."""
    return f"{gpu}-{MODELS[model].slug}-tp{tp}"


def default_batch(capacity: float) -> int:
    """B of a generated profile: requests of REFERENCE_CONTEXT KV tokens that fit, at most MAX_BATCH."""
    return int(max(1, min(MAX_BATCH, math.floor(capacity / REFERENCE_CONTEXT))))


def fit_table(table: OperatorTable, *, chunk: int = CHUNK, batch: int | None = None,
              chunks: Sequence[int] = FIT_CHUNKS, attention: AttentionModel = ATTENTION) -> VidurFit:
    """Compose iterations from ``table`` and fit the law (see :class:`VidurFit`)."""
    import statsmodels.api as sm

    cap = kv_capacity(table)
    if cap <= 0:
        raise CalibrationError(
            f"{table.gpu.key} {table.model.name} tp {table.tp}: the weights ({table.model.params * BYTES_PER_VALUE / 1e9:.0f} GB) "
            f"do not fit in {table.tp} x {table.gpu.memory / 1e9:g} GB x {MEMORY_UTILISATION:g}; use a larger --tp"
        )
    b = default_batch(cap) if batch is None else int(batch)
    if b < 1:
        raise CalibrationError(f"batch: expected an integer >= 1 (requests per replica), got {batch!r}")
    c = np.asarray(sorted(chunks), dtype=float)
    tau = iteration_time(table, c, b - 1, attention=attention)
    solo = float(iteration_time(table, 0.0, b, attention=attention))
    train = np.arange(c.size) % 2 == 0
    rows = pd.DataFrame({"chunk_tokens": np.r_[c[train], 0.0], "iteration_seconds": np.r_[tau[train], solo],
                         "decodes": np.r_[np.full(train.sum(), b - 1), b].astype(np.int64),
                         "mode": ["mixed"] * int(train.sum()) + ["solo"]})
    fit = fit_iteration_time(rows, chunk=int(chunk), batch=b)
    held = ~train
    err = (fit.alpha + fit.beta * c[held]) / tau[held] - 1.0
    k = int(np.argmax(np.abs(err)))
    ctx = np.asarray(KV_CONTEXTS, dtype=float)
    ts = iteration_time(table, 0.0, b, ctx, attention=attention)
    res = sm.OLS(ts, np.column_stack([np.ones_like(ctx), b * ctx])).fit()
    ci = np.asarray(res.conf_int(alpha=0.05))[1]
    return VidurFit(table, fit, int(chunk), b, float(cap), float(res.params[1]), (float(ci[0]), float(ci[1])),
                    float(abs(err[k])), int(c[held][k]), float(np.median(np.abs(err))))


def from_vidur(data_dir: str | Path, gpu: str, model: str, tp: int, *, chunk: int | None = None,
               batch: int | None = None, layers_from: str | None = None) -> VidurFit:
    """Fit the iteration law of one (GPU, model, tensor-parallel degree) replica from Vidur's
    published operator profiles under ``data_dir`` (``compute/GPU/ORG/MODEL/mlp.csv``).

    Returns a :class:`VidurFit`: the :class:`~fluidopt.calibration.fit.CalibrationFit` of
    tau = alpha + beta * C (seconds, tokens) on composed iterations, ``kv_time_per_token`` (s per
    resident KV token), the KV capacity (tokens per replica) and the held-out cross-validation error.
    ``chunk`` (default :data:`CHUNK`, 1024) and ``batch`` (default: from the KV capacity) are serving
    settings. Unknown GPU, model or TP degree raise :class:`CalibrationError` naming what the folder
    holds. ``layers_from``: a model with the same layer shapes whose table on ``gpu`` stands in for a
    missing one (see :func:`read_operator_table`).
    """
    table = read_operator_table(data_dir, gpu, model, tp, layers_from=layers_from)
    return fit_table(table, chunk=CHUNK if chunk is None else chunk, batch=batch)


# ------------------------------------------------------------------------------------------------
# The profile library (calibration/profiles.toml, generated section)
# ------------------------------------------------------------------------------------------------
GENERATED_MARK = "# ---- generated by tools/vidur_profiles.py from the Vidur operator profiles: do not edit below ----"


def _g(x: float) -> str:
    return repr(float(f"{x:.6g}"))


def _render_slice(data_dir: str | Path, gpu: str, model: str, tp: int, layers_from: str | None,
                  skipped: list[str]) -> list[str]:
    """The TOML lines of one generated profile, or none (with the reason appended to ``skipped``)."""
    table = read_operator_table(data_dir, gpu, model, tp, layers_from=layers_from)
    if kv_capacity(table) <= 0:
        skipped.append(f"{profile_name(gpu, model, tp)}: weights do not fit")
        return []
    v = fit_table(table)
    f = v.fit
    if f.alpha < 0:
        skipped.append(f"{v.name}: the OLS intercept alpha = {f.alpha:.3g} s is negative (the composed "
                       f"time is convex over C = {FIT_CHUNKS[0]}-{FIT_CHUNKS[-1]} at batch {v.batch})")
        return []
    rel = table.path.relative_to(Path(data_dir)).as_posix()
    stand_in = []
    if layers_from:
        stand_in = [f'layers_from = "{layers_from}"',
                    f'notes = "{gpu} has no {model} table: the per-layer times are {layers_from}\'s (identical '
                    f'layer shapes), with {model}\'s layers, vocabulary and weights. On A100, where both are '
                    f'profiled, this stand-in gives beta within 1.6%, tau_solo within 1.4% (TP 2, 4, 8)."']
    return [
        f"[{v.name}]",
        f'model = "{model}"',
        f'hardware = "{table.gpu.name}"',
        f"gpus = {tp}",
        'engine = "composed from Vidur per-operator GPU kernel times (no CPU overhead)"',
        f"alpha = {_g(f.alpha)}",
        f"beta = {_g(f.beta)}",
        f"tau_solo = {_g(f.tau_solo)}",
        f"chunk = {v.chunk}",
        f"batch = {v.batch}",
        f"kv_capacity = {round(v.kv_capacity)}",
        f"kv_time_per_token = {_g(v.kv_time_per_token)}",
        f"alpha_ci = [{_g(f.alpha_ci[0])}, {_g(f.alpha_ci[1])}]",
        f"beta_ci = [{_g(f.beta_ci[0])}, {_g(f.beta_ci[1])}]",
        f"kv_time_per_token_ci = [{_g(v.kv_time_per_token_ci[0])}, {_g(v.kv_time_per_token_ci[1])}]",
        f"r2 = {float(f'{f.r2:.6f}')!r}",
        f"cv_median_error = {float(f'{v.cv_median_error:.4g}')!r}",
        f"cv_max_error = {float(f'{v.cv_max_error:.4g}')!r}",
        f'data_file = "{rel}"',
        f'data_sha256 = "{table.sha256}"',
        *stand_in,
        f'source = "Vidur (Agrawal et al., MLSys 2024), microsoft/vidur@{VIDUR_COMMIT} data/profiling/{rel}; '
        f'attention: roofline validated on legacy A100 profile (vidur@{LEGACY_COMMIT})"',
        "",
    ]


def render_profiles(data_dir: str | Path) -> tuple[str, list[str]]:
    """The generated TOML section (every (GPU, model, TP) whose weights fit) and the skipped ones."""
    have = available(data_dir)
    val = validate_attention(data_dir)
    out: list[str] = []
    skipped: list[str] = []
    for gpu in sorted(have):
        for model in sorted(have[gpu], key=lambda m: MODELS[m].slug if m in MODELS else m):
            if model not in MODELS:
                skipped.append(f"{gpu} {model}: no geometry")
                continue
            for tp in have[gpu][model]:
                out += _render_slice(data_dir, gpu, model, tp, None, skipped)
        for model in sorted(set(MODELS) - set(have[gpu]), key=lambda m: MODELS[m].slug):
            for alt in stand_ins(data_dir, gpu, model)[:1]:
                for tp in have[gpu][alt]:
                    out += _render_slice(data_dir, gpu, model, tp, alt, skipped)
    n = sum(len(t) for m in have.values() for t in m.values())
    made = sum(1 for line in out if line.startswith("["))
    derived = sum(1 for line in out if line.startswith("layers_from"))
    head = [GENERATED_MARK,
            f"# One profile per (GPU, model, TP) slice of the tables ({n} slices) and per stand-in slice (a model",
            "# missing on a GPU, timed with the layer table of a model of identical layer shapes; marked",
            f"# layers_from): {made} profiles, {derived} of them stand-ins. A profile is one replica of `gpus` GPUs",
            f"# (fleets count replicas). alpha/beta: OLS on composed iterations, C = {FIT_CHUNKS[0]}-{FIT_CHUNKS[-1]}, "
            "batch - 1 decodes;",
            "# *_ci: 95% intervals; cv_*: |relative error| at held-out chunk sizes. Attention: roofline",
            f"# (fluidopt.calibration.vidur.ATTENTION), held-out median error on the A100 profile: prefill "
            f"{100 * val.prefill_median_abs:.1f}%, decode {100 * val.decode_median_abs:.1f}%.",
            "# No price: give yours (fluidopt plan --price GPU=DOLLARS_PER_GPU_HOUR). Skipped slices:",
            *(f"#   {x}" for x in skipped), ""]
    return "\n".join(head + out).rstrip("\n") + "\n", skipped


def splice_profiles(current: str, generated: str) -> str:
    """``current`` profiles.toml with everything from :data:`GENERATED_MARK` on replaced by ``generated``."""
    head = current.split(GENERATED_MARK, 1)[0].rstrip("\n")
    return head + "\n\n" + generated


__all__ = ["ATTENTION", "GPUS", "MODELS", "AttentionModel", "AttentionValidation", "GPUSpec", "ModelGeometry",
           "OperatorTable", "VidurFit", "available", "fit_attention", "fit_table", "from_vidur", "iteration_time",
           "kv_capacity", "profile_name", "read_operator_table", "render_profiles", "splice_profiles",
           "validate_attention"]
