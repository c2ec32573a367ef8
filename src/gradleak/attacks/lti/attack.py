"""LTI and LTI-P as attacks: train (or load) the inversion model for the scenario, then read
each client update through it.

The inversion model is trained once per scenario and reused for every input of a run, and
across runs through the checkpoint cache. It is the server's own work: auxiliary or pseudo
text, the global model and the public defenses; the private batch never reaches it (the
evaluator checks that the auxiliary text holds none of the private examples).
"""

from __future__ import annotations

import time
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradleak.attacks.base import Attack, Plan, Reconstruction
from gradleak.attacks.lti import checkpoint
from gradleak.attacks.lti.batches import (
    TokenDistribution,
    aux_contents,
    content_ids,
    fill_template,
)
from gradleak.attacks.lti.hashing import FeatureHasher
from gradleak.attacks.lti.model import FIRST, InversionModel
from gradleak.attacks.lti.pairs import UpdateSampler, require_modelled, update_features
from gradleak.attacks.lti.settings import LtiPSettings, LtiSettings
from gradleak.attacks.lti.training import TrainingBudget, predict, train_inverter
from gradleak.data import chunk_examples, load_examples
from gradleak.data.specs import DATASETS
from gradleak.defenses import build_defenses
from gradleak.errors import GradleakError, GradleakNotice, last_line
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.server import ServerKnowledge
from gradleak.models.cache import digest, texts_digest, weights_digest
from gradleak.models.tasks import unwrap
from gradleak.runtime.progress import progress_bar

# The first layer holds k x 600 weights: beyond this many bytes, hash to fewer bins.
MAX_FIRST_LAYER_BYTES = 4 * 2**30
NUM_LABELS = 2


@dataclass
class LtiPlan(Plan):
    keys: list[str]
    size: int  # coordinates of the features before hashing
    bins: int


@dataclass
class _Trained:
    model: InversionModel
    info: dict[str, Any]


