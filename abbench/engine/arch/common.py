"""Numerics shared by the architecture files."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class RoutingHook(Protocol):
    """Called with each layer's router input and final routing (predictors, traces)."""

    def __call__(
        self, layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, phase: int
    ) -> None: ...


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x: (d,) → (d,)"""
    return (x * (1.0 / np.sqrt(np.dot(x, x) / x.size + eps))).astype(np.float32) * weight


def rms_norm_rows(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x: (n, hd) → (n, hd), each row normalised on its own (q/k head norm)."""
    ms = np.einsum("ij,ij->i", x, x) / x.shape[1]  # (n,)
    return (x / np.sqrt(ms + eps)[:, None]).astype(np.float32) * weight


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def rope_tables(head_dim: int, n_ctx: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin: (n_ctx, head_dim/2) for NeoX RoPE."""
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (hd/2,)
    angles = np.arange(n_ctx, dtype=np.float64)[:, None] * inv[None, :]  # (T, hd/2)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
