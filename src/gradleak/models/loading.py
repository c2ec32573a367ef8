"""Loading a victim model: a registered name (:mod:`gradleak.models.specs`), a local folder, or
an ``hf:ORG/NAME`` hub id (see :mod:`gradleak.models.sources` for how a name resolves).

Every model is loaded with eager attention (SDPA's CPU kernel has no double backward, and every
gradient-matching attack differentiates through the gradient) and in float32.

gradleak never runs a model folder's own code. A local folder whose ``config.json`` or
``tokenizer_config.json`` names classes of its own (``auto_map``) is refused with a one-line
error before transformers reads it (loading it as its ``model_type`` instead would quietly
measure another model), and every model, config and tokenizer loads with
``trust_remote_code=False``, so that a hub repository's code is refused the same way
(transformers would otherwise ask on the terminal, and a run without one would end in a
traceback).
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from gradleak.data.specs import TASKS
from gradleak.errors import GradleakError
from gradleak.models.adapters import ModelAdapter, adapter_for
from gradleak.models.cache import cache_dir
from gradleak.models.sources import HF_PREFIX, SMOLLM2_GGUF, external_source
from gradleak.models.specs import (
    MODELS,
    ModelSpec,
    check_model_name,
    family_adapter,
    model_status,
)
from gradleak.models.tasks import unwrap

__all__ = [
    "MODELS",
    "NUM_LABELS",
    "SMOLLM2_GGUF",
    "TASKS",
    "ModelSpec",
    "Victim",
    "cache_dir",
    "load_victim",
    "model_status",
    "task_of",
    "victim_of",
]

NUM_LABELS = 2

_AUTO_CLASSES = {
    "classification": AutoModelForSequenceClassification,
    "causal_lm": AutoModelForCausalLM,
    "qa": AutoModelForQuestionAnswering,
}


@dataclass
class Victim:
    """A model as the federation distributes it: weights, tokenizer, adapter, task."""

    name: str
    model: nn.Module
    tokenizer: PreTrainedTokenizerBase
    adapter: ModelAdapter
    task: str

    @property
    def is_decoder(self) -> bool:
        return self.adapter.is_decoder


def _resolve_source(name: str) -> Path | str:
    """The folder or hub id to load ``name`` from (registered models resolve offline)."""
    spec = MODELS.get(name)
    if spec is not None and spec.source is not None:
        return spec.source()
    check_model_name(name)  # a plugin that failed to load says why
    return external_source(name, MODELS)


def _describe(name: str, source: Path | str) -> str:
    if name.startswith(HF_PREFIX):
        return f"'{source}' from the Hugging Face hub"
    return f"model '{name}' from {source}"


# Passed to every from_pretrained: a model folder's own code is never run (see above).
NO_REMOTE_CODE = {"trust_remote_code": False}


def _load_tokenizer(name: str, source: Path | str) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(source, **NO_REMOTE_CODE)
    except (OSError, ValueError) as exc:
        raise _remote_code_refused(name, source, exc) or GradleakError(
            f"cannot load a tokenizer for {_describe(name, source)} "
            f"({exc.__class__.__name__}: {_first_line(exc)})"
        ) from None


def _remote_code_refused(name: str, source: Path | str, exc: Exception) -> GradleakError | None:
    """The one-line error for transformers' refusal to load a repository's own code, or None
    when ``exc`` is another problem."""
    if "trust_remote_code" not in str(exc):
        return None
    return _own_code_error(name, source, "its config")


def _own_code_error(name: str, source: Path | str, where: str) -> GradleakError:
    return GradleakError(
        f"{_describe(name, source)} names code of its own (auto_map in {where}), and gradleak "
        "does not run a model folder's own code: use a model that transformers' own classes "
        "load"
    )


def _check_no_own_code(name: str, source: Path | str) -> None:
    """Refuse a local folder whose config or tokenizer config names classes of its own."""
    if not isinstance(source, Path):
        return  # a hub id: transformers refuses it (trust_remote_code=False)
    for file in ("config.json", "tokenizer_config.json"):
        try:
            settings = json.loads((source / file).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # none, or unreadable: transformers says what is wrong
            continue
        if isinstance(settings, dict) and "auto_map" in settings:
            raise _own_code_error(name, source, file)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Hide load reports and progress bars (a fresh task head is always "missing")."""
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def load_victim(name: str, task: str = "classification", seed: int = 0) -> Victim:
    """Load model ``name`` with a head for ``task``; the head's random init depends on ``seed``.

    ``name`` is a registered model (:data:`MODELS`), an existing local model folder, or
    ``hf:ORG/NAME`` to fetch from the Hugging Face hub. The model starts in train mode.
    """
    with _quiet_transformers():
        return _load_victim(name, task, seed)


