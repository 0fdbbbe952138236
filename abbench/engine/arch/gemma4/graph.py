"""gemma4 as llama.cpp's graph: the model for files computed in their own types, and
`--kernels auto`'s for every gemma4 file (F32 experts too: it decodes 2.1x faster than the
numpy model, docs/gemma4.md §6).

Each layer is the graph llama.cpp builds for it (models/gemma4.cpp; docs/gemma4.md §3),
op for op with ggml's own ops (`graph_layers.py`), so GELU, RoPE, the softmaxes,
the argsort and the softcap's tanh are ggml's: a quantized product's input is then
llama.cpp's to the bit, and so is what it quantizes it to. Between a layer's graph and the
next one's the experts run from the cache (`ExpertRunner` on `qcompute.ExpertGraph` with
`gemma4.GeluExperts`' steps: geglu_split, then each row times its expert's scale). The
next layer's graph begins with this layer's end — in a decode pass the experts' weighted
sum as build_moe_ffn makes it (in prefill the expert side's, the same arithmetic), its
norms, the dense FFN's output, the residual, the layer's scalar — and the output graph
with the last layer's, then the final norm, the output product and the softcap (scale,
tanh, scale). The router's weights are the graph's too (build_moe_ffn's get_rows,
sum_rows, clamp, div). Caches as llama.cpp sizes them: the full layers' the
context's, the sliding layers' a ring of the window and one batch (in blocks of 256).
The same skeleton as `arch/shared/plain_graph.py`: weights → one layer's graph → the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from abbench.engine.arch.gemma4.args import ModelArgs
from abbench.engine.arch.gemma4.graph_layers import LayerGraph, LayerWeights, ending
from abbench.engine.arch.shared.common import pad
from abbench.engine.arch.shared.graph import (
    DecodeGraphs,
    GraphFace,
    LayerCache,
)
from abbench.engine.arch.shared.masks import SlidingMasks, attended
from abbench.engine.arch.shared.token_graph import TokenGraph, token_graph
from abbench.engine.kernels import ggml
from abbench.engine.kernels.qcompute import QuantTeam, Weight

if TYPE_CHECKING:
    from abbench.engine.experts.runner import ExpertRunner
    from abbench.engine.gguf.model_file import ModelFile
    from abbench.engine.streaming.slots import SlotPool

N_UBATCH = 512  # llama.cpp's default micro-batch, which a sliding layer's ring holds beside
# its window


class LogitsGraph:
    """The last layer's end, the final norm, the output product and the softcap, for one
    token after the decode graphs `last` (its layer)."""

    def __init__(self, model: GraphModel, last: LayerGraph, moe: int | None = None) -> None:
        """moe: the last layer's experts' sum (d, 1) in a token's one graph
        (`TokenGraph`), which then computes these nodes too."""
        a, (norm, output) = model.args, model.output
        d, rows = a.embedding_length, output.rows
        ctx = self.ctx = ggml.Context(model.team.g, 32, 64, 4 * (12 * d + 4 * rows) + 8192)
        op = ctx.op
        h = ending(ctx, model, last, 1, moe)  # (d, 1)
        x = op("mul", op("rms_norm", h, a.layer_norm_rms_epsilon),
               ctx.tensor(ggml.F32, (d,), norm.ctypes.data))
        logits = op("mul_mat", output.tensor(ctx, model.team.repacker), x)  # (vocab, 1)
        cap = np.float32(a.final_logit_softcapping)
        if cap:
            logits = op("scale", op("tanh", op("scale", logits, float(np.float32(1) / cap))),
                        float(cap))
        self.tensor = logits
        if moe is None:
            self.graph = ctx.graph([logits], model.team.threads_pool)
        self.logits = ctx.array(logits, (rows,), np.float32)


class GraphModel(GraphFace):
    """The whole decoder on ggml graphs; the interface of `gemma4.Model`."""

    def __init__(self, mf: ModelFile, args: ModelArgs, experts: ExpertRunner,
                 team: QuantTeam, pinned: bool, n_ctx: int, n_expert_used: int | None = None,
                 flash_attn: bool = False) -> None:
        self._init_face(mf, args, experts, team, pinned, n_ctx, n_expert_used, flash_attn)
        self.sliding = SlidingMasks(pad(min(pad(n_ctx), args.sliding_window + N_UBATCH)),
                                    args.sliding_window, self._half, self._half_masks)
        self.embd_scale = np.sqrt(np.float32(args.embedding_length))  # sqrtf(n_embd)
        self.weights = [LayerWeights(mf, args, i, team, pinned)
                        for i in range(args.block_count)]
        self.caches = [LayerCache.new(swa, self.sliding.swa_size if swa else self.kv_size,
                                      args.kv_heads[i] * args.head_dim(i), flash_attn)
                       for i, swa in enumerate(args.swa_layers)]
        self.rope_freqs = (np.zeros(1, np.float32) if all(args.swa_layers) else
                           np.ascontiguousarray(mf.read_dense("rope_freqs.weight", True),
                                                dtype=np.float32))  # (n_rot/2,)
        self._moe: dict[int, np.ndarray] = {}
        self._decode_output: LogitsGraph | None = None  # the last decode pass's output graph
        # a decode layer's experts' outputs (k, d) and weights (k,), which the next graph
        # sums (rows past the experts kept: zeros)
        self.moe_y = np.zeros((self.k, args.embedding_length), np.float32)
        self.moe_w = np.zeros(self.k, np.float32)
        # decode's layer graphs and output graph, by attended cells (full, sliding)
        self._graphs: DecodeGraphs[tuple[list[LayerGraph], LogitsGraph]] = DecodeGraphs()
        name = "output.weight" if args.own_output else "token_embd.weight"
        self.output = (mf.read_dense("output_norm.weight", True),
                       team.matrix(mf, name, pinned))

    # -- the interface the engine and predictors use -------------------------------------

    def router_matrix(self, layer: int) -> np.ndarray:
        """The router as one matrix on the layer's `attn_out` RMS-normed without a weight
        (what the routing hook is given), as the numpy model's."""
        return self.weights[layer].folded  # (n_expert, d)

    def dense_matrices(self) -> list[Weight]:
        return [*(m for w in self.weights for m in w.matrices()), self.output[1]]

    def rope(self, layer: int) -> ggml.Rope:
        """The scalars llama.cpp passes to `rope_ext` on a layer: a sliding one its own
        base and no scaling, a full one the file's base and scale (NeoX; YaRN off)."""
        a, swa = self.args, self.args.swa_layers[layer]
        return ggml.Rope(a.rope_dims(layer), ggml.ROPE_NEOX, a.context_length,
                         a.rope_freq_base_swa if swa else a.rope_freq_base,
                         1.0 if swa else a.rope_freq_scale)

    # -- passes -------------------------------------------------------------------------

    def moe_out(self, t: int) -> np.ndarray:
        """(t, d) the buffer of a layer's experts' weighted sum, which the next graph reads."""
        if t not in self._moe:
            self._moe[t] = np.zeros((t, self.args.embedding_length), np.float32)
        return self._moe[t]

    def _begin(self, tokens: list[int], pos: int) -> tuple[int, int]:
        """Fill the inputs of a pass of `tokens` at positions pos..: the scaled embeddings,
        the positions, the ring's cells and both caches' masks → the attended cells (full,
        sliding)."""
        t, end = len(tokens), pos + len(tokens)
        if end > self.kv_size:
            raise ValueError(f"position {end} past the context ({self.kv_size})")
        n_kv = (attended(end, self.kv_size), attended(end, self.sliding.swa_size))
        h, positions = self.inputs(t)
        np.multiply(self.token_embd[tokens], self.embd_scale, out=h)  # (t, d) ggml_scale
        positions[...] = np.arange(pos, end, dtype=np.int32)
        self.sliding.place(positions, n_kv)
        return n_kv

    def _graph(self, layer: int, t: int, n_kv: tuple[int, int], pos: int,
               prev: LayerGraph | None, decode: bool = False) -> LayerGraph:
        return LayerGraph(self, layer, t, n_kv[self.caches[layer].swa], pos, prev, decode)

    def _decode_graphs(self, pos: int, n_kv: tuple[int, int]
                       ) -> tuple[list[LayerGraph], LogitsGraph]:
        """The layers' graphs and the output graph for one token, built once per attended
        length."""

        def build() -> tuple[list[LayerGraph], LogitsGraph]:
            graphs: list[LayerGraph] = []
            for i in range(len(self.weights)):
                graphs.append(self._graph(i, 1, n_kv, pos, graphs[-1] if graphs else None,
                                          True))
            return graphs, LogitsGraph(self, graphs[-1])

        built = self._graphs.get(n_kv, build)
        for g in built[0]:
            g.set_position(pos)
        return built

    def _begin_token(self, token: int, pos: int) -> tuple[int, int]:
        return self._begin([token], pos)

    def _layer_graphs(self, pos: int, n_kv: tuple[int, int]) -> list[LayerGraph]:
        graphs, self._decode_output = self._decode_graphs(pos, n_kv)
        return graphs

    def _logits(self) -> np.ndarray:
        assert self._decode_output is not None  # set by the pass's `_layer_graphs`
        self._decode_output.graph.compute()
        return self._decode_output.logits.copy()

    def _routed(self, g: LayerGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        # the router's own input (`unit`) is what the hook sees; the experts take x
        return g.x[0], g.unit[0], g.order[0, : self.k].astype(np.int64), g.weights[0].copy()

    def _finish_layer(self, layer: int, g: LayerGraph, kept: np.ndarray, y: np.ndarray) -> None:
        n = len(kept)  # (k',) (k', d): the next graph sums them
        self.moe_y[:n], self.moe_w[:n] = y[:n], kept
        if n < self.k:
            self.moe_y[n:], self.moe_w[n:] = 0.0, 0.0

    def _token_graph(self, pos: int, n_kv: tuple[int, int],
                     stacks: list[tuple[SlotPool, int]]) -> TokenGraph:
        """A decode token as one graph (each layer's, its experts', the output's), built
        once per attended length. A layer's end is its experts' sum, which the next
        layer's graph (or the output's) finishes it with."""
        return self._token_graphs.get(n_kv, lambda: token_graph(
            self, stacks,
            lambda i, prev, moe: LayerGraph(self, i, 1, n_kv[self.caches[i].swa], pos, prev,
                                            True, moe),
            lambda last, moe: LogitsGraph(self, last, moe)))

    def _batch_layer(self, t: int, pos: int, n_kv: tuple[int, int]
                     ) -> Callable[[int, Any, int | None], Any]:
        return lambda i, prev, moe: LayerGraph(self, i, t, n_kv[self.caches[i].swa], pos,
                                               prev, False, moe)

    def prefill(self, tokens: list[int], pos: int) -> None:
        """Prompt tokens at positions pos .. pos+n-1 as one batch, filling the KV caches
        (their logits are not needed): one graph where it may (`_prefill_in_graph`), else
        a graph per layer and the experts between them."""
        hook = self.routing_hook
        n_kv = self._begin(tokens, pos)
        if self._prefill_in_graph(len(tokens), pos, n_kv):
            return
        moe = self.moe_out(len(tokens))
        prev: LayerGraph | None = None
        for layer in range(len(self.weights)):
            # one layer's graph at a time (and the one before, whose end it reads): their
            # scratch is the batch's size
            g = self._graph(layer, len(tokens), n_kv, pos, prev)
            g.graph.compute()
            ids = g.order[:, : self.k].astype(np.int64)  # (n, k)
            weights = g.weights.copy()  # (n, k)
            if hook is not None:
                hook(layer, g.unit, ids, weights, 0)
            moe[...] = self.experts.prefill(layer, g.x, ids, weights)  # (n, d)
            prev = g
