"""Canary clients in a Flower federation (Andrew et al., ICLR 2024;
:mod:`gradleak.federated.canaries`): each round, the server's audit adds the round's inserted
canaries to the aggregate as clients sending ``norm`` times their random direction, and scores
every canary of the round, inserted or held out, by the cosine of its direction with the
round's mean update.

A canary weighs as much as one client in the mean (Flower's FedAvg weighs clients by their
examples, which are equal here but for planted records), and the aggregate the strategy
returns becomes the mean over the real clients and the round's canaries: the model goes on
with them, as it does in ``gradleak utility``. Its norm is the median norm of round 1's client
updates, so that a canary is as large as a typical client's.
"""

from __future__ import annotations

import statistics

import torch
from flwr.app import Message

from gradleak.errors import GradleakError
from gradleak.evaluation.canary_audit import CanaryAudit
from gradleak.federated.canaries import CanaryClients, tensors_norm
from gradleak.federated.client import GlobalModel
from gradleak.integrations.flower.arrays import trainable_tensors


class FlowerCanaryClients:
    """The canary clients of one federation, mixed into each round's aggregate and scored."""

    def __init__(self, canaries: CanaryClients, fedsgd: bool, server_lr: float) -> None:
        self.audit = CanaryAudit(canaries, defenses=())
        self.fedsgd, self.server_lr = fedsgd, server_lr

    def mixed(
        self,
        round_index: int,
        global_model: GlobalModel,
        before: dict[str, torch.Tensor],
        after: dict[str, torch.Tensor],
        replies: list[Message],
        arrays_key: str,
    ) -> dict[str, torch.Tensor]:
        """The trainable weights ``after`` the round (the strategy's aggregate) as they are
        with the round's inserted canaries among its clients; ``before``: the weights sent.
        Each canary of the round is scored against the new mean."""
        norms = []  # each client update's, read one at a time (they are model-sized)
        for reply in replies:
            update = self._update(global_model, reply, arrays_key, before)
            if update is not None:
                norms.append(tensors_norm(update))
            del update
        if not norms:
            raise GradleakError(f"round {round_index + 1} has no client update to add canaries to")
        if self.audit.norm is None:
            self.audit.norm = statistics.median(norms)
        with torch.no_grad():
            # the clients' mean update: a FedAvg delta, or the mean gradient of a FedSGD step
            scale = -1 / self.server_lr if self.fedsgd else 1.0
            total = {n: (after[n] - before[n]) * (scale * len(norms)) for n in before}
            inserted = self.audit.canaries.inserted_in(round_index)
            for index in inserted:
                self.audit.canaries.add_to(total, index, float(self.audit.norm))
            mean = {n: t.div_(len(norms) + len(inserted)) for n, t in total.items()}
            self.audit.score(round_index, mean)
            step = -self.server_lr if self.fedsgd else 1.0
            return {n: before[n] + step * mean[n] for n in before}

    def _update(
        self,
        global_model: GlobalModel,
        reply: Message,
        arrays_key: str,
        before: dict[str, torch.Tensor],
    ) -> dict[str, torch.Tensor] | None:
        """A reply's update (its gradient, or its weights less the sent ones), or None for a
        reply that carries none the model can read."""
        if reply.has_error() or arrays_key not in reply.content.array_records:
            return None
        try:
            arrays = trainable_tensors(global_model, reply.content.array_records[arrays_key])
        except GradleakError:
            return None
        return arrays if self.fedsgd else {n: arrays[n] - before[n] for n in before}
