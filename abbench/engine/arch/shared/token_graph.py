"""A resident decode token as one ggml graph, as llama.cpp computes a token: every layer's
graph, its routed experts as `mul_mat_id` over the complete cache's slots chosen by the
router's own top-k ids (`ExpertNodes`), the weighted sum and the output, joined across
the contexts that hold them (`token_graph`, `TokenGraph`). A graph model takes it where
nothing acts between a layer's router and its experts (`GraphFace._token_stacks`); its
bits are those of a graph per layer with the experts run between them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from abbench.engine.experts.in_graph import count_in_graph
from abbench.engine.kernels import ggml
from abbench.errors import EngineError

if TYPE_CHECKING:
    from abbench.engine.experts.runner import ExpertRunner
    from abbench.engine.kernels.qcompute import QuantTeam
    from abbench.engine.streaming.slots import SlotPool


def weighted_experts(ctx: ggml.Context, y: int, w: int, k: int, d: int) -> int:
    """Tensors of one token's experts' outputs y (d, k) and weights w (1, k) → their
    weighted sum (d, 1): ggml_mul, then the outputs added in routing order."""
    op = ctx.op
    scaled = op("mul", y, w)  # (d, k)
    moe = op("view_2d", scaled, d, 1, d * 4, 0)  # (d, 1)
    for j in range(1, k):
        moe = ctx.add(moe, op("view_2d", scaled, d, 1, d * 4, j * d * 4))
    return moe


class ExpertNodes:
    """A decode layer's routed experts as nodes of the token's graph, as llama.cpp's
    build_moe_ffn runs them: `mul_mat_id` of the gate and up stacks, the architecture's
    FFN steps, `mul_mat_id` of the down stack, each output times its weight and added in
    routing order. The stacks are the complete cache's slots of the layer (`stack`: the
    pool and the layer's first slot, expert e in slot first + e:
    `ExpertRunner.layer_stack`), so the router's own expert ids choose the matrices and
    nothing leaves the graph between the router and the sum. From tensors of the
    layer's graph: its experts' input x (d, 1), the top k's ids (I32, k, 1: a view of
    the router's argsort) and weights (k, 1) → `sum` (d, 1)."""

    def __init__(self, team: QuantTeam, stack: tuple[SlotPool, int], n_expert: int,
                 layer: int, x: int, ids: int, weights: int, k: int) -> None:
        pool, first = stack
        lay = pool.layout
        d, ff = lay.gate.cols, lay.gate.rows
        g = team.g
        ctx = self.ctx = ggml.Context(
            g, 48 + 4 * k, 0, 4 * k * (3 * ff + 3 * d) + team.ffn.graph_bytes(k, ff, d)
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
        xt = op("reshape_3d", x, d, 1, 1)  # (d, 1, 1)
        gate = ctx.mul_mat_id(stacks[0], xt, ids)  # (ff, k, 1)
        up = ctx.mul_mat_id(stacks[1], xt, ids)  # (ff, k, 1)
        down = ctx.mul_mat_id(stacks[2], self.ffn.act(gate, up), ids)  # (d, k, 1)
        y = op("reshape_2d", self.ffn.post(down), d, k)  # (d, k)
        self.sum = weighted_experts(ctx, y, op("reshape_2d", weights, 1, k), k, d)  # (d, 1)


def token_graph(model: Any, stacks: list[tuple[SlotPool, int]],
                layer: Callable[[int, Any, int | None], Any],
                output: Callable[[Any, int], Any]) -> TokenGraph:
    """A decode token of `model` (a graph model) as one graph: each layer's graph, made
    by `layer(i, the layer before's graph or None, its end or None)`, then its experts
    (`ExpertNodes` over `stacks[i]`), then the output's, made by `output(the last layer's
    graph, its end)` (an object with the logits' `tensor` and their numpy view
    `logits`). A layer's graph gives `nodes` (the experts' input x, the top k's ids and
    weights first), `write_nodes` (the cache and state writes it must run), `routed`
    (its top k's ids (k,), a view the graph fills), `end(experts)` (the end (d, 1) the
    next layer reads) and `set_position`."""
    layers: list[Any] = []
    parts: list[Any] = []
    outputs: list[int] = []
    end: int | None = None
    for i, stack in enumerate(stacks):
        g = layer(i, layers[-1] if layers else None, end)
        x, ids, weights = g.nodes[:3]
        e = ExpertNodes(model.team, stack, model.args.expert_count, i, x, ids, weights,
                        model.k)
        end = g.end(e)
        layers.append(g)
        parts += [g, e]
        outputs += [*g.write_nodes, end]  # a layer's writes before the next one's reads
    assert end is not None
    out = output(layers[-1], end)
    return TokenGraph(model.team, [*parts, out], [*outputs, out.tensor], layers,
                      [g.routed for g in layers], out.logits)


class TokenGraph:
    """One decode token as one graph, as llama.cpp computes it: every layer's nodes and
    the output's, joined across the contexts that hold them (`parts`, kept alive here).
    `outputs` in the order the graph must compute them: each layer's cache writes before
    its attention reads the cache (they share no edge), the logits last."""

    def __init__(self, team: QuantTeam, parts: list[Any], outputs: list[int],
                 layers: list[Any], routed: list[np.ndarray], logits: np.ndarray) -> None:
        """layers: the layers' graph objects (`set_position` moves their cache writes);
        routed: each layer's top k ids (k,) I32, views the graph fills; logits (vocab,):
        the output's, likewise."""
        self.parts, self.layers, self.routed, self.logits = parts, layers, routed, logits
        self.ctx = ggml.Context(team.g, 1, 64 * 1024)
        self.graph = self.ctx.graph(outputs, team.threads_pool)

    def run(self, pos: int, experts: ExpertRunner) -> np.ndarray:
        """Compute the token at position `pos` → its logits (vocab,); the expert side
        counts each layer's routing as its short way would."""
        for layer in self.layers:
            layer.set_position(pos)
        self.graph.compute()
        count_in_graph(experts, np.array(self.routed).tolist())  # one copy, one conversion
        return self.logits.copy()