def _load_pretrained(
    name: str, source: Path | str, task: str
) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    tokenizer = _load_tokenizer(name, source)
    try:
        config = AutoConfig.from_pretrained(source, num_labels=NUM_LABELS, **NO_REMOTE_CODE)
    except (OSError, ValueError) as exc:
        raise _remote_code_refused(name, source, exc) or GradleakError(
            f"cannot load {_describe(name, source)} ({exc.__class__.__name__}: {_first_line(exc)})"
        ) from None
    try:
        model = _AUTO_CLASSES[task].from_pretrained(
            source,
            config=config,
            attn_implementation="eager",
            dtype=torch.float32,
            **NO_REMOTE_CODE,
        )
    except ValueError as exc:
        raise _remote_code_refused(name, source, exc) or GradleakError(
            f"model '{name}' ({config.model_type}) has no {task} head in transformers: "
            f"{_first_line(exc)}"
        ) from None
    return model, tokenizer


def _load_victim(name: str, task: str, seed: int) -> Victim:
    if task not in TASKS:
        raise GradleakError(f"unknown task '{task}': use one of {', '.join(TASKS)}")
    spec = MODELS.get(name)
    build = spec.build if spec is not None else None
    # Resolved before seeding: a first-use conversion draws random numbers (it builds a model
    # from its config), and the head's init must not depend on whether one ran.
    source = spec.tokenizer_source() if spec is not None and build else _resolve_source(name)
    _check_no_own_code(name, source)
    torch.manual_seed(seed)
    if build is not None:
        tokenizer = _load_tokenizer(name, source)
        model = build(_AUTO_CLASSES[task], tokenizer, NUM_LABELS)
    else:
        model, tokenizer = _load_pretrained(name, source, task)
    adapter = _adapter(name, model)
    _ensure_pad_token(tokenizer, model)
    model.train()  # the realistic client mode; scenarios switch explicitly
    return Victim(name=name, model=model, tokenizer=tokenizer, adapter=adapter, task=task)


def _adapter(name: str, model: nn.Module) -> ModelAdapter:
    model_type = model.config.model_type
    adapter = adapter_for(model_type)
    if adapter is None:
        brought = family_adapter(model_type)
        adapter = brought() if brought is not None else None
    if adapter is None:
        raise GradleakError(
            f"model '{name}' is a {model_type} model; gradleak has adapters for bert, gpt2, "
            "llama and mpnet: register a ModelSpec with an adapter for its family"
        )
    return adapter


# The head class's name says the task (peft keeps the wrapped model's class underneath).
_TASK_OF_HEAD = {
    "ForSequenceClassification": "classification",
    "ForCausalLM": "causal_lm",
    "LMHeadModel": "causal_lm",
    "ForQuestionAnswering": "qa",
}


def task_of(model: nn.Module) -> str:
    """The task of a transformers model's head (``BertForSequenceClassification``:
    classification)."""
    head = type(unwrap(model)).__name__
    for suffix, task in _TASK_OF_HEAD.items():
        if head.endswith(suffix):
            return task
    raise GradleakError(
        f"cannot tell the task of a {head}: pass task= classification, causal_lm or qa"
    )


def victim_of(model: nn.Module, tokenizer: PreTrainedTokenizerBase, task: str) -> Victim:
    """The caller's own model and tokenizer as a victim, on copies: a protocol wraps, freezes
    or sets dropout in the victim's model, and a decoder's tokenizer gets a pad token, while
    the caller's objects stay exactly as they were."""
    if task not in TASKS:
        raise GradleakError(f"unknown task '{task}': use one of {', '.join(TASKS)}")
    name = getattr(model.config, "name_or_path", "") or type(model).__name__
    model = copy.deepcopy(model)
    for parameter in model.parameters():
        parameter.grad = None  # the caller's last backward pass is no part of this model
    adapter = _adapter(name, model)
    if tokenizer.pad_token_id is None:
        tokenizer = copy.deepcopy(tokenizer)
    _ensure_pad_token(tokenizer, model)
    return Victim(name=name, model=model, tokenizer=tokenizer, adapter=adapter, task=task)


def _ensure_pad_token(tokenizer: PreTrainedTokenizerBase, model: nn.Module) -> None:
    """Decoders often ship without a pad token; batches need one (the EOS, by convention)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
