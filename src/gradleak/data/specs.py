"""The named datasets: one :class:`DatasetSpec` row each.

Adding a dataset is one :class:`DatasetSpec` registered in :data:`DATASETS` (plus a reader in
:mod:`gradleak.data.formats` when its files are in a new format). Files are paths relative to
the data directory, which is laid out like the benchmark data folder (``cola/v1.0/...``,
``sst2/...``). Another package registers its datasets through the entry-point group
``gradleak.datasets`` (a :class:`DatasetSpec`, whose ``format`` may be its own
:class:`~gradleak.data.formats.Format`).

Each split holds exactly what Hugging Face ``datasets`` returns for it, rows and order alike:
LAMP loads its data from the hub (``load_dataset('glue', name)['train']``,
``load_dataset('rotten_tomatoes')['train']``) and picks its inputs by index, so a different
order or number of rows would give different private batches than the papers'.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gradleak.data.formats import FORMATS, Format
from gradleak.registry import Catalog

TASKS = ("classification", "causal_lm", "qa")


@dataclass(frozen=True)
class DatasetSpec:
    """What gradleak knows about a named dataset.

    ``task``: what the dataset is naturally used for ("classification", "causal_lm" or "qa").
    ``format``: the key of its reader in :data:`gradleak.data.formats.FORMATS`, or a
    :class:`~gradleak.data.formats.Format` of its own.
    ``split_files``: for each split, the files read (in this order) under the data directory.
    ``default_split``: the split used when none is asked for.
    ``hub``: the Hugging Face hub repository and config that ``hf:NAME`` loads (None: none).
    ``not_shared``: files the split layout names but the benchmark data folder lacks (there is
    nowhere to get them offline); a loader that misses one suggests the default split instead.
    """

    name: str
    task: str
    description: str
    format: str | Format
    split_files: Mapping[str, tuple[str, ...]]
    default_split: str = "train"
    hub: tuple[str, str | None] | None = None
    not_shared: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"dataset {self.name!r}: unknown task {self.task!r}")
        if self.default_split not in self.split_files:
            raise ValueError(f"dataset {self.name!r}: no files for split {self.default_split!r}")

    @property
    def reading(self) -> Format:
        """How its files are read (and its hub rows converted)."""
        return self.format if isinstance(self.format, Format) else FORMATS[self.format]

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits :func:`gradleak.data.load_examples` accepts for this dataset."""
        return tuple(self.split_files)

    @property
    def files(self) -> tuple[str, ...]:
        """Every file of the benchmark data folder that this dataset reads, each once."""
        seen: dict[str, None] = {}
        for paths in self.split_files.values():
            seen.update((path, None) for path in paths if path not in self.not_shared)
        return tuple(seen)


DatasetInfo = DatasetSpec  # the earlier name

_RT_FILES = ("rotten_tomatoes/rt-polarity.pos", "rotten_tomatoes/rt-polarity.neg")

_SPECS = (
    DatasetSpec(
        name="cola",
        task="classification",
        description="CoLA v1.0 (GLUE): 8,551 train sentences, grammatical acceptability 1/0",
        format="cola-tsv",
        split_files={
            "train": ("cola/v1.0/in_domain_train.tsv",),
            # GLUE / HF glue/cola "validation" (1,043 rows) = in-domain then out-of-domain dev.
            "validation": ("cola/v1.0/in_domain_dev.tsv", "cola/v1.0/out_of_domain_dev.tsv"),
        },
        hub=("nyu-mll/glue", "cola"),
    ),
    DatasetSpec(
        name="sst2",
        task="classification",
        description="SST-2 (GLUE): 67,349 movie-review phrases, sentiment 1 = positive",
        format="glue-tsv",
        split_files={"train": ("sst2/train.tsv",), "validation": ("sst2/dev.tsv",)},
        hub=("nyu-mll/glue", "sst2"),
    ),
    DatasetSpec(
        name="rotten_tomatoes",
        task="classification",
        description="Rotten Tomatoes (Pang & Lee): 8,530/1,066/1,066 snippets, 1 = positive",
        format="polarity",
        # One pair of files; each split is its own slice of both (see formats.polarity).
        split_files={split: _RT_FILES for split in ("train", "validation", "test")},
        hub=("cornell-movie-review-data/rotten_tomatoes", None),
    ),
    DatasetSpec(
        name="squad",
        task="qa",
        description="SQuAD v1.1: questions (the private text) over Wikipedia paragraphs",
        format="squad-json",
        split_files={"train": ("squad/train-v1.1.json",), "validation": ("squad/dev-v1.1.json",)},
        default_split="validation",
        hub=("rajpurkar/squad", None),
        not_shared=frozenset({"squad/train-v1.1.json"}),
    ),
    DatasetSpec(
        name="wikitext2",
        task="causal_lm",
        description="WikiText-2 raw: Wikipedia paragraphs, one per line, headings dropped",
        format="wikitext-raw",
        split_files={
            "train": ("wikitext2/wiki.train.raw",),
            "validation": ("wikitext2/wiki.valid.raw",),
            "test": ("wikitext2/wiki.test.raw",),
        },
        default_split="validation",
        hub=("Salesforce/wikitext", "wikitext-2-raw-v1"),
        not_shared=frozenset({"wikitext2/wiki.train.raw"}),
    ),
    DatasetSpec(
        name="demo",
        task="classification",
        description="16 invented private messages (names, health, money), built in",
        format="demo",
        split_files={"train": ()},
    ),
)

DATASETS: Catalog[DatasetSpec] = Catalog("dataset", "gradleak.datasets", DatasetSpec)
for _spec in _SPECS:
    DATASETS.register(_spec)
