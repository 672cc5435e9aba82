"""A small fixed token-type taxonomy, computed once per vocabulary."""

from __future__ import annotations

import numpy as np
from transformers import PreTrainedTokenizerBase

from treewise.decoder.records.nodelog import TOKEN_TYPES

_PUNCT = set(".,;:!?'\"-")


def classify(text: str, special: bool = False) -> str:
    """Token type of one decoded token string."""
    if special:
        return "special"
    stripped = text.strip()
    if not stripped:
        return "whitespace"
    first = stripped[0]
    if first.isdigit():
        return "digit"
    if first.isalpha():
        # A leading space marks the start of a word in byte-level BPE vocabularies.
        return "word_start" if text[0].isspace() else "word_cont"
    if first in _PUNCT:
        return "punct"
    return "code_symbol"


def token_type_table(tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> np.ndarray:
    """[vocab_size] int8 index into TOKEN_TYPES for every token id."""
    index = {name: i for i, name in enumerate(TOKEN_TYPES)}
    special = set(tokenizer.all_special_ids)
    n_tok = len(tokenizer)
    table = np.full(vocab_size, index["special"], dtype=np.int8)
    texts = tokenizer.batch_decode([[i] for i in range(min(n_tok, vocab_size))], skip_special_tokens=False)
    for i, text in enumerate(texts):
        table[i] = index[classify(text, i in special)]
    return table
