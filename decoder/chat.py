"""Prompts as chat turns: the one place a prompt text is framed by the target's chat template.

An instruct model (the real pair's SmolLM2) answers a prompt only when it arrives as a user turn; a decoder
built with ``chat=True`` frames every text prompt through ``chat_ids``, and the studies (the teacher's
distillation data included) call the same function, so what the draft is trained on and what it drafts for
are framed alike.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from .errors import TreewiseError


def chat_ids(tokenizer: PreTrainedTokenizerBase, text: str, max_tokens: int | None = None) -> list[int]:
    """``text`` as the tokenizer's chat template frames one user turn, with the assistant's turn opened;
    cut to its last ``max_tokens`` tokens when given (the question usually ends a long prompt)."""
    if not getattr(tokenizer, "chat_template", None):
        raise TreewiseError(f"{type(tokenizer).__name__} has no chat template, so prompts cannot be framed as chat "
                            "turns: use a pair without chat framing (--pair micro) or a target with a chat template")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
    return ids[-max_tokens:] if max_tokens else ids
