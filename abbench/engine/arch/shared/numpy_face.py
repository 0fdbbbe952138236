"""What every numpy model (`<arch>.Model`) sets alike (its own module: it imports
`compute`, which imports `common`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from abbench.engine.arch.shared.common import RoutingHook
from abbench.engine.kernels.compute import MatMulT, MatVec, matmul_t, matvec, private_vectors

if TYPE_CHECKING:
    from abbench.engine.experts.runner import ExpertRunner
    from abbench.engine.gguf.model_file import ModelFile


class NumpyFace:
    """What every numpy model (`<arch>.Model`) sets alike: its args, expert side and
    experts a token takes, the RMS epsilon, the F32 token embedding (vocab, d), and what
    the session may set on it."""

    LAYER: Callable[..., Any]  # (mf, args, layer, n_ctx, experts, k) -> the layer

    def __init__(self, mf: ModelFile, args: Any, experts: ExpertRunner, pinned: bool,
                 n_ctx: int, n_expert_used: int | None = None) -> None:
        """The model: `_init_model` with the architecture's `_layer`, then its
        `_init_positions` (the rotary tables, or whatever else a position needs)."""
        self._init_model(mf, args, experts, pinned, n_expert_used,
                         lambda i: self._layer(mf, i, n_ctx))
        self._init_positions(mf, n_ctx)

    def _layer(self, mf: ModelFile, layer: int, n_ctx: int) -> Any:
        """Layer `layer`'s weights and state: the architecture's `LAYER`."""
        return self.LAYER(mf, self.args, layer, n_ctx, self.experts, self.k)

    def _init_positions(self, mf: ModelFile, n_ctx: int) -> None:
        """What a position needs, for `n_ctx` of them."""
        raise NotImplementedError

    def _init_face(self, mf: ModelFile, args: Any, experts: ExpertRunner, pinned: bool,
                   n_expert_used: int | None) -> None:
        self.args, self.experts = args, experts
        self.k = n_expert_used or args.expert_used_count
        self.eps = args.layer_norm_rms_epsilon
        self.token_embd = mf.read_dense("token_embd.weight", pinned)  # (vocab, d)
        self.routing_hook: RoutingHook | None = None
        self.matvec: MatVec = matvec  # the session may hand the large GEMVs to a partner
        self.matmul_t: MatMulT = matmul_t  # and a prefill batch's dense GEMMs
        # and give the GEMVs' inputs a place (`Partner.input`: its shared block)
        self.vector: Callable[[int], np.ndarray] = private_vectors()

    def _init_model(self, mf: ModelFile, args: Any, experts: ExpertRunner, pinned: bool,
                    n_expert_used: int | None, layer: Callable[[int], Any]) -> None:
        """`_init_face`, then every layer (`layer(i)`, which may read `self.k`), the output
        norm and the output matrix (vocab, d): the file's own, or the token embedding where
        the file ties them."""
        self._init_face(mf, args, experts, pinned, n_expert_used)
        self.layers = [layer(i) for i in range(args.block_count)]
        self.output_norm = mf.read_dense("output_norm.weight", True)  # (d,)
        self.output = (mf.read_dense("output.weight", pinned) if "output.weight" in mf.tensors
                       else self.token_embd)  # (vocab, d)
