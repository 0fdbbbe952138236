"""The softmax-routed sparse MoE block the numpy models share: router → softmax → top-k →
(renormalised) weights → drop policy → load → experts → weighted sum."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from abbench.engine.arch.shared.common import RoutingHook
from abbench.engine.kernels.compute import MatVec, matvec
from abbench.engine.streaming.streamer import BufferArena, arena_copy

if TYPE_CHECKING:
    from abbench.engine.experts.runner import ExpertRunner
    from abbench.engine.gguf.model_file import ModelFile

_sum = np.add.reduce
_sub = np.subtract


class SparseMoE:
    """Router → softmax → top-k → (renormalise) → drop policy → load → experts → weighted
    sum.

    The experts are the `ExpertRunner` shared by every layer (one cache over all of them).
    """

    def __init__(self, mf: ModelFile, layer: int, arena: BufferArena | None,
                 experts: ExpertRunner, k: int, renormalise: bool = True) -> None:
        """`renormalise`: the top-k weights sum to 1 (llama.cpp's `norm_w`); else each is
        its softmax weight over every expert."""
        self.layer = layer
        self.k = k
        self.renormalise = renormalise
        router = mf.read_dense(f"blk.{layer}.ffn_gate_inp.weight", arena is not None)
        self.router = router if arena is None else arena_copy(arena, router)  # (n_expert, d)
        self.experts = experts
        # (2 n_expert, d): this router over the next layer's, once a stale-gate predictor
        # is installed (`Model.fuse_next_routers`): the next layer's router multiplies the
        # very vector this one does, so one GEMV gives both and one sort ranks both. Row
        # for row the same dot products, so the routing is bit-identical either way
        # (tested); `router` is then a view of the first half, so the unfused path and a
        # predictor's control read the very bytes this GEMV just read.
        self.router_and_next: np.ndarray | None = None

    def route(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x: (d,) → the top-k expert ids and their weights, highest first. One GEMV on the
        caller: split with the partner it measured no faster (the hand-over costs what
        half of it saves)."""
        return self.top_k(self.router @ x)  # (n_expert,)

    def top_k(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """logits: (n_expert,) → the top-k ids and their weights."""
        # Top-k by logit (softmax is monotonic); ties resolve to the lower expert id.
        # (The array's own argsort and add.reduce: np.argsort and .sum() go through Python
        # wrappers, a cost on every decode layer's path; 0 - x rather than -x, as the
        # subtraction below is needed anyway: see `rms_norm` on distinct functions.)
        ids = _sub(0.0, logits).argsort(kind="stable")[: self.k]  # (k,)
        # softmax over all experts, then renormalised over the top-k, is the softmax of
        # the top-k logits alone; without renormalising, its denominator is every expert's.
        top = logits[ids]  # (k,)
        w = np.exp(top - top[0])  # (k,)
        w /= _sum(w) if self.renormalise else _sum(np.exp(logits - top[0]))
        return ids, w  # (k,), (k,)

    def __call__(self, x: np.ndarray, phase: int, hook: RoutingHook | None,
                 matvec: MatVec = matvec) -> np.ndarray:
        """x: (d,) the normalised hidden state → (d,) the layer's MoE output. The fused
        router GEMV goes through `matvec`: with a partner, this layer's half of the rows
        on the caller and the next layer's on the partner, side by side."""
        if hook is not None and phase == 1 and self.router_and_next is not None:
            both = matvec(self.router_and_next, x)  # (2 n_expert,): this layer's, the next's
            # (2, k): both top-ks as `top_k` ranks them (ties to the lower id)
            order = _sub(0.0, both.reshape(2, -1)).argsort(axis=1, kind="stable")[:, : self.k]
            ids = order[0]
            top = both[ids]  # (k,)
            weights = np.exp(top - top[0])  # (k,): as `top_k` computes them
            weights /= (_sum(weights) if self.renormalise
                        else _sum(np.exp(both[: self.router.shape[0]] - top[0])))
            hook(self.layer, x, ids, weights, phase, order[1], both[self.router.shape[0]:])
        else:
            ids, weights = self.top_k(self.router @ x)  # (k,), (k,): `route`, one call less
            if hook is not None:  # predictors see the router's choice, before any drop
                hook(self.layer, x, ids, weights, phase)
        # the drop policy, then cache/reads → SwiGLU: (k',) kept weights, (k', d) outputs
        kept, y = self.experts.run_routed(self.layer, x, ids, weights, phase)
        return kept @ y  # (k',) @ (k', d) → (d,)

    def prefill(self, x: np.ndarray, hook: RoutingHook | None) -> np.ndarray:
        """x: (n, d) a batch of prompt tokens' normalised hidden states → (n, d)."""
        logits = x @ self.router.T  # (n, n_expert)
        ids = np.argsort(-logits, axis=1, kind="stable")[:, : self.k]  # (n, k)
        top = np.take_along_axis(logits, ids, axis=1)  # (n, k)
        w = np.exp(top - top[:, :1])  # (n, k)
        every = w if self.renormalise else np.exp(logits - top[:, :1])  # (n, k | n_expert)
        w /= every.sum(axis=1, keepdims=True)
        if hook is not None:
            hook(self.layer, x, ids, w, 0)  # the batch's routings: (n, d), (n, k), (n, k)
        return self.experts.prefill(self.layer, x, ids, w)  # (n, d)
