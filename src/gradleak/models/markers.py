"""The tokens a language model reads around a text as a whole document.

Instruct tokenizers name chat-turn markers as BOS and EOS; after ``<|im_start|>`` the model
expects a role name ("user"), not text, so the document separator of their pretraining is used
instead (benchmarks/MEASURED.md, "The LM prior's document markers", has what that changes for
SmolLM2-135M-Instruct). Both the optimization attacks' LM prior and DAGER's confirmation read
candidates this way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI's listings read DOCUMENT_SEPARATOR without loading torch
    from torch import nn
    from transformers import PreTrainedTokenizerBase

CHAT_TURN_MARKERS = frozenset({"<|im_start|>", "<|im_end|>"})
# SmolLM2's document separator: the base SmolLM2 models' BOS and EOS (token 0).
DOCUMENT_SEPARATOR = "<|endoftext|>"


def document_token(tokenizer: PreTrainedTokenizerBase, model: nn.Module, which: str) -> int | None:
    """The token before (``which="bos"``) or after (``"eos"``) a scored text: the tokenizer's,
    or the document separator where that is a chat-turn marker; None when there is none."""
    vocab = tokenizer.get_vocab()
    if getattr(tokenizer, f"{which}_token") in CHAT_TURN_MARKERS and DOCUMENT_SEPARATOR in vocab:
        return vocab[DOCUMENT_SEPARATOR]
    token_id = getattr(tokenizer, f"{which}_token_id")
    if token_id is None:  # a config's id may be a default outside this vocabulary (GPT-2's)
        token_id = getattr(model.config, f"{which}_token_id", None)
    return token_id if isinstance(token_id, int) and 0 <= token_id < len(tokenizer) else None
