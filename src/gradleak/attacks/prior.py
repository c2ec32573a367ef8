"""Language-model priors: how natural a candidate text is, for LAMP's discrete steps.

LAMP scores a reordered candidate by its matching loss plus ``alpha_lm`` times the mean token
cross-entropy of an auxiliary causal LM on the candidate's tokens. The paper's LM was a GPT-2
trained with BERT's vocabulary, so it read the victim's token ids directly. Any causal LM works
here: with the victim's vocabulary it reads the ids as they are; otherwise the ids are decoded
with the victim's tokenizer and the text is re-tokenized with the prior's.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedTokenizerBase

from gradleak.errors import GradleakError
from gradleak.models.registry import load_victim

NO_PRIOR = "none"


class LanguagePrior(Protocol):
    """Scores texts given as the victim's token ids (the content tokens, no specials)."""

    name: str

    def sentence_nll(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per sequence: summed token cross-entropy (nats) and the number of scored tokens.

        Sums and counts (rather than means) let a caller form the mean over a whole batch of
        sentences, as LAMP's loss is defined on the batch.
        """


class CausalLMPrior:
    """A causal LM as a prior; scores many candidates in a few padded forward passes."""

    def __init__(
        self,
        name: str,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        victim_tokenizer: PreTrainedTokenizerBase,
        chunk: int = 32,
    ) -> None:
        self.name = name
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.victim_tokenizer = victim_tokenizer
        self.chunk = chunk
        # Same vocabulary: the victim's ids are the prior's ids (LAMP's own setting).
        self.same_vocab = tokenizer.get_vocab() == victim_tokenizer.get_vocab()
        bos = tokenizer.bos_token_id
        if bos is None:
            bos = getattr(model.config, "bos_token_id", None)
        self.bos: int | None = bos
        pad = tokenizer.pad_token_id
        self.pad: int = pad if pad is not None else (tokenizer.eos_token_id or 0)

    def prior_ids(self, victim_ids: list[int]) -> list[int]:
        """The prior's input for one text: its BOS (if any) and the text in its vocabulary."""
        if self.same_vocab:
            ids = list(victim_ids)
        else:
            text = self.victim_tokenizer.decode(victim_ids, skip_special_tokens=True)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ([self.bos] if self.bos is not None else []) + ids

    @torch.no_grad()
    def sentence_nll(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = [tuple(self.prior_ids(ids)) for ids in sequences]
        unique = sorted(set(inputs), key=len)  # similar lengths share a chunk: less padding
        scores: dict[tuple[int, ...], tuple[float, int]] = {}
        for start in range(0, len(unique), self.chunk):
            part = unique[start : start + self.chunk]
            sums, counts = self._score(part)
            for key, total, count in zip(part, sums.tolist(), counts.tolist(), strict=True):
                scores[key] = (total, count)
        sums = torch.tensor([scores[key][0] for key in inputs], dtype=torch.float64)
        counts = torch.tensor([scores[key][1] for key in inputs], dtype=torch.float64)
        return sums, counts

    def _score(self, rows: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        if width < 2:  # nothing to predict
            return torch.zeros(len(rows)), torch.zeros(len(rows))
        ids = torch.full((len(rows), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        logits = self.model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        targets = ids[:, 1:]
        valid = mask[:, 1:].bool()
        token_nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        token_nll = token_nll.masked_fill(~valid, 0.0)
        return token_nll.sum(dim=1).double(), valid.sum(dim=1).double()


def load_prior_model(name: str) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """Load causal LM ``name`` (a registered model, folder or hub id) for use as a prior."""
    try:
        victim = load_victim(name, "causal_lm")
    except GradleakError as exc:
        raise GradleakError(
            f"cannot use '{name}' as the LM prior ({exc}); use smollm2, none, or a causal LM"
        ) from None
    if not victim.is_decoder:
        raise GradleakError(
            f"the LM prior must be a causal (decoder) LM; '{name}' is a "
            f"{victim.adapter.family} encoder: use smollm2 or none"
        )
    return victim.model, victim.tokenizer
