"""The graph models' attended lengths and masks: llama.cpp's n_kv (a multiple of 256
cells), the causal mask of a pass, and the masks of a model with sliding layers' rings
(gpt-oss, gemma4), with their F16 twins for flash attention."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from abbench.engine.arch.shared.common import KV_PAD, pad


def attended(end: int, cells: int) -> int:
    """llama.cpp's n_kv for a cache of `cells` cells once positions below `end` are in it:
    the cells used, at least 256, in blocks of 256, within the cache."""
    return min(cells, max(KV_PAD, pad(end)))


def causal_mask(mask: np.ndarray, pos: int) -> None:
    """Fill `mask` (t, n_kv) for a pass at positions pos..: 0 where a token sees a cache
    position (its own and those before it), else -inf."""
    mask.fill(-np.inf)
    for i in range(mask.shape[0]):
        mask[i, : pos + i + 1] = 0.0


class SlidingMasks:
    """The masks of a model with full caches and sliding layers' rings of `swa_size`
    cells (gpt-oss, gemma4; the model's `sliding`): a buffer per cache kind, pass size and
    attended length, filled per pass (`place`), and their F16 twins (flash attention) in
    the model's `half` (`GraphFace.mask_tensor`), refreshed by its `refresh_half`."""

    def __init__(self, swa_size: int, window: int,
                 half: dict[int, tuple[np.ndarray, np.ndarray]],
                 refresh_half: Callable[[int], None]) -> None:
        self.swa_size = swa_size
        self.window = window  # a key p0 is hidden from p1 once p1 - p0 >= window
        self._half, self._refresh_half = half, refresh_half
        # the position each ring cell holds (-1: empty), one for every sliding layer
        self.swa_pos = np.full(swa_size, -1, np.int64)  # (swa_size,)
        self._masks: dict[tuple[bool, int, int], np.ndarray] = {}
        # the last pass, where it was one decode step: its position and attended cells
        self._decoded: tuple[int, tuple[int, int]] | None = None

    def mask(self, swa: bool, t: int, n_kv: int) -> np.ndarray:
        """(t, n_kv) a cache's mask buffer (0 where a token sees a cell, else -inf), filled
        per pass by `place`."""
        return self._masks.setdefault((swa, t, n_kv), np.zeros((t, n_kv), np.float32))

    def place(self, positions: np.ndarray, n_kv: tuple[int, int]) -> None:
        """A pass at `positions` (t,) into the ring's cells, and both caches' masks for
        it (attending over n_kv (full, sliding) cells) with their F16 twins: stepped from
        the decode step before, or filled and the twins copied from them."""
        t, pos = len(positions), int(positions[0])
        if t == 1:  # decode, on every token's path: one cell, no temporaries
            self.swa_pos[pos % self.swa_size] = pos
        else:
            self.swa_pos[positions % self.swa_size] = positions
        if t == 1 and self._decoded == (pos - 1, n_kv):
            self._step_masks(pos, n_kv)
        else:
            self._fill_masks(positions, n_kv)
            self._refresh_half(t)
        self._decoded = (pos, n_kv) if t == 1 else None

    def _fill_masks(self, positions: np.ndarray, n_kv: tuple[int, int]) -> None:
        """Both caches' masks for queries at `positions` (t,): causal over the full
        cache's cells; over the ring's, llama.cpp's is_masked_swa too (a key p0 is hidden
        from p1 once p1 - p0 >= window) and empty cells hidden."""
        t = len(positions)
        p1 = positions[:, None].astype(np.int64)  # (t, 1) each query's position
        full = self.mask(False, t, n_kv[0])
        full[...] = np.where(np.arange(n_kv[0])[None, :] <= p1, 0.0, -np.inf)
        p0 = self.swa_pos[None, : n_kv[1]]  # (1, n_kv_swa)
        hidden = (p0 < 0) | (p0 > p1) | (p1 - p0 >= self.window)
        self.mask(True, t, n_kv[1])[...] = np.where(hidden, -np.inf, 0.0)

    def _step_masks(self, pos: int, n_kv: tuple[int, int]) -> None:
        """The decode masks of position pos-1 moved on to pos (what `_fill_masks` would
        write, in three cells rather than every cell): the full cache sees cell pos, the
        ring its cell of pos and no longer that of pos - window. Their F16 twins (flash
        attention) take the same cells: 0 and -inf are exact in F16."""
        full, ring = self.mask(False, 1, n_kv[0]), self.mask(True, 1, n_kv[1])
        cells = [(full, pos, 0.0), (ring, pos % self.swa_size, 0.0)]
        if pos >= self.window:
            cells.append((ring, (pos - self.window) % self.swa_size, -np.inf))
        for mask, cell, value in cells:
            mask[0, cell] = value
            twin = self._half.get(id(mask))
            if twin is not None:
                twin[1][0, cell] = value
