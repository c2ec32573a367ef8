"""Private data for the clients: named benchmark datasets, the built-in demo, the user's files.

The public API, in one place::

    from gradleak.data import load_examples, sample_batches
    batches = sample_batches(load_examples("cola", data_dir), n_inputs=100, batch_size=1)
"""

from gradleak.data.datasets import (
    DATASETS,
    ENV_DATA_DIR,
    FILE_PREFIX,
    DatasetInfo,
    dataset_status,
    load_examples,
    load_file,
    resolve_data_dir,
)
from gradleak.data.demo import demo_examples
from gradleak.data.examples import Example
from gradleak.data.sampling import lamp_order, sample_batches

__all__ = [
    "DATASETS",
    "ENV_DATA_DIR",
    "FILE_PREFIX",
    "DatasetInfo",
    "Example",
    "dataset_status",
    "demo_examples",
    "lamp_order",
    "load_examples",
    "load_file",
    "resolve_data_dir",
    "sample_batches",
]
