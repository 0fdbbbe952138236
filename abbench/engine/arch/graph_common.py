"""What the architectures' ggml graph models share: the output graph.

Each `*_graph.py` builds its layers as llama.cpp's graph for its architecture; the final
norm and the output projection are the same graph for every one of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from abbench.engine import ggml

if TYPE_CHECKING:
    from abbench.engine.qcompute import Weight


class OutputGraph:
    """The final norm and the output projection for one token. `model`: a graph model
    (its `args` with `embedding_length` and `layer_norm_rms_epsilon`, its `team`, and
    `inputs(1)`: the residual stream's buffer (1, d) this graph reads)."""

    def __init__(self, model: Any, norm: np.ndarray, output: Weight) -> None:
        d = model.args.embedding_length
        rows = output.rows
        self.norm, self.output = norm, output
        ctx = self.ctx = ggml.Context(model.team.g, 8, 16, 4 * (3 * d + rows) + 4096)
        h = ctx.tensor(ggml.F32, (d, 1), model.inputs(1)[0].ctypes.data)
        x = ctx.op("mul", ctx.op("rms_norm", h, model.args.layer_norm_rms_epsilon),
                   ctx.tensor(ggml.F32, (d,), norm.ctypes.data))
        logits = ctx.op("mul_mat", output.tensor(ctx, model.team.repacker), x)
        self.graph = ctx.graph([logits], model.team.threads_pool)
        self.logits = ctx.array(logits, (rows,), np.float32)
