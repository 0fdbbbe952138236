"""Numerics shared by the architecture files."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from gguf import GGMLQuantizationType

from abbench.engine.gguf_file import to_f32

if TYPE_CHECKING:
    from abbench.engine.gguf_file import ModelFile

EMBEDDING_F32_MAX = 64 << 20  # a larger quantized embedding table stays in its type


class QuantRows:
    """A quantized embedding table kept as the file has it: the rows a token looks up are
    converted to F32 when looked up (`table[ids]`), so a 150k-token vocabulary does not
    take its F32 size (1.2 GB at d 2048) for the few rows a run reads."""

    def __init__(self, raw: np.ndarray, ggml_type: GGMLQuantizationType,
                 shape: tuple[int, int]) -> None:
        self.rows = raw.reshape(shape[0], -1)  # (vocab, row bytes)
        self.ggml_type, self.shape = ggml_type, shape

    def __getitem__(self, ids: Any) -> np.ndarray:
        rows = self.rows[ids]  # (row bytes,) or (n, row bytes)
        return to_f32(rows.reshape(-1, rows.shape[-1]).copy(), self.ggml_type,
                      (rows.size // rows.shape[-1], self.shape[1])).reshape(
                          *rows.shape[:-1], self.shape[1])


def embedding(mf: ModelFile, name: str, pinned: bool) -> np.ndarray | QuantRows:
    """The token embedding (vocab, d): F32 (converted once, if not F32), or a quantized
    table too large for that, its rows converted as they are looked up."""
    info = mf.tensor(name)
    f32_bytes = math.prod(info.shape) * 4
    if info.ggml_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) \
            or f32_bytes <= EMBEDDING_F32_MAX:
        return mf.read_dense(name, pinned)
    return QuantRows(mf.read_raw(name), info.ggml_type, info.shape)  # type: ignore[arg-type]


class RoutingHook(Protocol):
    """Called with each layer's router input and final routing (predictors, tests): in
    decode x (d,), ids and weights (k,); in prefill (`phase` 0) once per layer for the
    whole batch, x (n, d), ids and weights (n, k). Once the model fused the next layer's
    router into this one's (`fuse_next_routers`, for a stale-gate predictor), decode calls
    also pass what the next layer's router makes of this layer's input: `next_logits`
    (n_expert,) and `next_ids` (k,), their top-k ranked as the router ranks (ties to the
    lower id)."""

    def __call__(
        self, layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, phase: int,
        next_ids: np.ndarray | None = None, next_logits: np.ndarray | None = None,
    ) -> None: ...


# These run once or twice per layer per token on tiny vectors, where numpy's per-call
# overhead, not arithmetic, is the cost: they are written for the fewest calls.


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float,
             out: np.ndarray | None = None) -> np.ndarray:
    """x: (d,) → (d,), into `out` if given (the same arithmetic either way)."""
    # np.vecdot, not np.dot: the attention's head norms use it too, and on a decode layer's
    # path each distinct numpy function costs its first call's cache misses (measured
    # here, two runs: ten distinct calls added 17-18 us a layer, ten of one kind 6-7 us).
    # The scale is a Python float, so the products stay F32.
    scale = 1.0 / math.sqrt(float(np.vecdot(x, x)) / x.size + eps)
    if out is None:
        return x * scale * weight
    _mul(x, scale, out)  # positional out: its keyword costs as much as the arithmetic here
    _mul(out, weight, out)
    return out


_mul = np.multiply


def rms_norm_rows(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x: (n, hd) → (n, hd), each row normalised on its own (q/k head norm)."""
    inv = (np.einsum("ij,ij->i", x, x) * (1.0 / x.shape[1]) + eps) ** -0.5  # (n,)
    return x * inv[:, None] * weight


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    e /= e.sum(axis=axis, keepdims=True)
    return e


def rope_tables(head_dim: int, n_ctx: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin: (n_ctx, head_dim/2) for NeoX RoPE."""
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (hd/2,)
    angles = np.arange(n_ctx, dtype=np.float64)[:, None] * inv[None, :]  # (T, hd/2)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
