"""Numerics shared by the architecture files."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from gguf import GGMLQuantizationType

from abbench.engine.gguf.model_file import to_f32
from abbench.errors import ModelFileError

if TYPE_CHECKING:
    from abbench.engine.gguf.model_file import ModelFile

EMBEDDING_F32_MAX = 64 << 20  # a larger quantized embedding table stays in its type
KV_PAD = 256  # llama.cpp attends over a multiple of this many positions (get_n_kv)


def pad(n: int, to: int = KV_PAD) -> int:
    """n rounded up to a multiple of `to`."""
    return -(-n // to) * to


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
    (n_expert,), its bias added where it has one (`Model.router_bias`), and `next_ids`
    (k,), their top-k ranked as the router ranks (ties to the lower id)."""

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


def hidden_keys(pos: int, n: int, window: int | None) -> np.ndarray:
    """(n, pos+n) bool: which cache positions each of n queries at pos.. does not see —
    those after it, and with a sliding `window` those window or more before it."""
    at = pos + np.arange(n)[:, None]  # (n, 1) each query's position
    keys = np.arange(pos + n)[None, :]  # (1, T)
    hidden = keys > at
    if window is not None:
        hidden |= at - keys >= window
    return hidden


def rope_tables(head_dim: int, n_ctx: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin: (n_ctx, head_dim/2) for NeoX RoPE."""
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (hd/2,)
    angles = np.arange(n_ctx, dtype=np.float64)[:, None] * inv[None, :]  # (T, hd/2)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def header_numbers(mf: ModelFile) -> Callable[..., Any]:
    """`num(key, kind, default=None)`: the header's `ARCH.key` as `kind`, required when no
    default is given; a value that is not one is an error naming the key."""
    p = mf.architecture + "."

    def num(key: str, kind: type, default: object = None) -> Any:
        value = mf.require(p + key) if default is None else mf.get(p + key, default)
        try:
            return kind(value)
        except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
            raise ModelFileError(
                f"{mf.path}: metadata `{p + key}` is {value!r}, not a number"
            ) from None

    return num


def expert_stacks(args: Any, layer: int) -> dict[str, tuple[int, ...]]:
    """One layer's stacked experts (gate, up, down) with their numpy shapes, from `args`'
    expert_count, expert_feed_forward_length and embedding_length."""
    e, ff, d = args.expert_count, args.expert_feed_forward_length, args.embedding_length
    b = f"blk.{layer}."
    return {b + "ffn_gate_exps.weight": (e, ff, d), b + "ffn_up_exps.weight": (e, ff, d),
            b + "ffn_down_exps.weight": (e, d, ff)}


def check_header(mf: ModelFile, args: Any, shapes: dict[str, tuple[int, ...]]) -> None:
    """The checks every architecture's `ModelArgs` needs: layers, heads that divide,
    an even head size, top-k within the experts, a context, and every tensor's shape as
    the header implies it — a file whose numbers disagree with its tensors fails here,
    naming the key, not later in a reshape."""
    p = mf.architecture + "."

    def bad(key: str, why: str) -> ModelFileError:
        return ModelFileError(f"{mf.path}: metadata `{p}{key}` {why}")

    if args.block_count < 1:
        raise bad("block_count", f"is {args.block_count}, must be >= 1")
    if args.head_count_kv < 1 or args.head_count % args.head_count_kv:
        raise bad("attention.head_count_kv", f"is {args.head_count_kv}, must divide "
                  f"attention.head_count ({args.head_count})")
    if args.key_length < 2 or args.key_length % 2 or args.value_length != args.key_length:
        raise bad("attention.key_length", f"is {args.key_length}, must be even and equal "
                  f"attention.value_length ({args.value_length})")
    eps = args.layer_norm_rms_epsilon
    if not (math.isfinite(eps) and eps > 0):
        raise bad("attention.layer_norm_rms_epsilon", f"is {eps}, must be positive")
    if not 1 <= args.expert_used_count <= args.expert_count:
        raise bad("expert_used_count", f"is {args.expert_used_count}, must be between 1 "
                  f"and expert_count ({args.expert_count})")
    if args.context_length < 2:
        raise bad("context_length", f"is {args.context_length}, must be >= 2")
    for name, shape in shapes.items():
        got = mf.tensor(name).shape
        if got != shape:
            raise ModelFileError(
                f"{mf.path}: tensor `{name}` has shape {got}, but the header implies {shape}"
            )


def rope_rows(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """NeoX RoPE of a batch, elementwise: x (..., hd) with cos, sin broadcasting to
    (..., hd/2). The same rotation as `rope_matrix`, without its multiplications by 0."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def rope_matrix(cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """NeoX RoPE at one position as a right-multiplied (hd, hd) matrix.

    Dimension i pairs with i + hd/2: out_i = x_i cos - x_{i+h} sin,
    out_{i+h} = x_{i+h} cos + x_i sin. Built once per token, shared by every layer.
    """
    half = cos.shape[0]
    r = np.zeros((2 * half, 2 * half), np.float32)
    r.flat[_rope_cells(half)] = np.concatenate([cos, cos, -sin, sin])  # (4 * half,)
    return r


@functools.cache
def _rope_cells(half: int) -> np.ndarray:
    """Flat indices of `rope_matrix`'s non-zero cells: (i, i), (i+h, i+h), (i+h, i),
    (i, i+h) for i < h, in that order."""
    i = np.arange(half)
    n = 2 * half
    return np.concatenate([i * n + i, (i + half) * n + i + half, (i + half) * n + i,
                           i * n + i + half])
