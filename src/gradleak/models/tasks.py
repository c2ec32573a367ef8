"""Turning examples into model inputs, and the training loss of each task.

One loss function serves the client (token ids) and the attacker (dummy embeddings), so a
dummy batch equal to the private one yields exactly the client's gradient (a test checks this).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from peft import PeftModel
from torch import nn
from transformers import PreTrainedTokenizerBase

from gradleak.data import Example
from gradleak.errors import GradleakError
from gradleak.models.adapters import ModelAdapter


@dataclass
class EncodedBatch:
    """Token ids of a batch, right-padded, with what the task's loss needs.

    ``labels`` holds the class labels (classification) or the answer ``start``/``end`` token
    positions (qa); causal LM labels are the ids themselves. ``raw_tokens``: the rows are
    chunks of a token stream, without the tokenizer's special tokens or the task's EOS (the
    federation's public data format, like the tokenizer).
    """

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    labels: dict[str, torch.Tensor] = field(default_factory=dict)
    token_type_ids: torch.Tensor | None = None
    raw_tokens: bool = False

    @property
    def lengths(self) -> list[int]:
        return self.attention_mask.sum(dim=1).tolist()

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def to(self, device: torch.device | str) -> EncodedBatch:
        """The same batch on ``device`` (where the model it trains is)."""
        return replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            labels={k: v.to(device) for k, v in self.labels.items()},
            token_type_ids=None if self.token_type_ids is None else self.token_type_ids.to(device),
        )

    def select(self, rows: list[int] | torch.Tensor) -> EncodedBatch:
        """The sub-batch of ``rows`` (FedAvg local batches), trimmed to its longest row."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        mask = self.attention_mask[rows]
        width = int(mask.sum(dim=1).max())
        return EncodedBatch(
            input_ids=self.input_ids[rows, :width],
            attention_mask=mask[:, :width],
            labels={k: v[rows] for k, v in self.labels.items()},
            token_type_ids=None
            if self.token_type_ids is None
            else self.token_type_ids[rows, :width],
            raw_tokens=self.raw_tokens,
        )


def unwrap(model: nn.Module) -> nn.Module:
    """The Hugging Face model under a peft wrapper (modules keep their LoRA layers)."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


def encode_examples(
    tokenizer: PreTrainedTokenizerBase,
    examples: list[Example],
    task: str,
    max_positions: int,
    max_tokens: int | None = None,
) -> EncodedBatch:
    """Tokenize a private batch the way a fine-tuning client would (tokenizer's own specials).

    Sequences longer than the model allows are an error unless ``max_tokens`` truncates them.
    Either way the tokenizer returns at most one token over the limit, so a huge text costs
    no more than the model's limit in the batch (only the tokenizer's own pass reads it).
    Examples that carry their token ids (chunks of a token stream, see ``Example.token_ids``)
    are used exactly as they are: no special token, no EOS, no truncation.
    The tensors are built on the CPU (``EncodedBatch.to`` moves them to the model).
    """
    limit = min(max_tokens or max_positions, max_positions)
    if any(ex.token_ids is not None for ex in examples):
        return _encode_token_ids(tokenizer, examples, task, limit)
    enc = _tokenize(tokenizer, examples, task, limit, truncate=bool(max_tokens))
    rows = enc["input_ids"]
    if task == "causal_lm":
        rows = [end_with_eos(tokenizer, row) for row in rows]
        if max_tokens:  # truncation keeps the EOS
            rows = [row if len(row) <= limit else [*row[: limit - 1], row[-1]] for row in rows]
    longest = max(len(r) for r in rows)
    if longest > limit:
        raise GradleakError(
            f"a sequence has more than {limit} tokens but the model allows {limit}: pass "
            f"--max-tokens {limit} to truncate, or choose shorter inputs"
        )
    if tokenizer.pad_token_id is None:
        raise GradleakError("the tokenizer has no pad token and no EOS to pad with")
    input_ids = right_padded(rows, longest, tokenizer.pad_token_id)
    attention_mask = right_padded([[1] * len(row) for row in rows], longest, 0)
    token_type_ids = None
    if "token_type_ids" in enc:
        token_type_ids = right_padded(enc["token_type_ids"], longest, 0)
    labels = _labels(enc, examples, task)
    return EncodedBatch(input_ids, attention_mask, labels, token_type_ids)


def _encode_token_ids(
    tokenizer: PreTrainedTokenizerBase, examples: list[Example], task: str, limit: int
) -> EncodedBatch:
    """A batch of examples that carry their token ids: each row is exactly its ids."""
    if task != "causal_lm":
        raise GradleakError(
            f"token chunks are next-token samples and task {task} needs whole examples: "
            "use --task causal_lm or drop --chunk-tokens"
        )
    if any(ex.token_ids is None for ex in examples):
        raise GradleakError("a batch mixes token chunks with text examples: use one kind")
    rows = [list(ex.token_ids or ()) for ex in examples]
    longest = max(len(row) for row in rows)
    if longest > limit:
        raise GradleakError(
            f"a chunk has {longest} tokens but the model allows {limit}: lower --chunk-tokens"
        )
    if min(len(row) for row in rows) < 2:
        raise GradleakError("a next-token sample needs at least 2 tokens: raise --chunk-tokens")
    if tokenizer.pad_token_id is None:
        raise GradleakError("the tokenizer has no pad token and no EOS to pad with")
    input_ids = right_padded(rows, longest, tokenizer.pad_token_id)
    attention_mask = right_padded([[1] * len(row) for row in rows], longest, 0)
    return EncodedBatch(input_ids, attention_mask, raw_tokens=True)


def _tokenize(tokenizer, examples: list[Example], task: str, limit: int, truncate: bool):
    """The tokenizer's encoding of the batch (question and context pairs for QA): cut to
    ``limit`` tokens when ``truncate``, else to ``limit + 1``, which is enough to tell a
    sequence too long (the caller's error) and no more."""
    cut = limit if truncate else limit + 1
    if task == "qa":
        if any(ex.context is None for ex in examples):
            raise GradleakError("task qa needs question/context examples: use --dataset squad")
        return tokenizer(
            [ex.text for ex in examples],
            [ex.context for ex in examples],
            return_offsets_mapping=True,
            padding=False,
            truncation="only_second" if truncate else "longest_first",
            max_length=cut,
        )
    return tokenizer([ex.text for ex in examples], padding=False, truncation=True, max_length=cut)


def right_padded(
    rows: Sequence[Sequence[int]], length: int, fill: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``rows`` as a ``[len(rows), length]`` long tensor, right-padded with ``fill``."""
    out = torch.full((len(rows), length), fill, dtype=torch.long, device=device)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(list(row), dtype=torch.long, device=device)
    return out


def _labels(enc, examples: list[Example], task: str) -> dict[str, torch.Tensor]:
    """The loss's targets: a class per example, or QA's answer start and end positions."""
    if task == "classification":
        if any(ex.label is None for ex in examples):
            raise GradleakError(
                "task classification needs labeled examples: add a label column, give every "
                "example one with --label 0|1|random, or use --task causal_lm"
            )
        return {"label": torch.tensor([int(ex.label) for ex in examples], device="cpu")}
    if task == "qa":
        spans = [_answer_span(enc, i, ex) for i, ex in enumerate(examples)]
        starts, ends = zip(*spans, strict=True)
        return {
            "start": torch.tensor(starts, device="cpu"),
            "end": torch.tensor(ends, device="cpu"),
        }
    return {}


def end_with_eos(tokenizer: PreTrainedTokenizerBase, row: list[int]) -> list[int]:
    """A causal-LM example ends with EOS, as fine-tuning on separate examples does (SFT
    trainers append it so the model learns to stop). Without it the last word predicts
    nothing and gets no gradient at all. Tokenizers that already end rows with it (BERT's
    [SEP] as EOS) are left alone."""
    eos = tokenizer.eos_token_id
    if eos is None or (row and row[-1] == eos):
        return list(row)
    return [*row, eos]


def _answer_span(enc, row: int, ex: Example) -> tuple[int, int]:
    """Token positions of the answer in the context (0, 0 when truncated away, like HF's QA)."""
    if ex.answer_start is None or ex.answer_text is None:
        raise GradleakError("task qa needs answers: use --dataset squad")
    first_char, last_char = ex.answer_start, ex.answer_start + len(ex.answer_text)
    sequence_ids = enc.sequence_ids(row)
    start = end = 0
    for pos, (span, seq) in enumerate(zip(enc["offset_mapping"][row], sequence_ids, strict=True)):
        if seq != 1:
            continue
        if span[0] <= first_char < span[1] and start == 0:
            start = pos
        if span[0] < last_char <= span[1]:
            end = pos
    return (start, end) if start and end >= start else (0, 0)


def task_loss(
    model: nn.Module,
    adapter: ModelAdapter,
    task: str,
    batch_mask: torch.Tensor,
    labels: dict[str, torch.Tensor],
    *,
    input_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    lm_targets: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean training loss of ``task`` from token ids (client) or embeddings (attacker).

    Causal LM targets default to ``input_ids``; an attacker working on embeddings passes its
    current guess as ``lm_targets``: token ids ``[B, L]``, or a distribution over the
    vocabulary at every position ``[B, L, V]`` (DLG's and TAG's dummy labels). Decoder
    classification pools the last real token itself, because Hugging Face pools the last
    *position* when given embeddings instead of ids.
    """
    hf = unwrap(model)
    inputs = model_inputs(adapter, batch_mask, input_ids, inputs_embeds, token_type_ids)
    if task == "classification":
        logits = classification_logits(hf, adapter, inputs, batch_mask)
        return F.cross_entropy(logits, labels["label"])
    if task == "causal_lm":
        logits = hf(**inputs).logits
        if lm_targets is not None and lm_targets.is_floating_point():
            return _soft_next_token_loss(logits, lm_targets, batch_mask)
        targets = input_ids if lm_targets is None else lm_targets
        targets = targets.masked_fill(batch_mask == 0, -100)
        return F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), targets[:, 1:].reshape(-1)
        )
    out = hf(**inputs)
    start = F.cross_entropy(out.start_logits, labels["start"])
    end = F.cross_entropy(out.end_logits, labels["end"])
    return (start + end) / 2


def _soft_next_token_loss(
    logits: torch.Tensor, targets: torch.Tensor, batch_mask: torch.Tensor
) -> torch.Tensor:
    """Next-token cross-entropy against a distribution per position (``targets[:, t]`` is what
    position ``t - 1`` predicts), averaged over the real positions as the id loss is; one-hot
    targets give the id loss."""
    log_probs = F.log_softmax(logits[:, :-1], dim=-1)
    per_position = -(targets[:, 1:] * log_probs).sum(dim=-1)
    return per_position[batch_mask[:, 1:] != 0].mean()


def model_inputs(
    adapter: ModelAdapter,
    batch_mask: torch.Tensor,
    input_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
) -> dict[str, torch.Tensor | None]:
    """The keyword inputs of a forward pass (token types only for a family that reads them)."""
    inputs = {"input_ids": input_ids, "inputs_embeds": inputs_embeds, "attention_mask": batch_mask}
    if token_type_ids is not None and adapter.uses_token_types:
        inputs["token_type_ids"] = token_type_ids
    return inputs


def classification_logits(
    hf: nn.Module, adapter: ModelAdapter, inputs: dict, batch_mask: torch.Tensor
) -> torch.Tensor:
    """Class logits ``[B, classes]``: a decoder's head reads the last real token (Hugging Face
    would pool the last *position* when given embeddings instead of ids)."""
    if adapter.is_decoder:
        hidden = adapter.backbone(hf)(**inputs).last_hidden_state
        last = batch_mask.sum(dim=1) - 1
        return hf.score(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])
    return hf(**inputs).logits
