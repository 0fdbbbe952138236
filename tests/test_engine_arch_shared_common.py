"""The architectures' shared numerics: the norm into a given buffer, RoPE's matrix."""

from __future__ import annotations

import numpy as np

from abbench.engine.arch.shared.common import rms_norm, rope_matrix, rope_rows
from abbench.engine.arch.shared.plain_model import head_scales


def test_rms_norm_into_a_buffer_is_the_same_bits() -> None:
    rng = np.random.default_rng(0)
    for d in (8, 512, 1000):
        x = rng.standard_normal(d).astype(np.float32)
        w = rng.standard_normal(d).astype(np.float32)
        out = np.full(d, np.nan, np.float32)
        assert rms_norm(x, w, 1e-6, out) is out
        np.testing.assert_array_equal(out, rms_norm(x, w, 1e-6))
        ref = x.astype(np.float64) / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-6) * w
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_head_scales_are_the_rms_norm_over_sqrt_hd() -> None:
    rng = np.random.default_rng(1)
    hd, eps = 64, 1e-6
    x = rng.standard_normal((10, hd)).astype(np.float32)
    got = head_scales(x, np.float32(eps * hd))  # (10, 1)
    want = 1.0 / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + eps)
    np.testing.assert_allclose(got * np.sqrt(hd), want, rtol=2e-6)


def test_rope_matrix_turns_rows_as_the_elementwise_rope() -> None:
    rng = np.random.default_rng(2)
    half = 32
    angles = rng.uniform(-3, 3, half)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    x = rng.standard_normal((5, 2 * half)).astype(np.float32)
    r = rope_matrix(cos, sin)  # (hd, hd)
    assert np.count_nonzero(r) == 4 * half
    np.testing.assert_allclose(x @ r, rope_rows(x, cos, sin), rtol=1e-6, atol=1e-6)
