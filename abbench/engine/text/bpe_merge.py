"""Merges of adjacent symbols by priority, as llama.cpp's BPE and SentencePiece sessions
run them: BPE by rank over a word's characters on raw text (its `gemma4` tokenizer: no
byte-level alphabet; `merge_word`), the adjacent pair whose merge has the lowest rank
first, the leftmost on a tie, until no adjacent pair is a merge (src/llama-vocab.cpp,
`llm_tokenizer_bpe_session::tokenize` and `llm_bigram_bpe`); SentencePiece by the merged
piece's score (`tokenizer.py`, `llm_tokenizer_spm_session`), with the same loop
(`merge_symbols`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from abbench.errors import ModelFileError


def merge_ranks(merges: Sequence[str], source: str) -> dict[tuple[str, str], int]:
    """`tokenizer.ggml.merges` as (left, right) -> rank, each entry cut at its first space
    after the first character, as llama.cpp cuts it."""
    ranks: dict[tuple[str, str], int] = {}
    for rank, m in enumerate(merges):
        cut = m.find(" ", 1)
        if cut < 0:
            raise ModelFileError(f"{source}: `tokenizer.ggml.merges` entry {rank} ({m!r}) is "
                                 "not two symbols separated by a space")
        ranks.setdefault((m[:cut], m[cut + 1:]), rank)  # llama.cpp's map keeps the first
    return ranks


def merge_word(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """`word`'s symbols after every merge, left to right."""
    return merge_symbols(word, lambda left, right: ranks.get((left, right)))


def merge_symbols(text: str, priority: Callable[[str, str], float | None]) -> list[str]:
    """`text`'s characters merged pair by pair, the adjacent pair of the lowest `priority`
    first (the leftmost on a tie), until no adjacent pair has one (None) → the symbols
    left, in order: the loop of llama.cpp's BPE and SentencePiece sessions (a heap of
    candidate pairs, each checked for staleness when it comes up)."""
    sym = list(text)  # the current symbols; "" where merged into its left neighbour
    nxt = list(range(1, len(sym))) + [-1]
    prv = list(range(-1, len(sym) - 1))
    heap: list[tuple[float, int, int, str]] = []  # (priority, left, right, merged text)

    def pair(left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        rank = priority(sym[left], sym[right])
        if rank is not None:
            heapq.heappush(heap, (rank, left, right, sym[left] + sym[right]))

    for i in range(len(sym) - 1):
        pair(i, i + 1)
    while heap:
        _, left, right, merged = heapq.heappop(heap)
        if not sym[left] or not sym[right] or sym[left] + sym[right] != merged:
            continue  # one side has merged since: a stale pair
        sym[left] = merged
        sym[right] = ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prv[nxt[right]] = left
        pair(prv[left], left)
        pair(left, nxt[left])
    return [s for s in sym if s]
