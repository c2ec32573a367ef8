"""lti-lm: the victim model of Wu et al. 2023 (Learning to Invert), built in code.

Wu et al. attack "a three-layer transformer with a frozen token embedding layer (about 1.1M
trainable parameters) trained for next-token prediction on WikiText", samples of 16 tokens.
Their code builds it with d_model 96, 8 heads, FFN 1536, ReLU, 3 layers, dropout 0, learned
position embeddings (1024 positions), an output layer whose weight is a copy of the frozen
token table and whose bias is trainable; random init, never trained.

lti-lm is that model in Hugging Face's GPT-2 architecture, so that the gpt2 adapter, the
client and every attack serve it unchanged, with SmolLM2's tokenizer (49,152 tokens; see
``sources.lti_tokenizer_source``). Where it differs from theirs, on purpose:

* causal: their encoder stack ran without a causal mask, so every position saw the whole
  sample, later tokens included, while being trained to predict them. lti-lm is a causal
  decoder, the real next-token language model a federation would train;
* the frozen token table is also the output layer's weight (tied), as theirs is (their code
  copies the token table into the output layer and leaves both out of the update); the output
  layer keeps its bias over the vocabulary, trainable as theirs is (49,152 parameters, zero at
  init where theirs is drawn uniform in +-1/sqrt(96)). That bias's gradient is the sum over
  positions of softmax minus the one-hot next token: it names every next token of the sample,
  which is much of what TAG and the learned attacks read in Wu et al.'s Table 2. GPT-2 adds a
  final LayerNorm (192 parameters) and puts its LayerNorms before each sublayer (theirs
  after);
* its weights are GPT-2's own random init from a fixed seed (:data:`LTI_LM_SEED`), the same in
  every process and every run, whatever the run's ``--seed``; a classification or QA head, as
  for every model, is drawn from the run's seed.

The model freezes its token table itself: the trainable parameters of the language model are
the three blocks (334,176 each), the position table (1024 x 96 = 98,304), the final LayerNorm
and the output bias (49,152), 1,150,176 in all (:data:`LTI_LM_TRAINABLE`), and no client
update carries a token-embedding tensor, whatever the protocol says (``--freeze-embeddings``
freezes the position table too).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GPT2Config, GPT2Model, PreTrainedTokenizerBase

LTI_LM_SEED = 2023
LTI_LM_LAYERS = 3
LTI_LM_WIDTH = 96
LTI_LM_HEADS = 8
LTI_LM_FFN = 1536
LTI_LM_POSITIONS = 1024
LTI_LM_TRAINABLE = 1_150_176
# GPT-2's own init, token table included (std 0.02), unlike the tiny models' std 1 tables:
# - the first block reads ln_1(token + position), which the LayerNorm makes independent of the
#   tables' common scale; with both at 0.02 the token is half of that input, as visible as in
#   Wu et al.'s model (token table uniform(-0.1, 0.1) x sqrt(96), std 0.57, beside positions
#   of std 1). DAGER recovers the same tokens of WikiText chunks with std 0.02 as with std 1;
# - the table is also the output layer. At 0.02 the untrained model predicts a near-uniform
#   next token (loss 10.83 on WikiText chunks, ln 49152 = 10.80), as Wu et al.'s untrained
#   model did; from std 0.1 up it predicts its current token everywhere (std 0.57: loss 53.6,
#   std 1: 94.6), a degenerate language model whose gradient no federation would send.
LTI_LM_INIT_RANGE = 0.02


def lti_lm_config(tokenizer: PreTrainedTokenizerBase, num_labels: int) -> GPT2Config:
    """The GPT-2 config of lti-lm over ``tokenizer``'s vocabulary (dropout off everywhere)."""
    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=LTI_LM_POSITIONS,
        n_embd=LTI_LM_WIDTH,
        n_layer=LTI_LM_LAYERS,
        n_head=LTI_LM_HEADS,
        n_inner=LTI_LM_FFN,
        activation_function="relu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        summary_first_dropout=0.0,
        initializer_range=LTI_LM_INIT_RANGE,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=num_labels,
    )


def build_lti_lm(
    auto_class: type, tokenizer: PreTrainedTokenizerBase, num_labels: int
) -> nn.Module:
    """lti-lm with the task head ``auto_class`` picks, eager attention, token table frozen.

    The transformer's weights come from :data:`LTI_LM_SEED` on a private copy of torch's
    generator, so they are bit-identical across processes, runs and tasks; the task head (none
    for next-token prediction, whose head is the token table) is drawn from torch's global
    generator, which ``load_victim`` seeds with the run's seed.
    """
    config = lti_lm_config(tokenizer, num_labels)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(LTI_LM_SEED)
        backbone = GPT2Model(config).state_dict()
        model = auto_class.from_config(config, attn_implementation="eager")
    model.base_model.load_state_dict(backbone)
    _init_task_head(model)
    _add_output_bias(model)
    model.get_input_embeddings().requires_grad_(False)
    return model


def _init_task_head(model: nn.Module) -> None:
    """Draw the task head's linear layers as GPT-2 does (normal, std 0.02; zero bias) from the
    global generator; the next-token head is the token table itself and stays as it is."""
    table = model.get_input_embeddings().weight
    std = model.config.initializer_range
    with torch.no_grad():
        for child in model.children():
            if child is model.base_model:
                continue
            for module in child.modules():
                if isinstance(module, nn.Linear) and module.weight is not table:
                    module.weight.normal_(0.0, std)
                    if module.bias is not None:
                        module.bias.zero_()


def _add_output_bias(model: nn.Module) -> None:
    """Give the next-token head a trainable bias over the vocabulary, zero at init, its weight
    still the token table (Wu et al.'s untied decoder, whose weight they set to the table)."""
    head = model.get_output_embeddings()
    if head is None or head.bias is not None:
        return
    biased = nn.Linear(head.in_features, head.out_features, bias=True)
    biased.weight = head.weight
    with torch.no_grad():
        biased.bias.zero_()
    model.set_output_embeddings(biased)
