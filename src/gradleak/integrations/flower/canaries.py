"""Canaries: records a client plants in its own data, so that an operator who knows only
them can measure what the updates leak, in a deployment as in a simulation.

A canary is a sentence with secrets in it (a name, a number). A planting client puts
``per_round`` of them in each round's batch, taking turns; the audit scores every
reconstruction against every canary: exact recovery, the best ROUGE of any reconstructed
sentence, and which secrets appear anywhere in the reconstruction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from gradleak.data import Example
from gradleak.evaluation import metrics
from gradleak.federated.canary_records import CanaryRecords, vocabulary_words
from gradleak.federated.client import GlobalModel
from gradleak.integrations.flower.setup import Canary, FederationSetup
from gradleak.models.tasks import unwrap
from gradleak.runtime.seeds import derived_seed

RECORDS_STREAM = 2001  # the measured records' seed, apart from the clients' and the attacks'
CANARY_CLIENTS_STREAM = 2000  # the canary clients' seed


def measured_records(setup: FederationSetup, global_model: GlobalModel) -> CanaryRecords | None:
    """The federation's canary records for a measured epsilon, as every party draws them
    from the setup's seed and the public model (None without ``canaries.measured``)."""
    if not setup.canaries.measured:
        return None
    labels = ()
    if setup.task == "classification":
        labels = tuple(range(unwrap(global_model.model).config.num_labels))
    return CanaryRecords(
        setup.canaries.measured,
        setup.rounds,
        setup.partition.clients,
        derived_seed(setup.seed, 0, RECORDS_STREAM),
        vocabulary_words(global_model.victim.tokenizer),
        labels,
    )


def planted(canaries: Sequence[Canary], server_round: int, per_round: int) -> list[Example]:
    """The canaries a planting client adds to its batch of ``server_round`` (rounds from 1):
    ``per_round`` of them, the next ones each round."""
    if not canaries:
        return []
    start = (server_round - 1) * per_round
    chosen = [canaries[(start + i) % len(canaries)] for i in range(min(per_round, len(canaries)))]
    return [Example(text=c.text, label=c.label) for c in chosen]


def _squeezed(text: str) -> str:
    """Lowercased with every space removed: "4 921" and "4921" name the same secret."""
    return "".join(text.lower().split())


def canary_scores(
    canaries: Sequence[Canary],
    predictions_ids: Sequence[Sequence[int]],
    tokenizer: PreTrainedTokenizerBase,
) -> list[dict[str, Any]]:
    """For each canary, how much of it one reconstruction (token ids per sentence) recovers:
    ``exact`` (a sentence with the canary's token ids), ``rouge1``/``rouge2``/``rougeL`` of the
    best-matching sentence, and ``secrets`` found anywhere in the reconstruction's text."""
    special = set(tokenizer.all_special_ids)

    def clean(ids: Sequence[int]) -> list[int]:
        return [int(t) for t in ids if int(t) not in special]

    predictions = [clean(ids) for ids in predictions_ids]
    texts = [tokenizer.decode(ids).strip() for ids in predictions]
    whole = _squeezed(" ".join(texts))
    scores = []
    for canary in canaries:
        own = clean(tokenizer(canary.text)["input_ids"])
        best = metrics.strict_scores(texts, [tokenizer.decode(own)]).pairs[0] if texts else None
        found = [s for s in canary.secrets if _squeezed(s) in whole]
        scores.append(
            {
                "canary": canary.text,
                "exact": own in predictions,
                "rouge1": best.rouge1 if best else 0.0,
                "rouge2": best.rouge2 if best else 0.0,
                "rougeL": best.rougeL if best else 0.0,
                "secrets": found,
                "secrets_total": len(canary.secrets),
            }
        )
    return scores
