"""Random-init tiny models (tiny-bert, tiny-gpt2, tiny-llama): fast fixtures for tests.

They share MiniLM's WordPiece tokenizer so that they need no other files; its [CLS]/[SEP] act
as BOS/EOS for the decoders.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import (
    AutoConfig,
    BertConfig,
    GPT2Config,
    LlamaConfig,
    PreTrainedTokenizerBase,
)

# Random-init tiny models: weights with std 0.1 and unit-variance embedding tables. With the
# usual 0.02 the first layer's input is dominated by nothing in particular and no attack
# inverts it; these scales make token identity as visible as in a pretrained model.
TINY_INIT_RANGE = 0.1
TINY_EMBEDDING_STD = 1.0
# Three layers, not two: DAGER checks layer 2, and when layer 2 is the last layer a
# one-position (classification) loss leaves its gradient rank-deficient.
TINY_LAYERS = 3


def _tiny_config(name: str, tokenizer: PreTrainedTokenizerBase) -> AutoConfig:
    """The config of tiny model ``name``, sized to ``tokenizer``'s vocabulary."""
    common = {
        "vocab_size": tokenizer.vocab_size,
        "pad_token_id": tokenizer.pad_token_id,
        "initializer_range": TINY_INIT_RANGE,
    }
    if name == "tiny-bert":
        return BertConfig(
            hidden_size=64,
            num_hidden_layers=TINY_LAYERS,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=128,
            **common,
        )
    if name == "tiny-gpt2":
        return GPT2Config(
            n_embd=64,
            n_layer=TINY_LAYERS,
            n_head=4,
            n_positions=128,
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
            **common,
        )
    return LlamaConfig(
        hidden_size=64,
        num_hidden_layers=TINY_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        tie_word_embeddings=False,
        **common,
    )


def build_tiny(
    name: str, auto_class: type, tokenizer: PreTrainedTokenizerBase, num_labels: int
) -> nn.Module:
    """Tiny model ``name`` built by ``auto_class`` (which picks the task head), random-init from
    torch's global generator, with eager attention."""
    config = _tiny_config(name, tokenizer)
    config.num_labels = num_labels
    model = auto_class.from_config(config, attn_implementation="eager")
    _rescale_embeddings(model)
    return model


def _rescale_embeddings(model: nn.Module) -> None:
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, TINY_EMBEDDING_STD)