class LtiAttack(Attack[LtiSettings]):
    """Learning to Invert (Wu et al. 2023): LTI on auxiliary text, LTI-P on pseudo-text."""

    description = "a learned inversion model of hashed updates (Wu et al. 2023)"

    def __init__(self, settings: LtiSettings) -> None:
        super().__init__(settings)
        self._trained: dict[str, _Trained] = {}
        # What every input of a run shares, computed at the first: the auxiliary text (loaded,
        # chunked, tokenized) and the global weights' digest (held while the model lives).
        self._data: dict[tuple, tuple[list[list[int]], list[str], dict[str, Any]]] = {}
        self._weights: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
        self._texts: frozenset[str] = frozenset()

    @property
    def pseudo(self) -> bool:
        return isinstance(self.settings, LtiPSettings)

    def release(self) -> None:
        self._trained, self._data, self._texts = {}, {}, frozenset()
        self._weights = weakref.WeakKeyDictionary()

    def training_texts(self) -> frozenset[str]:
        return self._texts

    # --- whether it applies ---------------------------------------------------------------

    def check(self, update: UpdatePayload, knowledge: ServerKnowledge) -> LtiPlan:
        if update.kind != "gradient":
            raise GradleakError(
                f"{self.name} learns to invert FedSGD gradients (Wu et al.'s setting); a FedAvg "
                "weight delta needs --protocol fedsgd, or attack it with dager or lamp"
            )
        if knowledge.template_ids is None:
            raise GradleakError(
                f"{self.name} predicts a fixed number of tokens and needs the private lengths: "
                "use --known-lengths"
            )
        require_modelled(build_defenses(knowledge.defenses), self.name)
        keys = feature_keys(update, knowledge)
        size = sum(update.tensors[key].numel() for key in keys)
        bins = max(1, round(self.settings.hash_fraction * size))
        if bins * FIRST * 4 > MAX_FIRST_LAYER_BYTES:
            raise GradleakError(
                f"the update has {size:,} coordinates: {self.settings.hash_fraction:g} of them "
                f"is {bins:,} bins and a first layer of {bins * FIRST * 4 / 2**30:.1f} GiB; "
                "lower --hash-fraction"
            )
        return LtiPlan(keys=keys, size=size, bins=bins)

    # --- the attack ---------------------------------------------------------------------------

    def run(
        self, update: UpdatePayload, knowledge: ServerKnowledge, plan: Plan, seed: int
    ) -> Reconstruction:
        assert isinstance(plan, LtiPlan)
        started = time.perf_counter()
        hasher = FeatureHasher(
            plan.size, plan.bins, self.settings.hash_seed, self.settings.signed_hash
        )
        trained = self._inverter(update, knowledge, plan, hasher)
        ready = time.perf_counter()
        weight = next(trained.model.parameters())  # a float64 client's update is read in
        features = update_features(update, plan.keys, hasher).to(weight)  # the model's dtype
        contents = predict(trained.model, features[None])
        ids = fill_template(knowledge.template_ids, contents)[0]
        token_ids = [
            row[:length].tolist() for row, length in zip(ids, knowledge.lengths, strict=True)
        ]
        seconds = {"train": ready - started, "invert": time.perf_counter() - ready}
        return Reconstruction(token_ids=token_ids, info=dict(trained.info), seconds=seconds)

    def _inverter(
        self,
        update: UpdatePayload,
        knowledge: ServerKnowledge,
        plan: LtiPlan,
        hasher: FeatureHasher,
    ) -> _Trained:
        """The trained model for this scenario: held, cached on disk, given, or trained now."""
        sequences, texts, source = self._training_data(knowledge)
        key = self._key(update, knowledge, plan, hasher, texts, source)
        name = digest(key)
        if name in self._trained:
            return self._trained[name]
        model = self._model(knowledge, plan)
        path = (
            checkpoint.cached_path(key)
            if self.settings.checkpoint is None
            else Path(self.settings.checkpoint)
        )
        if self.settings.checkpoint is not None:
            state, info = checkpoint.load(path, key)
            model.load_state_dict(state, strict=False)
            info = info | {"checkpoint": str(path), "trained_now": False}
        else:
            with checkpoint.exclusive(path, waiting=lambda: _waiting(path)):
                loaded = _cached(model, path, key)
                if loaded is not None:
                    info = loaded | {"checkpoint": str(path), "trained_now": False}
                else:
                    if path.exists():  # unreadable, and a failed load may have written into it
                        path.unlink(missing_ok=True)
                        model = self._model(knowledge, plan)
                    job = path.with_name(path.stem + ".job.safetensors")  # resumed if stopped
                    _drop_unreadable_snapshot(job)
                    info = self._train(model, knowledge, plan, hasher, sequences, source, job)
                    checkpoint.save(path, model.state_dict(), key, info)
                    job.unlink(missing_ok=True)
                    info = info | {"checkpoint": str(path), "trained_now": True}
        trained = _Trained(model, info)
        self._trained[name] = trained
        self._texts = self._texts | frozenset(texts)
        return trained

    def _model(self, knowledge: ServerKnowledge, plan: LtiPlan) -> InversionModel:
        gm = knowledge.global_model
        table = gm.adapter.token_embedding(unwrap(gm.model)).weight
        free = int((knowledge.template_ids < 0).sum())
        torch.manual_seed(self.settings.hash_seed)  # the model's init: part of its key
        model = InversionModel(
            plan.bins, free, table.shape[0], head=self.settings.head, embedding=table
        )
        return model.to(gm.device)

    def _train(
        self, model, knowledge, plan, hasher, sequences, source, job: Path
    ) -> dict[str, Any]:
        s = self.settings
        mode = knowledge.global_model.protocol.mode
        sampler = UpdateSampler(knowledge, plan.keys, hasher, mode)
        draw = self._draw(knowledge, sequences, source)
        budget = TrainingBudget(
            steps=s.train_steps,
            batch=s.train_batch,
            lr=s.train_lr,
            eval_every=s.eval_every,
            patience=s.patience,
            held_out=s.held_out,
        )
        generator = torch.Generator().manual_seed(s.hash_seed)
        with progress_bar(f"training the {self.name} inversion model", s.train_steps) as bar:
            report = train_inverter(model, sampler, draw, budget, generator, bar, job)
        return {
            "training": {
                "data": source,
                "steps": report.steps,
                "updates": report.samples,
                "seconds": round(report.seconds, 1),
                "held_out_loss": report.best_loss,
                "held_out_token_accuracy": report.best_accuracy,
                # the learning curve: the held-out loss every ``eval_every`` steps, which says
                # where a longer training is heading
                "eval_every": budget.eval_every,
                "held_out_losses": [round(loss, 5) for loss in report.losses],
            },
            "features": {"coordinates": plan.size, "bins": plan.bins},
        }

    def _draw(self, knowledge: ServerKnowledge, sequences: list[list[int]], source: dict):
        """The source of training batches' free tokens (and labels)."""
        gm = knowledge.global_model
        template = knowledge.template_ids.to("cpu")
        free = int((template < 0).sum())
        known = None if knowledge.labels is None else knowledge.labels.get("label")
        classify = gm.task == "classification"

        def labels_for(n: int, generator: torch.Generator) -> torch.Tensor | None:
            if not classify:
                return None
            if known is not None:
                return known.to("cpu").expand(n, -1)
            shape = (n, knowledge.batch_size)
            return torch.randint(NUM_LABELS, shape, generator=generator, device="cpu")

        if self.pseudo:
            vocab = gm.adapter.token_embedding(unwrap(gm.model)).weight.shape[0]
            distribution = TokenDistribution.count(sequences, vocab, str(source))

            def draw(n: int, generator: torch.Generator, held_out: bool = False):
                contents = distribution.draw(n * free, generator).view(n, free)
                return contents, labels_for(n, generator)

            return draw
        pool = aux_contents(sequences, template)
        s = self.settings
        if len(pool) < s.held_out + s.train_batch:
            raise GradleakError(
                f"the auxiliary text gives {len(pool)} batches of the private batch's shape, "
                f"fewer than --held-out ({s.held_out}) plus one --train-batch ({s.train_batch}): "
                "give more auxiliary text or lower --held-out"
            )
        # the held-out batches are set aside once, at random, and never trained on
        aside = torch.randperm(len(pool), generator=torch.Generator().manual_seed(s.hash_seed))
        held, kept = aside[: s.held_out], aside[s.held_out :]
        order: list[int] = []

        def draw_aux(n: int, generator: torch.Generator, held_out: bool = False):
            nonlocal order
            if held_out:
                return pool[held], labels_for(len(held), generator)
            picked = []
            for _ in range(n):  # epochs over the rest of the pool, shuffled each time
                if not order:
                    order = kept[torch.randperm(len(kept), generator=generator)].tolist()
                picked.append(order.pop())
            return pool[picked], labels_for(n, generator)

        return draw_aux

    # --- the training data ------------------------------------------------------------------

    def _training_data(
        self, knowledge: ServerKnowledge
    ) -> tuple[list[list[int]], list[str], dict[str, Any]]:
        """The auxiliary text (LTI's training data, LTI-P's token counts) as content token ids
        and as texts (the evaluator's overlap check), and its description for the record.
        Where the private samples are N-token chunks of a stream, so is the auxiliary text."""
        s = self.settings
        public = knowledge.public_data
        name = s.aux_dataset or (public.dataset if public else None)
        if self.pseudo and s.token_distribution:
            name = s.token_distribution
        if name is None:
            raise GradleakError(
                f"{self.name} needs auxiliary text: give --aux-dataset (a dataset name, "
                "file:PATH or hf:NAME)"
            )
        # by default, another split of the private dataset; text named explicitly is taken whole
        same = public is not None and name == public.dataset and s.aux_dataset is None
        split = s.aux_split or (other_split(name, public.split) if same else None)
        data_dir = s.aux_data_dir or (public.data_dir if public else None)
        tokenizer = knowledge.global_model.victim.tokenizer
        chunk = public.chunk_tokens if public else None
        wanted = (name, split, data_dir, chunk, tokenizer.name_or_path, len(tokenizer))
        if wanted not in self._data:
            self._data[wanted] = self._read(name, split, data_dir, chunk, tokenizer)
        return self._data[wanted]

    def _read(self, name, split, data_dir, chunk, tokenizer):
        """The auxiliary text as :meth:`_training_data` returns it, read from its source."""
        s = self.settings
        examples = load_examples(name, data_dir, split)
        if chunk is not None:
            examples = chunk_examples(examples, tokenizer, chunk, f"auxiliary text {name!r}")
        examples = examples[: s.aux_size]
        texts = [ex.text for ex in examples]
        sequences = [
            list(ex.token_ids) if ex.token_ids is not None else content_ids(tokenizer, ex.text)
            for ex in examples
        ]
        source = {"dataset": name, "split": split, "texts": len(texts), "chunk_tokens": chunk}
        return sequences, texts, source | {"fingerprint": texts_digest(texts)}

    def _key(self, update, knowledge, plan, hasher, texts, source) -> dict[str, Any]:
        gm = knowledge.global_model
        if gm.model not in self._weights:
            params = dict(gm.model.named_parameters())
            tensors = [params[x.param] for x in gm.specs]
            self._weights[gm.model] = weights_digest(tensors)
        s = self.settings
        return {
            "attack": self.name,
            "model": gm.victim.name,
            "task": gm.task,
            "weights": self._weights[gm.model],
            "template": knowledge.template_ids.tolist(),
            "labels": {k: v.tolist() for k, v in (knowledge.labels or {}).items()},
            "mode": gm.protocol.mode,
            "defenses": [d.model_dump(mode="json") for d in knowledge.defenses],
            "tensors": plan.keys,
            "hashing": [hasher.m, hasher.k, hasher.seed, hasher.signed],
            "head": s.head,
            "inputs": "standardized",  # per-bin, from the held-out pairs
            "data": source if self.pseudo else source | {"held_out": "set aside"},
            "budget": [s.train_steps, s.train_batch, s.train_lr, s.eval_every, s.patience,
                       s.held_out],
        }  # fmt: skip


