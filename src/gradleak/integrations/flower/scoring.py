"""How an audit entry is scored, once its attack has returned: against the client's own batch
(a simulation, through the ledger) or against the canaries (what a real operator knows).

Both compare token ids where they decide exact recovery (decoding puts spaces where the text
had none: "1,450" comes back "1, 450"), as a run's evaluation does.
"""

from __future__ import annotations

from collections.abc import Sequence

from gradleak.federated.client import GlobalModel
from gradleak.integrations.flower.audit import AuditEntry
from gradleak.integrations.flower.canaries import canary_scores
from gradleak.integrations.flower.ledger import Ledger
from gradleak.integrations.flower.setup import Canary
from gradleak.running.recipe import evaluate


class SimulationScorer:
    """A run's scores (strict: Hungarian-matched ROUGE and exact match by token ids; paper:
    as the attack's paper pairs) of the reconstruction against the batch the client wrote to
    the ledger for that round, tokenized as the client tokenized it."""

    def __init__(
        self, ledger: Ledger, global_model: GlobalModel, max_tokens: int | None = None
    ) -> None:
        self.ledger = ledger
        self.global_model = global_model
        self.max_tokens = max_tokens

    def __call__(self, entry: AuditEntry) -> None:
        batch = self.ledger.read(entry.round, entry.node)
        if batch is None:
            entry.scores["simulation"] = None  # not one of gradleak's clients
            return
        encoded = self.global_model.encode(batch, self.max_tokens)
        references = [
            row[:length].tolist()
            for row, length in zip(encoded.input_ids, encoded.lengths, strict=True)
        ]
        tokenizer = self.global_model.victim.tokenizer
        entry.scores["simulation"] = evaluate(
            entry.round, tokenizer, references, entry.token_ids, entry.pairing
        )


class CanaryScorer:
    """How much of each canary the reconstruction holds (see ``canaries.canary_scores``)."""

    def __init__(self, canaries: Sequence[Canary], global_model: GlobalModel) -> None:
        self.canaries = list(canaries)
        self.tokenizer = global_model.victim.tokenizer

    def __call__(self, entry: AuditEntry) -> None:
        entry.scores["canaries"] = canary_scores(self.canaries, entry.token_ids, self.tokenizer)
