"""Private data for the clients: named benchmark datasets, the built-in demo, the user's files,
and datasets from the Hugging Face hub.

The public API, in one place::

    from gradleak.data import load_examples, sample_batches
    batches = sample_batches(load_examples("cola", data_dir), n_inputs=100, batch_size=1)

Modules: :mod:`~gradleak.data.specs` (the table of named datasets), :mod:`~gradleak.data.formats`
(one reader per file format), :mod:`~gradleak.data.sources` (registered name, ``file:PATH`` or
``hf:NAME`` to examples), :mod:`~gradleak.data.userfiles`, :mod:`~gradleak.data.hub`,
:mod:`~gradleak.data.labels` (labels for unlabeled files), :mod:`~gradleak.data.chunks`
(fixed-length token chunks of a causal-LM dataset), :mod:`~gradleak.data.sampling`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradleak.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from gradleak.data.builtin import demo_examples
    from gradleak.data.chunks import chunk_examples, require_chunkable, token_stream
    from gradleak.data.examples import Example
    from gradleak.data.hub import HF_PREFIX, load_hub
    from gradleak.data.labels import LABEL_CHOICES, assign_labels
    from gradleak.data.sampling import lamp_order, sample_batches
    from gradleak.data.sources import (
        ENV_DATA_DIR,
        FILE_PREFIX,
        dataset_status,
        get_spec,
        load_examples,
        natural_task,
        resolve_data_dir,
    )
    from gradleak.data.specs import DATASETS, DatasetInfo, DatasetSpec
    from gradleak.data.userfiles import load_file

# loaded on first use: listing the datasets needs none of the readers' libraries
__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "demo_examples": "gradleak.data.builtin",
        "chunk_examples": "gradleak.data.chunks",
        "require_chunkable": "gradleak.data.chunks",
        "token_stream": "gradleak.data.chunks",
        "Example": "gradleak.data.examples",
        "HF_PREFIX": "gradleak.data.hub",
        "load_hub": "gradleak.data.hub",
        "LABEL_CHOICES": "gradleak.data.labels",
        "assign_labels": "gradleak.data.labels",
        "lamp_order": "gradleak.data.sampling",
        "sample_batches": "gradleak.data.sampling",
        "ENV_DATA_DIR": "gradleak.data.sources",
        "FILE_PREFIX": "gradleak.data.sources",
        "dataset_status": "gradleak.data.sources",
        "get_spec": "gradleak.data.sources",
        "load_examples": "gradleak.data.sources",
        "natural_task": "gradleak.data.sources",
        "resolve_data_dir": "gradleak.data.sources",
        "DATASETS": "gradleak.data.specs",
        "DatasetInfo": "gradleak.data.specs",
        "DatasetSpec": "gradleak.data.specs",
        "load_file": "gradleak.data.userfiles",
    },
)

__all__ = [
    "DATASETS",
    "ENV_DATA_DIR",
    "FILE_PREFIX",
    "HF_PREFIX",
    "LABEL_CHOICES",
    "DatasetInfo",
    "DatasetSpec",
    "Example",
    "assign_labels",
    "chunk_examples",
    "dataset_status",
    "demo_examples",
    "get_spec",
    "lamp_order",
    "load_examples",
    "load_file",
    "load_hub",
    "natural_task",
    "require_chunkable",
    "resolve_data_dir",
    "sample_batches",
    "token_stream",
]