def feature_keys(update: UpdatePayload, knowledge: ServerKnowledge) -> list[str]:
    """The update's tensors the inversion model reads, in the update's order: all of them but
    a token embedding tied to the output layer (Wu et al. leave the embedding out)."""
    gm = knowledge.global_model
    hf = unwrap(gm.model)
    table = gm.adapter.token_embedding(hf).weight
    tied = [n for n, p in gm.model.named_parameters() if p is table]
    tied_to_head = getattr(hf.config, "tie_word_embeddings", False) and gm.task == "causal_lm"
    skipped = {s.key for s in gm.specs if s.param in tied} if tied_to_head else set()
    keys = [s.key for s in gm.specs if s.key in update.tensors and s.key not in skipped]
    if not keys:
        raise GradleakError("the update holds no tensor the inversion model can read")
    return keys


def other_split(dataset: str, private: str | None) -> str:
    """A split of ``dataset`` the private texts are not drawn from."""
    spec = DATASETS.get(dataset)
    if spec is None:
        raise GradleakError(
            f"{dataset} has no named splits: give the auxiliary text with --aux-dataset"
        )
    private = private or spec.default_split
    # splits whose files the benchmark data folder has (wikitext2's train split is not in it)
    others = [
        split
        for split in spec.splits
        if split != private and not set(spec.split_files[split]) <= spec.not_shared
    ]
    if not others:
        raise GradleakError(
            f"{dataset} has one split, which the private texts come from: give auxiliary text "
            "with --aux-dataset"
        )
    return others[0]


