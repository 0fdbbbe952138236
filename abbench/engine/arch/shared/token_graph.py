"""A resident decode token as one ggml graph, as llama.cpp computes a token: every layer's
graph, its routed experts as `mul_mat_id` over the complete cache's slots chosen by the
router's own top-k ids (`ExpertNodes`), the weighted sum and the output, joined across
the contexts that hold them (`token_graph`, `TokenGraph`). A graph model takes it where
nothing acts between a layer's router and its experts (`GraphFace._token_stacks`); its
bits are those of a graph per layer with the experts run between them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np

from abbench.engine.experts.in_graph import count_batch_in_graph, count_in_graph
from abbench.engine.kernels import ggml
from abbench.errors import EngineError

if TYPE_CHECKING:
    from abbench.engine.experts.runner import ExpertRunner
    from abbench.engine.kernels.qcompute import QuantTeam
    from abbench.engine.streaming.slots import SlotPool


def weighted_experts(ctx: ggml.Context, y: int, w: int, k: int, d: int, t: int = 1) -> int:
    """Tensors of `t` tokens' experts' outputs y (d, k, t) and weights w (1, k, t) → their
    weighted sums (d, t): ggml_mul, then the outputs added in routing order (each a view
    of the products, strided by a token's k outputs, as build_moe_ffn takes them)."""
    op = ctx.op
    scaled = op("mul", y, w)  # (d, k, t)
    moe = op("view_2d", scaled, d, t, d * k * 4, 0)  # (d, t)
    for j in range(1, k):
        moe = ctx.add(moe, op("view_2d", scaled, d, t, d * k * 4, j * d * 4))
    return moe


class ExpertNodes:
    """A layer's routed experts for the `t` tokens of a pass, as nodes of the pass's
    graph, as llama.cpp's build_moe_ffn runs them: `mul_mat_id` of the gate and up
    stacks, the architecture's FFN steps, `mul_mat_id` of the down stack, each output
    times its weight and added in routing order. The stacks are the complete cache's
    slots of the layer (`stack`: the pool and the layer's first slot, expert e in slot
    first + e: `ExpertRunner.layer_stack`), so the router's own expert ids choose the
    matrices and nothing leaves the graph between the router and the sum. From tensors of the
    layer's graph: its experts' input x (d, t), the top k's ids (I32, k, t: a view of
    the router's argsort) and weights (k, t) → `sum` (d, t)."""

    def __init__(self, team: QuantTeam, stack: tuple[SlotPool, int], n_expert: int,
                 layer: int, x: int, ids: int, weights: int, k: int, t: int = 1) -> None:
        pool, first = stack
        lay = pool.layout
        d, ff = lay.gate.cols, lay.gate.rows
        g = team.g
        ctx = self.ctx = ggml.Context(
            g, 48 + 4 * k, 0, 4 * k * t * (3 * ff + 4 * d) + team.ffn.graph_bytes(k * t, ff, d)
            + (1 << 12))
        op = ctx.op
        stacks = []
        for i, part in enumerate((lay.gate, lay.up, lay.down)):
            row, stride = ggml.row_bytes(part.ggml_type, part.cols), lay.stride
            stack_t = ctx.tensor(
                part.ggml_type, (part.cols, part.rows, n_expert),
                pool.part_address(i) + first * stride,
                (g.base.ggml_type_size(part.ggml_type), row, stride, stride * n_expert))
            if pool.repack[i] and not (team.repacker and team.repacker.attach(stack_t)):
                raise EngineError("a repacked expert part has no repacked kernel")
            stacks.append(stack_t)
        self.ffn = team.ffn.graph(ctx, ids)
        self.ffn.set_layer(layer)
        xt = op("reshape_3d", x, d, 1, t)  # (d, 1, t)
        gate = ctx.mul_mat_id(stacks[0], xt, ids)  # (ff, k, t)
        up = ctx.mul_mat_id(stacks[1], xt, ids)  # (ff, k, t)
        down = ctx.mul_mat_id(stacks[2], self.ffn.act(gate, up), ids)  # (d, k, t)
        w = op("reshape_3d", weights, 1, k, t)  # (1, k, t)
        self.sum = weighted_experts(ctx, self.ffn.post(down), w, k, d, t)  # (d, t)


def token_graph(model: Any, stacks: list[tuple[SlotPool, int]],
                layer: Callable[[int, Any, int | None], Any],
                output: Callable[[Any, int], Any] | None, t: int = 1,
                arenas: Sequence[ggml.Arena] = ()) -> TokenGraph:
    """A pass of `t` tokens of `model` (a graph model) as one graph: each layer's graph,
    made by `layer(i, the layer before's graph or None, its end or None)`, then its
    experts (`ExpertNodes` over `stacks[i]`), then the output's, made by `output(the last
    layer's graph, its end)` (an object with the logits' `tensor` and their numpy view
    `logits`; None: a prefill pass, which ends at the last layer's end). A layer's graph
    gives `nodes` (the experts' input x, the top k's ids and weights first),
    `write_nodes` (the cache and state writes it must run), `top` (its top k's ids (t,
    k), a view the graph fills), `end(experts)` (the end (d, t) the next layer reads)
    and `set_position`.

    arenas: where the layers' results live, in turn (layer i's in arenas[i % n], reset
    as its turn comes; `ggml.ArenaFull` where a layer's do not fit), so that a pass
    touches a few layers' memory rather than every layer's: a layer's results are read
    only by its own nodes and the next layer's, which the graph computes (in the order
    of `outputs`) before any node of the layer after; each layer's top k is copied out
    to memory of the graph's own. None given: each context's own memory."""
    layers: list[Any] = []
    parts: list[Any] = []
    outputs: list[int] = []
    tops: list[np.ndarray] = []
    keep = ggml.Context(model.team.g, 2 * len(stacks) + 1) if arenas else None
    end: int | None = None
    for i, stack in enumerate(stacks):
        with _results_in(arenas, i):
            g = layer(i, layers[-1] if layers else None, end)
            x, ids, weights = g.nodes[:3]
            e = ExpertNodes(model.team, stack, model.args.expert_count, i, x, ids, weights,
                            model.k, t)
            end = g.end(e)
        layers.append(g)
        parts += [g.ctx, e.ctx, g, e]
        outputs += [*g.write_nodes, end]  # a layer's writes before the next one's reads
        if keep is None:
            tops.append(g.top)
        else:  # out of the arena, before a later layer's results take its memory
            tops.append(np.zeros((t, model.k), np.int32))  # (t, k)
            outputs.append(keep.op("cpy", ids, keep.tensor(ggml.I32, (model.k, t),
                                                           tops[-1].ctypes.data)))
    assert end is not None
    if keep is not None:
        parts.append(keep)
    if output is None:
        return TokenGraph(model.team, parts, outputs, layers, tops, None)
    out = output(layers[-1], end)
    return TokenGraph(model.team, [*parts, out.ctx, out], [*outputs, out.tensor], layers,
                      tops, out.logits)


def _results_in(arenas: Sequence[ggml.Arena], layer: int) -> AbstractContextManager[Any]:
    """The scope layer `layer`'s contexts are made in (`token_graph`'s `arenas`)."""
    if not arenas:
        return nullcontext()
    arena = arenas[layer % len(arenas)]
    arena.reset()
    return ggml.scratch_from(arena)


class TokenGraph:
    """A pass as one graph, as llama.cpp computes a batch: every layer's nodes and the
    output's, joined across the contexts that hold them (`parts`: the contexts and the
    objects that hold them, kept alive here). `outputs` in the order the graph must
    compute them: each layer's cache writes before its attention reads the cache (they
    share no edge), the logits last."""

    def __init__(self, team: QuantTeam, parts: list[Any], outputs: list[int],
                 layers: list[Any], tops: list[np.ndarray], logits: np.ndarray | None
                 ) -> None:
        """layers: the layers' graph objects (`set_position` moves their cache writes);
        tops: each one's top k ids (t, k) I32, which the graph fills; logits (vocab,):
        the output's, likewise (None: a prefill pass's graph, which has no output)."""
        self.parts, self.layers, self.tops, self.logits = parts, layers, tops, logits
        # room for every tensor of every context: each node or leaf is one of them
        size = sum(p.n_tensors for p in parts if isinstance(p, ggml.Context))
        self.ctx = ggml.Context(team.g, 1, size + 64)
        self.graph = self.ctx.graph(outputs, team.threads_pool)

    def run(self, pos: int, experts: ExpertRunner) -> np.ndarray:
        """Compute the token at position `pos` → its logits (vocab,); the expert side
        counts each layer's routing as its short way would."""
        assert self.logits is not None
        for layer in self.layers:
            layer.set_position(pos)
        self.graph.compute()
        # one copy, one conversion: each layer's routing (k,)
        count_in_graph(experts, np.array(self.tops)[:, 0].tolist())
        return self.logits.copy()

    def run_batch(self, pos: int, experts: ExpertRunner) -> None:
        """Compute a prefill pass at positions pos..: its cache and state writes; the
        expert side counts each layer's routing as a batch's lookups would."""
        for layer in self.layers:
            layer.set_position(pos)
        self.graph.compute()
        count_batch_in_graph(experts, self.tops)
