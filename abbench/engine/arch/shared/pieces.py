"""The leaves and the norm every layer graph builds (in its own context): a weight matrix
as the file stores it, re-laid where the team repacks; an F32 array over numpy's memory;
and llama.cpp's `build_norm(LLM_NORM_RMS)`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from abbench.engine.kernels import ggml

if TYPE_CHECKING:
    from abbench.engine.kernels.qcompute import Weight


@dataclass(frozen=True)
class Pieces:
    ctx: ggml.Context
    repacker: Any  # the team's (`QuantTeam.repacker`)
    eps: float  # the RMS norm's epsilon

    def matrix(self, m: Weight) -> int:
        return m.tensor(self.ctx, self.repacker)

    def vector(self, v: np.ndarray) -> int:
        """An F32 array as a tensor of its numpy shape (ggml's extents reversed)."""
        return self.ctx.tensor(ggml.F32, v.shape[::-1], v.ctypes.data)

    def rms(self, x: int, weight: np.ndarray) -> int:  # build_norm(LLM_NORM_RMS)
        op = self.ctx.op
        return op("mul", op("rms_norm", x, self.eps), self.vector(weight))
