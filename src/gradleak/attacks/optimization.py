"""Optimization attacks on token embeddings: DLG and TAG (LAMP's baselines).

The dummy batch is a tensor of token embeddings at the private text's positions; the tokens the
tokenizer inserts itself ([CLS], [SEP], BOS, padding) stay fixed at their known positions. Adam
minimizes the gradient distance; at the end each free position is projected to its nearest
vocabulary token by cosine similarity, special and unused tokens excluded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field

from gradleak.attacks.base import AttackFailed, Reconstruction
from gradleak.attacks.objective import DISTANCES, GradientMatcher
from gradleak.errors import GradleakError
from gradleak.federated.client import ClientUpdate
from gradleak.federated.server import ServerKnowledge
from gradleak.federated.sharing import shared_tensor_specs
from gradleak.models.tasks import unwrap

_UNUSED = re.compile(r"^\[unused\d+\]$")


class OptimizationSettings(BaseModel):
    """Hyperparameters of the continuous optimization (defaults: LAMP's TAG baseline)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    distance: str = Field("tag", pattern="^(l2|tag|cos)$")
    steps: int = Field(2500, ge=1)
    lr: float = Field(0.1, gt=0)
    lr_decay: float = Field(1.0, gt=0, le=1, description="StepLR factor; 1 = constant lr")
    lr_decay_every: int = Field(50, ge=1)
    attacker_mode: str = Field(
        "eval", pattern="^(eval|train)$", description="model mode for the dummy gradients"
    )
    match: str = Field("all", description="subset of the update to match (sharing syntax)")


@dataclass
class DummyBatch:
    """Free embeddings for the unknown positions plus the fixed embeddings of the template."""

    free: torch.Tensor  # [B, L, d], optimized; only positions in `free_mask` matter
    fixed: torch.Tensor  # [B, L, d]
    free_mask: torch.Tensor  # [B, L, 1] bool

    def embeds(self) -> torch.Tensor:
        return torch.where(self.free_mask, self.free, self.fixed)


def allowed_token_mask(tokenizer, vocab_size: int) -> torch.Tensor:
    """Tokens a free position may take: no special tokens, no ``[unusedN]`` placeholders."""
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    for token_id in tokenizer.all_special_ids:
        if token_id < vocab_size:
            allowed[token_id] = False
    for token, token_id in tokenizer.get_vocab().items():
        if token_id < vocab_size and _UNUSED.match(token):
            allowed[token_id] = False
    return allowed


def project_to_tokens(
    embeds: torch.Tensor, embedding_matrix: torch.Tensor, allowed: torch.Tensor
) -> torch.Tensor:
    """Nearest allowed token of every position by cosine similarity: ``[B, L]`` ids."""
    unit_vocab = torch.nn.functional.normalize(embedding_matrix, dim=-1)
    unit = torch.nn.functional.normalize(embeds, dim=-1)
    scores = unit @ unit_vocab.T
    scores[..., ~allowed] = -float("inf")
    return scores.argmax(dim=-1)


def check_optimization_applies(knowledge: ServerKnowledge, name: str) -> None:
    """DLG-style attacks need the lengths and, for classification and QA, the labels."""
    if knowledge.template_ids is None:
        raise GradleakError(f"attack {name} needs known sequence lengths: pass --known-lengths")
    if knowledge.global_model.task != "causal_lm" and knowledge.labels is None:
        raise GradleakError(f"attack {name} needs known labels: pass --known-labels")


class OptimizationAttack:
    """One engine for the embedding-optimization family; DLG and TAG are settings of it."""

    def __init__(self, name: str, settings: OptimizationSettings) -> None:
        self.name = name
        self.settings = settings

    def _match_keys(self, update: ClientUpdate, knowledge: ServerKnowledge) -> list[str] | None:
        if self.settings.match == "all":
            return None
        gm = knowledge.global_model
        keys = [s.key for s in shared_tensor_specs(gm.model, gm.adapter, self.settings.match)]
        return keys

    def check(self, update: ClientUpdate, knowledge: ServerKnowledge) -> None:
        check_optimization_applies(knowledge, self.name)
        keys = self._match_keys(update, knowledge)
        if keys is not None and not set(keys) <= set(update.tensors):
            raise GradleakError(
                f"--match '{self.settings.match}' asks for tensors the update does not contain: "
                "choose a subset of what the client shares"
            )

    def run(self, update: ClientUpdate, knowledge: ServerKnowledge, seed: int) -> Reconstruction:
        self.check(update, knowledge)
        s = self.settings
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # dropout masks when the attacker works in train mode
        matcher = GradientMatcher(
            update,
            knowledge,
            DISTANCES[s.distance],
            mode=s.attacker_mode,
            keys=self._match_keys(update, knowledge),
        )
        gm = knowledge.global_model
        embedding = gm.adapter.token_embedding(unwrap(matcher.model)).weight.detach()
        allowed = allowed_token_mask(knowledge.tokenizer, embedding.shape[0])
        dummy = self._init_dummy(knowledge, embedding, generator)
        dummy.free.requires_grad_(True)
        optimizer = torch.optim.Adam([dummy.free], lr=s.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, s.lr_decay_every, gamma=s.lr_decay)
        is_lm = gm.task == "causal_lm"
        best_loss, best_free = float("inf"), dummy.free.detach().clone()
        for step in range(s.steps):
            optimizer.zero_grad(set_to_none=True)
            lm_targets = self._current_ids(dummy, knowledge, embedding, allowed) if is_lm else None
            loss = matcher.loss(dummy.embeds(), lm_targets)
            if not torch.isfinite(loss):
                raise AttackFailed(
                    f"{self.name}: the matching loss became {loss.item()} at step {step}"
                )
            if loss.item() <= best_loss:  # the reference keeps the best iterate, not the last
                best_loss, best_free = loss.item(), dummy.free.detach().clone()
            loss.backward()
            optimizer.step()
            scheduler.step()
        dummy.free = best_free
        with torch.no_grad():
            ids = self._current_ids(dummy, knowledge, embedding, allowed)
        lengths = knowledge.lengths
        token_ids = [row[:length].tolist() for row, length in zip(ids, lengths, strict=True)]
        return Reconstruction(token_ids=token_ids, info={"best_loss": best_loss, "steps": s.steps})

    @staticmethod
    def _current_ids(dummy, knowledge, embedding, allowed) -> torch.Tensor:
        projected = project_to_tokens(dummy.free.detach(), embedding, allowed)
        template = knowledge.template_ids
        return torch.where(template >= 0, template, projected)

    @staticmethod
    def _init_dummy(
        knowledge: ServerKnowledge, embedding: torch.Tensor, generator: torch.Generator
    ) -> DummyBatch:
        template = knowledge.template_ids
        batch, length = template.shape
        free = torch.randn(batch, length, embedding.shape[1], generator=generator)
        fixed = embedding[template.clamp(min=0)]
        return DummyBatch(free=free, fixed=fixed, free_mask=(template < 0)[..., None])


def dlg(steps: int = 2500, **overrides) -> OptimizationAttack:
    """DLG (Zhu et al. 2019) as LAMP runs it: squared L2, Adam lr 0.1 constant, 2500 steps."""
    return OptimizationAttack("dlg", OptimizationSettings(distance="l2", steps=steps, **overrides))


def tag(steps: int = 2500, **overrides) -> OptimizationAttack:
    """TAG (Deng et al. 2021) as LAMP runs it: L2 + 0.01 L1, Adam lr 0.1 constant, 2500 steps."""
    return OptimizationAttack("tag", OptimizationSettings(distance="tag", steps=steps, **overrides))
