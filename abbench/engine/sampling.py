"""Greedy and seeded temperature sampling, deterministic for a given seed."""

from __future__ import annotations

import numpy as np


class Sampler:
    def __init__(self, temp: float, seed: int) -> None:
        self.temp = temp
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> int:
        """logits: (vocab,) → token id. One uniform draw per token whatever the logits."""
        if self.temp <= 0.0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / self.temp
        p = np.exp(z - z.max())
        cdf = np.cumsum(p)
        u = self.rng.random() * cdf[-1]
        return int(min(np.searchsorted(cdf, u, side="right"), len(cdf) - 1))
