"""Architecture adapters: the one place that knows where things live in each model family.

Attacks and the federated client speak in *roles*: the token embedding, the first layer's input,
and per transformer layer the modules ``q``, ``k``, ``v`` (attention projections), ``o``
(attention output), ``f`` (FFN input) and ``p`` (FFN output), as in Li, Xu & Dras 2024.
An adapter maps those roles onto one model family's modules. Matching is by module identity,
never by substring of parameter names (the partial-gradient reference code's ``p`` selector
also caught ``o`` that way).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

ROLES: tuple[str, ...] = ("q", "k", "v", "o", "f", "p")


@dataclass(frozen=True)
class RoleModule:
    """A role's module; ``part`` selects one of ``parts`` equal slices of a fused projection.

    GPT-2 computes q, k and v with one ``c_attn`` layer of output size 3h: its role ``q`` is
    part 0 of 3 of that module's output dimension.
    """

    module: nn.Module
    part: int = 0
    parts: int = 1

    @property
    def fused(self) -> bool:
        return self.parts > 1


class ModelAdapter:
    """Role map of one model family. Subclasses fill in the attribute paths."""

    family: str = ""
    is_decoder: bool = False

    # --- structure -------------------------------------------------------------------------
    def backbone(self, model: nn.Module) -> nn.Module:
        """The transformer without task head (``bert``, ``transformer``, ``model``)."""
        return model.base_model

    def layers(self, model: nn.Module) -> list[nn.Module]:
        raise NotImplementedError

    def num_layers(self, model: nn.Module) -> int:
        return len(self.layers(model))

    def role_module(self, model: nn.Module, layer: int, role: str) -> RoleModule:
        raise NotImplementedError

    def token_embedding(self, model: nn.Module) -> nn.Embedding:
        return self.backbone(model).get_input_embeddings()

    def embedding_modules(self, model: nn.Module) -> list[nn.Module]:
        """Every input embedding table (token, position, type): frozen by ``freeze_embeddings``."""
        raise NotImplementedError

    def max_positions(self, model: nn.Module) -> int:
        return int(model.config.max_position_embeddings)

    def hidden_size(self, model: nn.Module) -> int:
        return int(model.config.hidden_size)

    # --- the first layer's input (DAGER's span check works on it) ----------------------------
    def first_layer_input(self, model: nn.Module, token_embeds: torch.Tensor) -> torch.Tensor:
        """What layer 0's attention projections read, for token embeddings ``[B, L, d]``.

        Positions are ``0..L-1``; dropout is not applied (the attacker computes this).
        """
        raise NotImplementedError

    # --- dropout --------------------------------------------------------------------------
    def set_dropout(self, model: nn.Module, rate: float) -> None:
        """Set every dropout in the model to ``rate`` (Wang & Li's dropout sweeps).

        Covers ``nn.Dropout`` modules and the float ``attention_dropout`` attribute that
        Llama-style attention applies functionally.
        """
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = rate
            if isinstance(getattr(module, "attention_dropout", None), float):
                module.attention_dropout = rate

    def dropout_rate(self, model: nn.Module) -> float:
        """The largest dropout rate in the model (0 when it has none)."""
        rates = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
        rates += [
            m.attention_dropout
            for m in model.modules()
            if isinstance(getattr(m, "attention_dropout", None), float)
        ]
        return max(rates, default=0.0)


class BertAdapter(ModelAdapter):
    """BERT-style encoders (BERT, MiniLM): absolute positions, token types, post-LN."""

    family = "bert"

    def layers(self, model):
        return list(self.backbone(model).encoder.layer)

    def role_module(self, model, layer, role):
        block = self.layers(model)[layer]
        modules = {
            "q": block.attention.self.query,
            "k": block.attention.self.key,
            "v": block.attention.self.value,
            "o": block.attention.output.dense,
            "f": block.intermediate.dense,
            "p": block.output.dense,
        }
        return RoleModule(modules[role])

    def embedding_modules(self, model):
        emb = self.backbone(model).embeddings
        return [emb.word_embeddings, emb.position_embeddings, emb.token_type_embeddings]

    def first_layer_input(self, model, token_embeds):
        emb = self.backbone(model).embeddings
        length = token_embeds.shape[1]
        positions = torch.arange(length, device=token_embeds.device)
        types = torch.zeros(length, dtype=torch.long, device=token_embeds.device)
        summed = (
            token_embeds + emb.position_embeddings(positions) + emb.token_type_embeddings(types)
        )
        return emb.LayerNorm(summed)


class GPT2Adapter(ModelAdapter):
    """GPT-2: absolute positions, pre-LN, fused q/k/v in ``c_attn`` (Conv1D)."""

    family = "gpt2"
    is_decoder = True

    def layers(self, model):
        return list(self.backbone(model).h)

    def role_module(self, model, layer, role):
        block = self.layers(model)[layer]
        if role in ("q", "k", "v"):
            return RoleModule(block.attn.c_attn, part="qkv".index(role), parts=3)
        modules = {"o": block.attn.c_proj, "f": block.mlp.c_fc, "p": block.mlp.c_proj}
        return RoleModule(modules[role])

    def embedding_modules(self, model):
        backbone = self.backbone(model)
        return [backbone.wte, backbone.wpe]

    def max_positions(self, model):
        return int(model.config.n_positions)

    def first_layer_input(self, model, token_embeds):
        backbone = self.backbone(model)
        positions = torch.arange(token_embeds.shape[1], device=token_embeds.device)
        return backbone.h[0].ln_1(token_embeds + backbone.wpe(positions))


class LlamaAdapter(ModelAdapter):
    """Llama family (SmolLM2): rotary positions (so the first input is position-free), RMSNorm."""

    family = "llama"
    is_decoder = True

    def layers(self, model):
        return list(self.backbone(model).layers)

    def role_module(self, model, layer, role):
        block = self.layers(model)[layer]
        modules = {
            "q": block.self_attn.q_proj,
            "k": block.self_attn.k_proj,
            "v": block.self_attn.v_proj,
            "o": block.self_attn.o_proj,
            "f": block.mlp.up_proj,
            "p": block.mlp.down_proj,
        }
        return RoleModule(modules[role])

    def embedding_modules(self, model):
        return [self.backbone(model).embed_tokens]

    def first_layer_input(self, model, token_embeds):
        return self.layers(model)[0].input_layernorm(token_embeds)


class MPNetAdapter(ModelAdapter):
    """MPNet encoders: BERT-like blocks with relative attention bias, no token types."""

    family = "mpnet"

    def layers(self, model):
        return list(self.backbone(model).encoder.layer)

    def role_module(self, model, layer, role):
        block = self.layers(model)[layer]
        modules = {
            "q": block.attention.attn.q,
            "k": block.attention.attn.k,
            "v": block.attention.attn.v,
            "o": block.attention.attn.o,
            "f": block.intermediate.dense,
            "p": block.output.dense,
        }
        return RoleModule(modules[role])

    def embedding_modules(self, model):
        emb = self.backbone(model).embeddings
        return [emb.word_embeddings, emb.position_embeddings]

    def first_layer_input(self, model, token_embeds):
        emb = self.backbone(model).embeddings
        # MPNet numbers positions from padding_idx + 1 (RoBERTa convention).
        start = emb.padding_idx + 1
        positions = torch.arange(start, start + token_embeds.shape[1], device=token_embeds.device)
        return emb.LayerNorm(token_embeds + emb.position_embeddings(positions))


ADAPTERS: dict[str, type[ModelAdapter]] = {
    "bert": BertAdapter,
    "gpt2": GPT2Adapter,
    "llama": LlamaAdapter,
    "mpnet": MPNetAdapter,
}


def adapter_for(model_type: str) -> ModelAdapter | None:
    """The adapter for a Hugging Face ``config.model_type``, or None if unsupported."""
    cls = ADAPTERS.get(model_type)
    return cls() if cls else None
