"""The expert FFN as the expert side calls it: the protocol an architecture gives its
experts' FFN by (`expert_ffn(mf, args)` in each architecture module), and the steps it adds
to an expert graph. Here, on the expert side, so that the expert side (compute, qcompute,
partner, the runner) depends on nothing above it; the architectures implement it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from abbench.engine.kernels.ggml import Context


class ExpertFFN(Protocol):
    """An architecture's expert FFN, as the shared expert side runs it: what comes between
    an expert's gate and up products and its down product (`act`), and after the down
    product (`post`), in numpy (compute.py's team, partner.py) and as steps of ggml's
    expert graph (qcompute.py `ExpertGraph`, through `graph`). The products themselves,
    the cache, the reads and the weighted sum are the expert side's. An architecture
    module gives its FFN as `expert_ffn(mf, args)`; qwen3moe's is `compute.SwiGLU`.

    A row's expert is its id in its layer (0 .. n_expert-1), never a cache slot: what an
    FFN holds per expert (biases) is indexed by it. `by_expert` False: the FFN reads no
    expert ids and its `post` does nothing, so the expert side neither gathers the ids
    nor calls `post` (qwen3moe's decode path, where every call costs)."""

    by_expert: bool

    def act(self, gate: np.ndarray, up: np.ndarray, out: np.ndarray, layer: int,
            experts: Any) -> None:
        """gate, up: (..., ff) rows of the gate and up products (both may be overwritten)
        → out (..., ff), the down product's input. `experts` indexes a per-expert stack
        (n_expert, ff) so that the result broadcasts against the rows: an int for one row,
        (n,) ids for n rows, (1,) for many rows of one expert."""

    def post(self, y: np.ndarray, layer: int, experts: Any) -> None:
        """y: (..., d) rows of down products, finished in place (`experts` as in `act`)."""

    def graph_bytes(self, rows: int, ff: int, d: int) -> int:
        """The scratch `graph`'s steps take in their context for `rows` (token, expert)
        rows."""

    def graph(self, ctx: Context, eids: int) -> FFNGraph:
        """The FFN's steps of one expert graph, built on `ctx` (results in its scratch:
        `ctx.op`); eids: I32 (n_used, t), the rows' expert ids, filled per call."""


class FFNGraph(Protocol):
    """One expert graph's FFN steps (`ExpertFFN.graph`): tensors of its context."""

    def act(self, gate: int, up: int) -> int:
        """gate, up: (ff, n_used, t) products → (ff, n_used, t), the down product's input."""

    def post(self, down: int) -> int:
        """down: (d, n_used, t) products → (d, n_used, t), the experts' outputs: `down`
        itself when there is nothing to do, else a new tensor (not a view), which the graph
        moves to memory of its own."""

    def set_layer(self, layer: int) -> None:
        """Point what the steps hold per layer (bias stacks) at `layer`'s, before a compute:
        one graph serves every layer of its shapes."""
