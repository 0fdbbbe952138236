"""Qwen3.5/3.6 MoE as llama.cpp's graph: the model for files computed in their own types.

Each layer is the graph llama.cpp builds for it (`qwen35moe_graph_layers.py`: the gated
delta net with its conv and recurrent state, or gated full attention with IMROPE and the
KV cache, then the router and the gated shared expert), op for op with ggml's own ops, so
every transcendental, norm and sort is ggml's. The routed experts run from the cache
(`ExpertRunner` on `qcompute.ExpertGraph`: llama.cpp's `mul_mat_id` graph) with the
weights the layer's graph gives (build_moe_ffn's get_rows, sum_rows, clamp, div), their
weighted sum is finished in numpy in llama.cpp's arithmetic (`qcompute.weighted_sum`),
then `(moe + shared) + ffn_inp` as llama.cpp adds them. The same skeleton as
`arch/shared/plain_graph.py`: weights → one layer's graph → the model, with the interface of
`qwen35moe.Model`.

State, as the numpy model keeps it: the full layers' KV caches by position; the linear
layers' conv and delta states are one sequence's, which a pass at position 0 zeroes (as
llama.cpp clears a new sequence's recurrent cells) and any other pass must continue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from abbench.engine.arch.qwen35moe.args import ModelArgs
from abbench.engine.arch.qwen35moe.graph_layers import DeltaNetWeights, LayerGraph, LayerWeights
from abbench.engine.arch.shared.graph import (
    DecodeGraphs,
    GraphFace,
    OutputGraph,
)
from abbench.engine.arch.shared.masks import attended, causal_mask
from abbench.engine.arch.shared.token_graph import TokenGraph, token_graph
from abbench.engine.kernels.qcompute import QuantTeam, Weight, weighted_sum
from abbench.errors import EngineError

if TYPE_CHECKING:
    from abbench.engine.experts.runner import ExpertRunner
    from abbench.engine.gguf.model_file import ModelFile
    from abbench.engine.streaming.slots import SlotPool


class GraphModel(GraphFace):
    """The whole decoder on ggml graphs; the interface of `qwen35moe.Model`."""

    def __init__(self, mf: ModelFile, args: ModelArgs, experts: ExpertRunner,
                 team: QuantTeam, pinned: bool, n_ctx: int, n_expert_used: int | None = None,
                 flash_attn: bool = False) -> None:
        self._init_face(mf, args, experts, team, pinned, n_ctx, n_expert_used, flash_attn)
        self.weights = [LayerWeights(mf, args, i, team, pinned, self.kv_size, flash_attn)
                        for i in range(args.block_count)]
        # Per pass size t: the residual stream (t, d), the positions (t,) and the four
        # RoPE positions a token (4t,: p, p, p, 0 for text) the graphs read; the causal
        # mask (t, n_kv) per attended length.
        self._positions: dict[int, np.ndarray] = {}
        self._masks: dict[tuple[int, int], np.ndarray] = {}
        self._graphs: DecodeGraphs[list[LayerGraph]] = DecodeGraphs()
        name = "output.weight" if "output.weight" in mf.tensors else "token_embd.weight"
        self._output = (mf.read_dense("output_norm.weight", True), team.matrix(mf, name, pinned))
        self._output_graph: OutputGraph | None = None
        self.next_pos = 0  # where the recurrent states stand

    # -- the interface the engine and predictors use -------------------------------------

    def dense_matrices(self) -> list[Weight]:
        return [*(m for w in self.weights for m in w.matrices()), self._output[1]]

    def reset(self) -> None:
        """Start a new sequence: the linear layers' states to zero."""
        for w in self.weights:
            if isinstance(w.mixer, DeltaNetWeights):
                w.mixer.reset()
        self.next_pos = 0

    # -- passes -------------------------------------------------------------------------

    def positions(self, t: int) -> np.ndarray:
        """(4t,) the multi-section RoPE's positions of a pass of `t` tokens."""
        return self._positions.setdefault(t, np.zeros(4 * t, np.int32))

    def mask(self, t: int, n_kv: int) -> np.ndarray:
        """(t, n_kv) the causal mask's buffer (0 where a token sees a position, else -inf),
        filled per pass by `_begin`."""
        return self._masks.setdefault((t, n_kv), np.zeros((t, n_kv), np.float32))

    def _begin(self, tokens: list[int], pos: int) -> tuple[np.ndarray, int]:
        """Fill the inputs of a pass of `tokens` at positions pos..: the residual stream
        (t, d), the positions, the causal mask; move the recurrent states' position on
        (zeroing them at 0) → the stream and the attended length (llama.cpp's n_kv)."""
        t = len(tokens)
        end = pos + t
        if end > self.kv_size:
            raise ValueError(f"position {end} past the context ({self.kv_size})")
        if pos == 0:
            self.reset()
        elif pos != self.next_pos:
            raise EngineError(f"qwen35moe: a pass at position {pos}, but the recurrent "
                              f"state stands at {self.next_pos} (it can only go on)")
        self.next_pos = end
        n_kv = attended(end, self.kv_size)
        h, positions = self.inputs(t)
        h[...] = self.token_embd[tokens]  # (t, d)
        positions[...] = np.arange(pos, end, dtype=np.int32)
        rope = self.positions(t).reshape(4, t)
        rope[:3] = positions  # text: the first three axes at the position, the 4th at 0
        rope[3] = 0
        causal_mask(self.mask(t, n_kv), pos)
        self._half_masks(t)
        return h, n_kv

    def _decode_graphs(self, pos: int, n_kv: int) -> list[LayerGraph]:
        """The layers' graphs for one token, built once per attended length."""
        graphs = self._graphs.get(n_kv, lambda: [LayerGraph(self, i, 1, n_kv, self.k)
                                                 for i in range(len(self.weights))])
        for g in graphs:
            g.set_position(pos)
        return graphs

    def _routed(self, g: LayerGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        x, top, w = g.first[:3]  # the pass's one token
        return x, x, top.astype(np.int64), w.copy()  # (d,), (d,), (k,), (k,)

    def _finish_layer(self, layer: int, g: LayerGraph, kept: np.ndarray, y: np.ndarray) -> None:
        h = self.inputs(1)[0]  # (1, d): the stream
        moe = weighted_sum(kept, y[: len(kept)])  # (d,)
        moe += g.first[3]  # the shared expert's output
        np.add(moe, g.first[4], out=h[0])  # + ffn_inp

    def _token_graph(self, pos: int, n_kv: int,
                     stacks: list[tuple[SlotPool, int]]) -> TokenGraph:
        """A decode token as one graph (each layer's, its experts', the output's), built
        once per attended length."""
        return self._token_graphs.get(n_kv, lambda: token_graph(
            self, stacks, lambda i, _, end: LayerGraph(self, i, 1, n_kv, self.k, stream=end),
            lambda _, end: OutputGraph(self, *self._output, stream=end)))

    def _batch_layer(self, t: int, pos: int, n_kv: int) -> Callable[[int, Any, int | None], Any]:
        return lambda i, _, end: LayerGraph(self, i, t, n_kv, self.k, stream=end)

    def prefill(self, tokens: list[int], pos: int) -> None:
        """Prompt tokens at positions pos .. pos+n-1 as one batch, filling the KV caches
        and moving the recurrent states on (their logits are not needed): one graph where
        it may (`_prefill_in_graph`), else a graph per layer and the experts between
        them."""
        hook = self.routing_hook
        h, n_kv = self._begin(tokens, pos)
        if self._prefill_in_graph(len(tokens), pos, n_kv):
            return
        for layer in range(len(self.weights)):
            # one layer's graph at a time: its scratch is the batch's size
            g = LayerGraph(self, layer, len(tokens), n_kv, self.k)
            g.set_position(pos)
            g.graph.compute()
            ids, weights = g.ids.astype(np.int64), g.weights.copy()  # (n, k), (n, k)
            if hook is not None:
                hook(layer, g.x, ids, weights, 0)
            moe = self.experts.prefill(layer, g.x, ids, weights)  # (n, d)
            np.add(moe + g.shared, g.ffn_inp, out=h)
            del g
