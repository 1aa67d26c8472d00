"""A tiny randomly initialised BERT and word-level tokenizer, built offline (tests, benches, smoke runs).

Same config as transformers' own model tests (vocab 99, hidden 32, 2 layers, 4 heads,
intermediate 37): second-scale training, no download. The vocabulary is five special
tokens plus the most frequent lower-case words of the texts given (or a fixed list).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB_SIZE = 99
_WORD = re.compile(r"[a-z0-9]+")


def build_vocab(texts: Iterable[str], size: int = VOCAB_SIZE) -> list[str]:
    """Specials + the ``size - 5`` most frequent words (ties broken alphabetically)."""
    counts = Counter(w for t in texts for w in _WORD.findall(t.lower()))
    words = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    words = words[: size - len(SPECIALS)]
    filler = [f"w{i}" for i in range(size - len(SPECIALS) - len(words))]
    return SPECIALS + words + filler


def save_tiny_bert(out_dir: str | Path, texts: Iterable[str], seed: int = 0) -> Path:
    """Write a random tiny BERT (safetensors) + word-level fast tokenizer to ``out_dir``."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = build_vocab(texts)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", vocab.index("[CLS]")), ("[SEP]", vocab.index("[SEP]"))],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )
    fast.save_pretrained(str(out))
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    BertModel(config).save_pretrained(str(out), safe_serialization=True)
    return out
