"""What the honest-but-curious server knows when it attacks one client update.

The attack is handed a :class:`ServerKnowledge` and the :class:`UpdatePayload`, nothing else.
The knowledge is built from the global model and the protocol facts the scenario declares as
known (labels, sequence lengths); the private token ids never enter it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from gradleak.federated.client import GlobalModel
from gradleak.federated.payload import UpdatePayload
from gradleak.models.tasks import EncodedBatch


@dataclass(frozen=True)
class PublicData:
    """The public description of the clients' data: the corpus their text comes from (a
    server that trains on auxiliary text picks it by this), never which examples they hold."""

    dataset: str
    split: str | None = None
    data_dir: str | None = None
    encoding: str | None = None
    chunk_tokens: int | None = None  # the samples are N-token chunks of the split's stream


@dataclass(frozen=True)
class ServerKnowledge:
    """The server's view of a round.

    ``template_ids`` is ``[B, L]`` with the ids of the tokens the tokenizer inserts itself
    ([CLS]/[SEP]/BOS, padding) at their positions and -1 where the private text is: it follows
    from the known lengths and the public tokenizer. ``labels`` and the length-derived fields are
    None when the scenario declares them unknown.
    """

    global_model: GlobalModel
    batch_size: int
    lengths: tuple[int, ...] | None
    template_ids: torch.Tensor | None
    token_type_ids: torch.Tensor | None
    labels: dict[str, torch.Tensor] | None
    # The client's defenses the scenario declares public, in order, with their parameters
    # (``gradleak.defenses`` settings): an adaptive attack may undo or model them.
    defenses: tuple[Any, ...] = ()
    public_data: PublicData | None = None
    # The samples are chunks of a token stream (``--chunk-tokens``): no BOS before them, no EOS
    # after them. The data format is the federation's, public like the tokenizer.
    raw_tokens: bool = False

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.global_model.victim.tokenizer

    @property
    def attention_mask(self) -> torch.Tensor | None:
        if self.template_ids is None:
            return None
        length = self.template_ids.shape[1]
        device = self.template_ids.device
        positions = torch.arange(length, device=device)[None, :]
        return (positions < torch.tensor(self.lengths, device=device)[:, None]).long()


def special_template(batch: EncodedBatch, tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    """Ids at the positions the tokenizer fills itself, -1 at the private text's positions."""
    template = torch.full_like(batch.input_ids, -1)
    for row, (ids, length) in enumerate(zip(batch.input_ids, batch.lengths, strict=True)):
        real = ids[:length].tolist()
        special = tokenizer.get_special_tokens_mask(real, already_has_special_tokens=True)
        for pos, is_special in enumerate(special):
            if is_special:
                template[row, pos] = real[pos]
        template[row, length:] = ids[length:]
    return template


def server_knowledge(
    global_model: GlobalModel,
    batch: EncodedBatch,
    known_labels: bool = True,
    known_lengths: bool = True,
    public_defenses: Sequence[Any] = (),
    public_data: PublicData | None = None,
) -> ServerKnowledge:
    """Extract the declared-known facts of ``batch``; the batch itself stays with the caller."""
    tokenizer = global_model.victim.tokenizer
    return ServerKnowledge(
        global_model=global_model,
        batch_size=int(batch.input_ids.shape[0]),
        lengths=tuple(batch.lengths) if known_lengths else None,
        template_ids=special_template(batch, tokenizer) if known_lengths else None,
        token_type_ids=(
            batch.token_type_ids.clone()
            if known_lengths and batch.token_type_ids is not None
            else None
        ),
        labels={k: v.clone() for k, v in batch.labels.items()} if known_labels else None,
        defenses=tuple(public_defenses),
        public_data=public_data,
        raw_tokens=batch.raw_tokens,
    )


class ServerStep:
    """The server's optimizer over the shared tensors, stepped once per round with the mean
    of the clients' updates as the gradient (a FedAvg delta's negative)."""

    def __init__(self, gm: GlobalModel, optimizer: str = "sgd", lr: float | None = None) -> None:
        self.gm = gm
        self.params = dict(gm.model.named_parameters())
        shared = list({s.param: self.params[s.param] for s in gm.specs}.values())
        self.optimizer: torch.optim.Optimizer
        if optimizer == "adam":
            self.optimizer = torch.optim.Adam(shared, lr=lr or 1e-3)
        else:
            default = 1.0 if gm.protocol.algorithm == "fedavg" else gm.protocol.lr
            self.optimizer = torch.optim.SGD(shared, lr=lr or default)

    def apply(self, updates: list[UpdatePayload]) -> None:
        """One server step with the mean of ``updates``."""
        self.step(self.mean(updates), updates[0].kind)

    def mean(self, updates: list[UpdatePayload]) -> dict[str, torch.Tensor]:
        """The mean of ``updates``, tensor by tensor: what the server steps with."""
        with torch.no_grad():
            return {
                spec.key: torch.stack([u.tensors[spec.key] for u in updates]).mean(dim=0)
                for spec in self.gm.specs
            }

    def step(self, mean: dict[str, torch.Tensor], kind: str) -> None:
        """One server step: each shared tensor's gradient is the ``mean`` update of ``kind``
        (a view of its parameter's gradient, so GPT-2's fused q/k/v slices too; the rest of
        it stays 0)."""
        sign = -1.0 if kind == "weight_delta" else 1.0
        for param in self.optimizer.param_groups[0]["params"]:
            param.grad = torch.zeros_like(param)
        with torch.no_grad():
            for spec in self.gm.specs:
                spec.take(self.params[spec.param].grad).copy_(sign * mean[spec.key])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