# --- the cache of trained models --------------------------------------------------------------


def _cached(model: InversionModel, path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The info of the cached model at ``path``, loaded into ``model``; None when there is
    none, or one that cannot be read (a notice says so, and it is trained again)."""
    if not path.is_file():
        return None
    try:
        state, info = checkpoint.load(path, key)
        model.load_state_dict(state, strict=False)
    except (GradleakError, RuntimeError) as exc:
        warnings.warn(
            f"the cached inversion model {path} is unreadable ({last_line(str(exc))}): "
            "training it again",
            GradleakNotice,
            stacklevel=3,
        )
        return None
    return info


def _drop_unreadable_snapshot(job: Path) -> None:
    """A training snapshot that cannot be read (torn by a kill) is set aside: the training
    starts from the beginning instead of failing every later run."""
    if not job.is_file():
        return
    reason = checkpoint.unreadable(job, {"snapshot": True})
    if reason is not None:
        warnings.warn(
            f"the training snapshot {job} is unreadable ({last_line(reason)}): training from "
            "the start",
            GradleakNotice,
            stacklevel=3,
        )
        job.unlink(missing_ok=True)


def _waiting(path: Path) -> None:
    warnings.warn(
        f"another run is training the same inversion model ({path}): waiting for it, then "
        "loading its model",
        GradleakNotice,
        stacklevel=4,
    )
