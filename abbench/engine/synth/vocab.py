"""A synthetic model's vocabulary and its `tokenizer.ggml.*` keys: a byte-fallback
SentencePiece-style vocabulary (`<unk>`, `<s>`, `</s>`, then `<0x00>`..`<0xFF>`), or a
byte-level BPE vocabulary of BPE_VOCAB_SIZE tokens trained (Hugging Face `tokenizers`,
deterministic) on the text the package ships in `data/bpe-corpus.txt`: with Qwen's special
tokens and `qwen2` pre-tokenizer ("gpt2"), or with gpt-oss's harmony special tokens and its
`gpt-4o` pre-tokenizer ("gpt-4o", split by llama.cpp's regex for it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf

VOCAB_SPECIAL = ["<unk>", "<s>", "</s>"]
BPE_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # Qwen's names; 0 is BOS/EOS
# gpt-oss's harmony tokens (llama.cpp gives them their attributes by text): BOS is
# <|endoftext|>, EOS <|return|>, as the gpt-oss design has them
GPT4O_SPECIAL = ["<|endoftext|>", "<|start|>", "<|message|>", "<|channel|>", "<|end|>",
                 "<|return|>", "<|call|>"]
GPT4O_BOS_ID, GPT4O_EOS_ID = 0, GPT4O_SPECIAL.index("<|return|>")
# gemma4's (its ids as in Gemma's files: 0 pad, 1 EOS, 2 BOS, 3 unknown; its turn markers)
GEMMA4_SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"]
GEMMA4_BOS_ID, GEMMA4_EOS_ID = 2, 1
BPE_VOCAB_SIZE = 512
BPE_CORPUS = Path(__file__).with_name("data") / "bpe-corpus.txt"
N_VOCAB = len(VOCAB_SPECIAL) + 256  # the SentencePiece vocabulary's size
BOS_ID, EOS_ID, UNK_ID = 1, 2, 0


@dataclass(frozen=True)
class SynthVocab:
    model: str  # tokenizer.ggml.model
    tokens: list[str]
    types: list[gguf.TokenType]
    merges: list[str]  # BPE only
    pre: str = "default"  # tokenizer.ggml.pre
    bos: int = BOS_ID
    eos: int = EOS_ID


def vocab_of(kind: str) -> SynthVocab:
    """The vocabulary of tokenizer `kind` ("llama", "gpt2" or "gpt-4o")."""
    if kind == "llama":
        tokens = VOCAB_SPECIAL + [f"<0x{b:02X}>" for b in range(256)]
        types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
        return SynthVocab("llama", tokens, types + [gguf.TokenType.BYTE] * 256, [])
    if kind == "gpt-4o":
        return _bpe_vocab(GPT4O_SPECIAL, "gpt-4o", GPT4O_BOS_ID, GPT4O_EOS_ID)
    if kind == "gemma4":
        return _gemma4_vocab()
    if kind == "qwen35":  # Qwen3.5's pre-tokenizer: qwen2's with combining marks in words
        return _bpe_vocab(BPE_SPECIAL, "qwen35", 0, 0)
    return _bpe_vocab(BPE_SPECIAL, "qwen2", 0, 0)  # as Qwen's files: BOS = EOS


def _bpe_vocab(special: list[str], pre: str, bos: int, eos: int) -> SynthVocab:
    """A byte-level BPE vocabulary trained on the shipped corpus, its words cut by
    pre-tokenizer `pre` as llama.cpp cuts them: the special tokens, the 256 characters of
    the byte alphabet, then one token per merge, in merge order."""
    import json

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    from abbench.engine.text.tokenizer import PRE_TOKENIZERS

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZERS[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB_SIZE, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator([BPE_CORPUS.read_text(encoding="utf-8")], trainer=trainer)
    model = json.loads(tk.to_str())["model"]
    by_id = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise AssertionError("the trained BPE vocabulary's ids are not 0..n-1")
    tokens = [t for t, _ in by_id]
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL
             for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return SynthVocab("gpt2", tokens, types, merges, pre, bos, eos)


def _gemma4_vocab() -> SynthVocab:
    """gemma4's BPE on raw text (spaces as "▁", cut only at newlines, as llama.cpp's
    `gemma4` pre-tokenizer), trained on the shipped corpus: the special tokens, the 256
    byte tokens `<0x00>`..`<0xFF>` (its byte fallback), the corpus's characters, then one
    token per merge."""
    import json

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    n_fixed = len(GEMMA4_SPECIAL) + 256
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|\n+"), behavior="isolated")
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB_SIZE - n_fixed, show_progress=False)
    text = BPE_CORPUS.read_text(encoding="utf-8").replace(" ", "\u2581")
    tk.train_from_iterator([text], trainer=trainer)
    model = json.loads(tk.to_str())["model"]
    learned = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    tokens = GEMMA4_SPECIAL + [f"<0x{b:02X}>" for b in range(256)] + learned
    types = ([gguf.TokenType.CONTROL] * len(GEMMA4_SPECIAL) + [gguf.TokenType.BYTE] * 256
             + [gguf.TokenType.NORMAL] * len(learned))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return SynthVocab("gemma4", tokens, types, merges, "gemma4", GEMMA4_BOS_ID,
                      GEMMA4_EOS_ID)


def add_vocab(w: gguf.GGUFWriter, vocab: SynthVocab) -> None:
    """The vocabulary's `tokenizer.ggml.*` keys, in the order files have always had them."""
    w.add_tokenizer_model(vocab.model)
    w.add_token_list(vocab.tokens)
    w.add_token_types([int(t) for t in vocab.types])
    if vocab.model == "gemma4":  # as Gemma's files: BOS added, no space prefix
        w.add_tokenizer_pre(vocab.pre)
        w.add_token_merges(vocab.merges)
        w.add_token_scores([0.0] * len(vocab.tokens))
        w.add_bos_token_id(vocab.bos)
        w.add_eos_token_id(vocab.eos)
        w.add_unk_token_id(GEMMA4_SPECIAL.index("<unk>"))
        w.add_pad_token_id(GEMMA4_SPECIAL.index("<pad>"))
        w.add_add_bos_token(True)
        w.add_add_space_prefix(False)
        return
    if vocab.model == "gpt2":  # as Qwen's and gpt-oss's files: no BOS added
        w.add_tokenizer_pre(vocab.pre)
        w.add_token_merges(vocab.merges)
        w.add_bos_token_id(vocab.bos)
        w.add_eos_token_id(vocab.eos)
        w.add_add_bos_token(False)
        return
    w.add_tokenizer_pre("default")
    w.add_token_scores([0.0] * len(vocab.tokens))
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
