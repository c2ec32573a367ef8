"""What an optimization attack needs known (lengths, labels) and, for a classification batch
with unknown labels, the label assignments it tries."""

from __future__ import annotations

import itertools

import torch

from gradleak.errors import GradleakError
from gradleak.federated.server import ServerKnowledge
from gradleak.models.tasks import unwrap

# Enumerating unknown labels costs one scoring pass (or one attack) per assignment.
MAX_LABEL_ASSIGNMENTS = 64


def check_optimization_applies(
    knowledge: ServerKnowledge, name: str, label_search: str = "none"
) -> None:
    """DLG-style attacks need the lengths and, for classification and QA, the labels (or, for
    classification, a label search)."""
    if knowledge.template_ids is None:
        raise GradleakError(f"attack {name} needs known sequence lengths: pass --known-lengths")
    task = knowledge.global_model.task
    if task == "causal_lm" or knowledge.labels is not None:
        return
    if task != "classification":
        raise GradleakError(f"attack {name} needs known labels: pass --known-labels")
    if label_search == "none":
        raise GradleakError(
            f"attack {name} needs known labels: pass --known-labels, or --label-search init"
        )
    count = _num_labels(knowledge) ** knowledge.batch_size
    if count > MAX_LABEL_ASSIGNMENTS:
        raise GradleakError(
            f"unknown labels of a batch of {knowledge.batch_size} give {count} assignments "
            f"(at most {MAX_LABEL_ASSIGNMENTS}): pass --known-labels or a smaller batch"
        )


def _num_labels(knowledge: ServerKnowledge) -> int:
    return int(unwrap(knowledge.global_model.model).config.num_labels)


def label_assignments(
    knowledge: ServerKnowledge, search: str
) -> list[dict[str, torch.Tensor] | None]:
    """The label sets to try: the known labels, or every assignment of a classification batch."""
    if knowledge.labels is not None or search == "none":
        return [knowledge.labels]
    choices = itertools.product(range(_num_labels(knowledge)), repeat=knowledge.batch_size)
    device = knowledge.global_model.device
    return [{"label": torch.tensor(choice, device=device)} for choice in choices]
