"""The experts computed in the file's own types, by ggml's CPU kernels.

The numpy engine computes in F32: every quantized weight would be dequantized into a copy
7x (Q4_K) or 3.8x (Q8_0) its size. Here the weights stay as the file stores them, and the
GEMVs are ggml's own fused dequantize-and-dot kernels (`ggml/`), with the input
quantized per block as llama.cpp's CPU backend quantizes it (Q8_K for the K-quants, Q8_0
for Q8_0 and Q4_0), so a result is llama.cpp's. Why ggml and not numba or numpy:
docs/engine.md ("Kernels"), with the measurements.

An MoE layer's experts are llama.cpp's graph for them (`build_moe_ffn`): `mul_mat_id` of
the gate and of the up stack, the architecture's activation, `mul_mat_id` of the down
stack, then what its FFN does after the down product (`arch.common.ExpertFFN`: SwiGLU for
qwen3moe, nothing after), over the cache's slots (`slots.py`: the ids the products are
given are slot indices; beside them each row's expert id in its layer, for what an FFN
holds per expert). A graph is built once for its shapes and run again with new inputs: its
tensors point at buffers owned here, which each call fills (x, ids, expert ids) and reads
(y). The routing weights and the weighted sum of the experts' outputs are finished in
numpy in llama.cpp's arithmetic (`routing`, `weighted_sum`). The dense part of a layer is
llama.cpp's graph too (`arch/shared/plain_graph.py`), built from `QuantTeam.matrix`.

`QuantTeam` has the compute team's interface (`run`, `input`, `close`, ...), so the
expert runner uses it as it uses `ComputeTeam`; ggml's own threads split each GEMV
(`--threads`), in place of the team's threads and the partner process.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from abbench.engine.kernels import ggml
from abbench.engine.kernels.compute import SWIGLU, Job, matmul_t, matvec, private_vectors
from abbench.engine.streaming.slots import RawSlot, SlotPool
from abbench.engine.streaming.streamer import BufferArena, ExpertBuffer
from abbench.errors import EngineError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from abbench.engine.gguf.model_file import ModelFile
    from abbench.engine.kernels.expert_ffn import ExpertFFN


@dataclass(frozen=True)
class Weight:
    """A dense matrix for ggml: its type, numpy shape, bytes, and whether they are laid
    out for the repacked kernels (`QuantTeam.matrix`)."""

    ggml_type: int
    rows: int
    cols: int
    raw: np.ndarray  # (rows, row bytes) uint8
    repacked: bool

    def tensor(self, ctx: ggml.Context, repacker: ggml.Repacker | None) -> int:
        """This matrix as a tensor of `ctx` (ggml's ne: cols, rows)."""
        t = ctx.tensor(self.ggml_type, (self.cols, self.rows), self.raw.ctypes.data)
        if self.repacked and not (repacker and repacker.attach(t)):
            raise EngineError("a repacked matrix has no repacked kernel")
        return t


WEIGHT_SUM_MIN = 6.103515625e-5  # llama.cpp's clamp of the routing weights' sum


def routing(probs: np.ndarray, order: np.ndarray, k: int,
            renormalise: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The top-k experts and their weights from a router's softmax over every expert
    (probs, (n_expert,)) and its ranking (order, highest first), as llama.cpp's
    `build_moe_ffn` takes them: the k probabilities, `renormalise`d to sum 1 (their sum in
    double, rounded once to F32 as ggml's sum_rows does, clamped). A weight one rounding
    apart is a different sum, which the next quantized GEMV can turn into another token.
    → ids (k,), weights (k,)."""
    ids = order[:k].astype(np.int64)  # (k,)
    w = probs[ids]  # (k,)
    if not renormalise:
        return ids, w
    total = np.float32(max(float(np.add.reduce(w, dtype=np.float64)), WEIGHT_SUM_MIN))
    return ids, w / total


def weighted_sum(w: np.ndarray, y: np.ndarray) -> np.ndarray:
    """w (k,), y (k, d) → (d,): each output times its weight, then added in routing order
    — llama.cpp's `ggml_mul` and chain of `ggml_add`, so the same bits (a dot product
    rounds in another order)."""
    p = y * w[:, None]  # (k, d)
    out = p[0].copy()
    for row in p[1:]:
        out += row
    return out


class ExpertGraph:
    """`n_used` experts of one slot pool for each of `n_tokens` inputs: llama.cpp's MoE
    graph with the team's expert FFN. Fill `x` (n_tokens, d), `ids` (n_tokens, n_used:
    slot indices) and, for an FFN that reads them (`by_expert`), `eids` (the same rows'
    expert ids) and `set_layer`; compute; read `y` (n_tokens, n_used, d)."""

    def __init__(self, team: QuantTeam, pool: SlotPool, n_used: int, n_tokens: int) -> None:
        lay = pool.layout
        gate, up, down = lay.gate, lay.up, lay.down
        d, ff = gate.cols, gate.rows
        if up.rows != ff or up.cols != d or down.rows != d or down.cols != ff:
            raise EngineError("an expert's gate, up and down do not fit together")
        t, n = n_tokens, n_used
        self.x = np.zeros((t, d), np.float32)  # ggml (d, 1, t)
        self.ids = np.zeros((t, n), np.int32)  # ggml (n, t)
        self.eids = np.zeros((t, n), np.int32)  # ggml (n, t)
        self._gate = np.zeros((t, n, ff), np.float32)  # ggml (ff, n, t) each
        self._up = np.zeros((t, n, ff), np.float32)
        self._down = np.zeros((t, n, d), np.float32)  # ggml (d, n, t)
        g = team.g
        self.ctx = ctx = ggml.Context(g, 32, 64, team.ffn.graph_bytes(t * n, ff, d))
        stacks = []
        for i, part in enumerate((gate, up, down)):
            row = ggml.row_bytes(part.ggml_type, part.cols)
            stride = lay.stride
            stack = ctx.tensor(
                part.ggml_type, (part.cols, part.rows, pool.capacity), pool.part_address(i),
                (g.base.ggml_type_size(part.ggml_type), row, stride, stride * pool.capacity))
            if pool.repack[i] and not (team.repacker and team.repacker.attach(stack)):
                raise EngineError("a repacked expert part has no repacked kernel")
            stacks.append(stack)
        xt = ctx.tensor(ggml.F32, (d, 1, t), self.x.ctypes.data)
        it = ctx.tensor(ggml.I32, (n, t), self.ids.ctypes.data)
        self.ffn = team.ffn.graph(ctx, ctx.tensor(ggml.I32, (n, t), self.eids.ctypes.data))
        gt = ctx.mul_mat_id(stacks[0], xt, it, self._gate.ctypes.data)  # (ff, n, t)
        ut = ctx.mul_mat_id(stacks[1], xt, it, self._up.ctypes.data)  # (ff, n, t)
        at = self.ffn.act(gt, ut)  # (ff, n, t)
        dt = ctx.mul_mat_id(stacks[2], at, it, self._down.ctypes.data)  # (d, n, t)
        yt = self.ffn.post(dt)  # (d, n, t)
        self.y = self._down  # (t, n, d) the outputs, in memory that lives as long as `y`
        if yt != dt:  # a post step: its result moves out of the context's scratch to `y`
            self.y = np.zeros((t, n, d), np.float32)
            ctx.set_data(yt, self.y.ctypes.data)
        self.graph = ctx.graph([yt], team.threads_pool)

    def set_layer(self, layer: int) -> None:
        """The layer whose per-expert tensors the FFN's steps read (one graph serves every
        layer of its pool)."""
        self.ffn.set_layer(layer)

    def compute(self) -> None:
        self.graph.compute()


class QuantTeam:
    """The compute team when experts are computed in the file's types: ggml with
    `threads` threads, the caller being one of them. It also loads the dense matrices the
    graph model multiplies (`matrix`) and re-lays resident weights (`repack_pool`)."""

    def __init__(self, threads: int, repack: bool = False, ffn: ExpertFFN = SWIGLU,
                 relay: bool = True) -> None:
        """repack: lay resident weights out for ggml's repacked kernels where this CPU
        has them (`ggml.Repacker`; llama.cpp's default). ffn: the architecture's expert
        FFN, whose steps every expert graph takes. relay: with repack, streamed experts
        too, as the reader lanes read them (`relay_part`); else those stay as the file
        has them."""
        self.g = ggml.lib()
        self.ffn = ffn
        self.relay = repack and relay
        self.threads = max(1, threads)
        self.threads_pool = ggml.Threads(self.g, self.threads)
        self.repacker = ggml.Repacker(self.g) if repack else None
        self._lane = threading.local()  # per thread: its own headers (`relay_part`)
        self.input = private_vectors()
        self._graphs: dict[tuple[SlotPool, int], ExpertGraph] = {}
        self._arena = BufferArena()  # pinned dense matrices' bytes

    def experts(self, pool: SlotPool, n_used: int) -> ExpertGraph:
        """The decode graph of `n_used` experts of `pool`, built once."""
        graph = self._graphs.get((pool, n_used))
        if graph is None:
            graph = self._graphs[(pool, n_used)] = ExpertGraph(self, pool, n_used, 1)
        return graph

    def run(self, jobs: list[Job], x: np.ndarray, out: np.ndarray, layer: int = 0) -> float:
        """Compute every job of `layer` into `out[slot]` (x: (d,), out: (k, d)); returns
        stall seconds. Resident experts run first, in one graph, with those whose reads
        have landed; then the caller waits for the first still being read (that wait is
        the stall, ggml's threads are idle then too) and runs it with every other landed
        by then, and so on. An expert's output does not depend on what runs beside it."""
        def landed(j: Job) -> bool:
            return j.ticket is None or j.ticket.event.is_set()

        stall = 0.0
        while jobs:
            if not any(landed(j) for j in jobs):
                w0 = time.perf_counter()
                jobs[0].ticket.event.wait()  # type: ignore[union-attr]
                stall += time.perf_counter() - w0
            ready: list[Job] = []
            rest: list[Job] = []
            for j in jobs:  # one look each: a read may land meanwhile
                (ready if landed(j) else rest).append(j)
            jobs = rest
            for j in ready:
                if j.ticket is not None:
                    j.ticket.wait()  # raises if the read failed
            self._compute(ready, x, out, layer)
        return stall

    def _compute(self, jobs: list[Job], x: np.ndarray, out: np.ndarray, layer: int) -> None:
        pool = jobs[0].buffer.kind
        graph = self.experts(pool, len(jobs))  # type: ignore[arg-type]
        graph.ids[0] = [j.buffer.index for j in jobs]  # type: ignore[union-attr]
        if self.ffn.by_expert:
            graph.eids[0] = [j.expert for j in jobs]
            graph.set_layer(layer)
        np.copyto(graph.x[0], x)
        graph.compute()
        out[[j.slot for j in jobs]] = graph.y[0]

    def run_resident(self, bufs: list[ExpertBuffer], x: np.ndarray,
                     experts: Sequence[int] = (), layer: int = 0) -> np.ndarray:
        """`run` of resident experts in routing order (experts: their ids), without the
        jobs: x (d,) → (k, d), the decode graph's own output, valid until the next call.
        The same graph and inputs as `_compute`'s, so the same bits."""
        graph = self.experts(bufs[0].kind, len(bufs))  # type: ignore[arg-type]
        graph.ids[0] = [b.index for b in bufs]  # type: ignore[misc]
        if self.ffn.by_expert:
            graph.eids[0] = experts
            graph.set_layer(layer)
        np.copyto(graph.x[0], x)
        graph.compute()
        return graph.y[0]

    def rows(self, pool: SlotPool, x: np.ndarray, ids: np.ndarray,
             eids: np.ndarray | None = None, layer: int = 0) -> np.ndarray:
        """A prefill batch's experts of `layer`: x (n, d), ids (n, k) slot indices, eids
        (n, k) their expert ids (read where the FFN is `by_expert`) → (n, k, d). Its graph
        is built for the call and let go (a batch's shape rarely comes again, and its
        buffers are the batch's size)."""
        n, k = ids.shape
        graph = ExpertGraph(self, pool, k, n)
        np.copyto(graph.x, x)
        np.copyto(graph.ids, ids)
        if self.ffn.by_expert:
            if eids is None:
                raise EngineError("this expert FFN needs the rows' expert ids")
            np.copyto(graph.eids, eids)
            graph.set_layer(layer)
        graph.compute()
        return graph.y

    # The F32 team's GEMVs, for what a model multiplies in numpy.
    matvec = staticmethod(matvec)
    matmul_t = staticmethod(matmul_t)

    # -- repacked weights -------------------------------------------------------------

    def repack_pool(self, pool: SlotPool) -> None:
        """Hold `pool`'s slots re-laid for the repacked kernels, part by part where this
        CPU has a layout for the part's type and shape (lanes write them with `relay_part`,
        the pre-laid copy's writer with `repack_slot`)."""
        if self.repacker is not None:
            _, heads = self._part_heads(pool)
            pool.repack = tuple(h is not None for h in heads)  # type: ignore[assignment]

    def repack_slot(self, slot: RawSlot) -> None:
        """Re-lay a slot read as the file has it, in place (the parts its pool re-lays),
        each from a copy: a part cannot be laid into its own memory."""
        lay = slot.kind.layout
        for i, (part, offset) in enumerate(zip((lay.gate, lay.up, lay.down), lay.offsets)):
            if slot.kind.repack[i]:
                self.relay_part(slot, i, slot.data[offset : offset + part.nbytes].copy())

    def relay_part(self, slot: RawSlot, part: int, src: np.ndarray) -> bool:
        """Lay part `part` (0 gate, 1 up, 2 down) of `slot` from `src`, its bytes as the
        file has them, on the calling thread → whether its pool re-lays that part (else
        nothing is written). Reader lanes call it as a read lands: ggml's repack runs
        without the GIL, each thread on tensor headers of its own, and the compute thread
        neither waits for it nor copies the part first (`repack_slot` copies)."""
        pool = slot.kind
        if self.repacker is None or not pool.repack[part]:
            return False
        heads: dict[SlotPool, tuple[ggml.Context, list[int | None]]] = \
            self._lane.__dict__.setdefault("heads", {})
        if pool not in heads:
            heads[pool] = self._part_heads(pool)
        ctx, ts = heads[pool]
        head = ts[part]
        if head is None:
            raise EngineError("ggml refused a layout it gave this pool")
        ctx.set_data(head, slot.data[pool.layout.offsets[part]:].ctypes.data)
        self.repacker.write(head, src.ctypes.data)
        return True

    def _part_heads(self, pool: SlotPool) -> tuple[ggml.Context, list[int | None]]:
        """Tensor headers of `pool`'s three parts, each marked repacked where this CPU has
        a layout for it (else None); their data pointed at a slot as it is laid."""
        assert self.repacker is not None
        ctx = ggml.Context(self.g, 3)
        heads: list[int | None] = []
        for i, part in enumerate((pool.layout.gate, pool.layout.up, pool.layout.down)):
            t = ctx.tensor(part.ggml_type, (part.cols, part.rows), pool.part_address(i))
            heads.append(t if self.repacker.attach(t) else None)
        return ctx, heads

    def matrix(self, mf: ModelFile, name: str, pinned: bool) -> Weight:
        """A dense matrix as the file stores it, or re-laid for the repacked kernels (when
        repacking, pinned and its type has a layout here). pinned: read into huge-page
        arena memory (as pinned F32 matrices are); else a view of the file's mapping."""
        info = mf.tensor(name)
        if len(info.shape) != 2:
            raise EngineError(f"`{info.name}` is not a matrix")
        rows, cols = info.shape
        gtype = int(info.ggml_type)
        if not pinned:
            return Weight(gtype, rows, cols, mf.mapped(info.name).reshape(rows, -1), False)
        mm, offset = self._arena.take(info.nbytes)
        raw = np.frombuffer(mm, np.uint8, info.nbytes, offset)
        repacked = False
        if self.repacker is not None:
            ctx = ggml.Context(self.g, 1)
            head = ctx.tensor(gtype, (cols, rows), raw.ctypes.data)
            if self.repacker.attach(head):
                plain = mf.read_raw(info.name)  # held while ggml reads it
                self.repacker.write(head, plain.ctypes.data)
                repacked = True
        if not repacked:
            mf.read_raw(info.name, raw)
        return Weight(gtype, rows, cols, raw.reshape(rows, -1), repacked)

    def close(self) -> None:
        self._graphs.clear()
        self.threads_pool.close()

