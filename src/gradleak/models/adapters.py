"""Architecture adapters: the one place that knows where things live in each model family.

Attacks and the federated client speak in *roles*: the token embedding, the first layer's input,
and per transformer layer the modules ``q``, ``k``, ``v`` (attention projections), ``o``
(attention output), ``f`` (FFN input) and ``p`` (FFN output), as in Li, Xu & Dras 2024.
An adapter maps those roles onto one model family's modules. Matching is by module identity,
never by substring of parameter names (the partial-gradient reference code's ``p`` selector
also caught ``o`` that way).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

# Attention keys and values of the blocks before some layer, one ``(keys, values)`` pair per
# block, each ``[batch, kv_heads, length, head_dim]`` (the Hugging Face cache layout).
PastKeyValues = list[tuple[torch.Tensor, torch.Tensor]]


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


class _StopForward(Exception):
    """Raised by a hook to end a forward pass early."""


class ModelAdapter:
    """Role map of one model family. Subclasses fill in the attribute paths."""

    family: str = ""
    is_decoder: bool = False
    # Rotary models add positions inside attention: their first layer's input is position-free.
    rotary_positions: bool = False
    # Segment (token type) embeddings: BERT has them. GPT-2 would *add word embeddings* of any
    # token_type_ids it is given, so they are passed only to families that define them.
    uses_token_types: bool = False
    # Causal decoders whose Hugging Face forward takes ``past_key_values`` (a ``Cache``) and
    # explicit ``position_ids``: new tokens can then be run against a prefix's cached keys and
    # values (``layer_input_cached``) instead of re-running the prefix.
    supports_kv_cache: bool = False
    # Encoders whose blocks can be run at a few query positions against every position's keys
    # and values (``block_keys_values``, ``block_rows``): a DAGER encoder search that changes
    # one token then recomputes only the positions its choice reads.
    supports_block_rows: bool = False

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
    def first_layer_input(
        self, model: nn.Module, token_embeds: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """What layer 0's attention projections read, for token embeddings ``[..., L, d]``.

        ``positions`` (broadcast against the leading shape) default to ``0..L-1``; rotary models
        ignore them. Dropout is not applied: the attacker computes this.
        """
        raise NotImplementedError

    def normed_embedding_sum(
        self, model: nn.Module, token_embeds: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """The sum of token, position (and type) embeddings where a LayerNorm is all that reads
        it (BERT, MPNet), else None (GPT-2's sum also enters the residual stream; rotary
        models add no position table). Positions as in ``first_layer_input``.

        The gradient of such a sum is orthogonal to it (and to the all-ones vector): what
        lets DAGER place a token's embedding row at its position (``dager/positions.py``)."""
        return None

    def position_table(self, model: nn.Module) -> tuple[nn.Embedding, int] | None:
        """The learned absolute position table and the row of position 0, where the model
        has one and ``normed_embedding_sum`` is defined; else None."""
        return None

    @staticmethod
    def _positions(token_embeds: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        if positions is None:
            return torch.arange(token_embeds.shape[-2], device=token_embeds.device)
        return positions

    def input_norm(self, model: nn.Module, layer: int) -> nn.Module:
        """The normalization block ``layer`` applies before its attention projections
        (identity for post-LN encoders, whose blocks already output normalized states)."""
        return nn.Identity()

    def layer_input(
        self, model: nn.Module, layer: int, inputs: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """What block ``layer``'s q/k/v projections read for the given model inputs.

        Runs the real forward pass only up to block ``layer`` (a pre-hook stops it there), so
        masks and positions are the model's own.
        """
        return self.layer_inputs(model, [layer], inputs)[0]

    def layer_inputs(
        self, model: nn.Module, layers: Sequence[int], inputs: dict[str, torch.Tensor]
    ) -> list[torch.Tensor]:
        """``layer_input`` of several blocks from one forward pass, which stops before the
        last of them."""
        blocks = self.layers(model)
        captured: dict[int, torch.Tensor] = {}
        last = max(layers)

        def capture(layer: int):
            def hook(_module, args, kwargs):
                captured[layer] = args[0] if args else kwargs["hidden_states"]
                if layer == last:
                    raise _StopForward

            return hook

        handles = [
            blocks[layer].register_forward_pre_hook(capture(layer), with_kwargs=True)
            for layer in sorted(set(layers))
        ]
        try:
            self.backbone(model)(**inputs)
        except _StopForward:
            pass
        finally:
            for handle in handles:
                handle.remove()
        return [self.input_norm(model, layer)(captured[layer]) for layer in layers]

    def layer_input_cached(
        self,
        model: nn.Module,
        layer: int,
        input_ids: torch.Tensor,
        past: PastKeyValues,
    ) -> tuple[torch.Tensor, PastKeyValues]:
        """``layer_input`` for tokens ``input_ids`` ``[n, q]`` that follow prefixes already run.

        ``past`` holds the ``n`` prefixes' keys and values of blocks ``0..layer-1`` (an empty
        list: no prefix). Causal attention lets the new positions depend on a prefix only
        through those, so a decoder search extending prefixes one token at a time runs one
        position per trial instead of the whole prefix. Returns the new positions' inputs
        ``[n, q, d]`` and the cache of prefix and new positions: the forward stops before block
        ``layer`` (as in ``layer_input``), so it holds exactly the blocks before it. Only for
        families with ``supports_kv_cache``.
        """
        (hidden,), present = self.layer_inputs_cached(model, [layer], input_ids, past)
        return hidden, present

    def layer_inputs_cached(
        self,
        model: nn.Module,
        layers: Sequence[int],
        input_ids: torch.Tensor,
        past: PastKeyValues,
    ) -> tuple[list[torch.Tensor], PastKeyValues]:
        """``layer_input_cached`` of several blocks at once: ``past`` and the returned cache
        hold the blocks before the last of ``layers``."""
        if not self.supports_kv_cache:
            raise NotImplementedError(f"{self.family} has no key/value cache path")
        cache = DynamicCache(ddp_cache_data=past) if past else DynamicCache()
        prefix = cache.get_seq_length()
        n, length = input_ids.shape
        device = input_ids.device
        inputs = {
            "input_ids": input_ids,
            "attention_mask": torch.ones(n, prefix + length, dtype=torch.long, device=device),
            "position_ids": torch.arange(prefix, prefix + length, device=device).expand(n, -1),
            "past_key_values": cache,
            "use_cache": True,
        }
        hidden = self.layer_inputs(model, layers, inputs)
        return hidden, [(block.keys, block.values) for block in cache.layers[: max(layers)]]

    # --- one encoder block at chosen positions (``supports_block_rows``) -------------------
    def block_keys_values(
        self, model: nn.Module, layer: int, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Block ``layer``'s attention keys and values ``[..., L, d]`` for its input ``hidden``
        (position-wise: a changed position changes only its own rows)."""
        raise NotImplementedError(f"{self.family} has no block-rows path")

    def block_rows(
        self,
        model: nn.Module,
        layer: int,
        hidden_rows: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> torch.Tensor:
        """Block ``layer``'s output ``[..., R, d]`` at the positions whose inputs are
        ``hidden_rows``, each attending to every position's ``keys`` and ``values`` (full
        attention, no padding): what the whole block's forward gives at those rows."""
        raise NotImplementedError(f"{self.family} has no block-rows path")

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
    uses_token_types = True
    supports_block_rows = True

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

    def normed_embedding_sum(self, model, token_embeds, positions=None):
        emb = self.backbone(model).embeddings
        positions = self._positions(token_embeds, positions)
        types = torch.zeros_like(positions)
        return token_embeds + emb.position_embeddings(positions) + emb.token_type_embeddings(types)

    def position_table(self, model):
        return self.backbone(model).embeddings.position_embeddings, 0

    def first_layer_input(self, model, token_embeds, positions=None):
        summed = self.normed_embedding_sum(model, token_embeds, positions)
        return self.backbone(model).embeddings.LayerNorm(summed)

    def block_keys_values(self, model, layer, hidden):
        attention = self.layers(model)[layer].attention.self
        return attention.key(hidden), attention.value(hidden)

    def block_rows(self, model, layer, hidden_rows, keys, values):
        # BertLayer's forward in eval mode, with queries at the given rows only: scaled
        # dot-product attention per head, then the block's own output, intermediate and
        # output modules (dense, residual, LayerNorm), which act position by position.
        block = self.layers(model)[layer]
        attention = block.attention.self
        shape = (attention.num_attention_heads, attention.attention_head_size)

        def heads(x: torch.Tensor) -> torch.Tensor:  # [..., n, d] -> [..., heads, n, d_head]
            return x.unflatten(-1, shape).transpose(-2, -3)

        query = heads(attention.query(hidden_rows))
        scores = (query @ heads(keys).transpose(-1, -2)) * attention.scaling
        context = (scores.softmax(dim=-1) @ heads(values)).transpose(-2, -3).flatten(-2)
        attended = block.attention.output(context, hidden_rows)
        return block.output(block.intermediate(attended), attended)


class GPT2Adapter(ModelAdapter):
    """GPT-2: absolute positions, pre-LN, fused q/k/v in ``c_attn`` (Conv1D)."""

    family = "gpt2"
    is_decoder = True
    supports_kv_cache = True

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

    def input_norm(self, model, layer):
        return self.layers(model)[layer].ln_1

    def first_layer_input(self, model, token_embeds, positions=None):
        backbone = self.backbone(model)
        positions = self._positions(token_embeds, positions)
        return backbone.h[0].ln_1(token_embeds + backbone.wpe(positions))


class LlamaAdapter(ModelAdapter):
    """Llama family (SmolLM2): rotary positions (so the first input is position-free), RMSNorm."""

    family = "llama"
    is_decoder = True
    rotary_positions = True
    supports_kv_cache = True

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

    def input_norm(self, model, layer):
        return self.layers(model)[layer].input_layernorm

    def first_layer_input(self, model, token_embeds, positions=None):
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

    def normed_embedding_sum(self, model, token_embeds, positions=None):
        table, first = self.position_table(model)
        return token_embeds + table(self._positions(token_embeds, positions) + first)

    def position_table(self, model):
        # MPNet numbers positions from padding_idx + 1 (RoBERTa convention).
        emb = self.backbone(model).embeddings
        return emb.position_embeddings, emb.padding_idx + 1

    def first_layer_input(self, model, token_embeds, positions=None):
        summed = self.normed_embedding_sum(model, token_embeds, positions)
        return self.backbone(model).embeddings.LayerNorm(summed)


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


def __getattr__(name: str) -> object:
    from gradleak.renamed import renamed_attribute

    return renamed_attribute(__name__, name)
