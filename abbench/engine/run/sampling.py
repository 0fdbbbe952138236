"""Greedy and seeded temperature sampling with a repetition penalty, deterministic for a
given seed.

The repetition penalty is llama.cpp's: the logit of every token among the last `last_n`
tokens of the context (prompt included) is divided by the penalty when positive and
multiplied by it when negative, before greedy choice or sampling. 1.0 turns it off.
Banned tokens are never chosen (llama.cpp's `--ignore-eos`: a logit bias of -inf on every
end-of-generation token).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import numpy as np


class Sampler:
    def __init__(self, temp: float, seed: int, repeat_penalty: float = 1.0,
                 last_n: int = 0, banned: Iterable[int] = ()) -> None:
        self.temp = temp
        self.rng = np.random.default_rng(seed)
        self.repeat_penalty = repeat_penalty
        self.recent: deque[int] = deque(maxlen=last_n if repeat_penalty != 1.0 else 0)
        self.banned = np.fromiter(sorted(set(banned)), np.int64)  # never chosen
        self._banned_set = frozenset(self.banned.tolist())
        self._banned_in: tuple[int, np.ndarray] = (-1, self.banned)  # (vocab, those within)

    def accept(self, token: int) -> None:
        """A token entered the context (a prompt token, or one this sampler chose)."""
        if self.recent.maxlen:
            self.recent.append(token)

    def __call__(self, logits: np.ndarray) -> int:
        """logits: (vocab,) → token id. One uniform draw per token whatever the logits."""
        if self.temp <= 0.0 and not self.recent:
            # Greedy with nothing to penalise: the first largest logit, unless banned. It
            # is the first largest of the unbanned ones too (every logit before it is
            # smaller), so only a banned maximum takes the long way — which spares each
            # decode token a float64 copy of the logits.
            token = int(np.argmax(logits))
            if token not in self._banned_set:
                self.accept(token)
                return token
        owned = bool(self.recent or self.banned.size)
        if owned:
            logits = logits.astype(np.float64)  # (vocab,) a copy: the caller's stays intact
        if self.recent:
            distinct = set(self.recent)  # each penalised once, in any order (np.unique sorts)
            ids = np.fromiter(distinct, np.int64, len(distinct))
            seen = logits[ids]
            logits[ids] = np.where(seen > 0, seen / self.repeat_penalty,
                                   seen * self.repeat_penalty)
        if self.banned.size:
            if self._banned_in[0] != logits.size:  # once per vocabulary, not per token
                self._banned_in = (logits.size, self.banned[self.banned < logits.size])
            logits[self._banned_in[1]] = -np.inf
        token = self._choose(logits, owned)
        self.accept(token)
        return token

    def _choose(self, logits: np.ndarray, owned: bool = False) -> int:
        """owned: `logits` is float64 and this sampler's own copy, free to overwrite."""
        if self.temp <= 0.0:
            return int(np.argmax(logits))
        # Each step overwrites one float64 copy rather than making a temporary: this runs
        # on every decode token's path, just after a graph that left the caches cold.
        z = logits if owned else logits.astype(np.float64)
        if self.temp != 1.0:  # z / 1.0 is z
            np.divide(z, self.temp, out=z)
        np.subtract(z, z.max(), out=z)
        np.exp(z, out=z)
        cdf = np.cumsum(z, out=z)
        u = self.rng.random() * cdf[-1]
        return int(min(np.searchsorted(cdf, u, side="right"), len(cdf) - 1))
