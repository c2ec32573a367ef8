"""Sentences grown from each likely first word under public noise (not in DAGER).

Under noise one layer's cut span no longer separates a prefix's true next token from the
batch's other tokens, and the prefix search, which keeps the batch's nearest trials over all
prefixes at once, loses the weaker sentences to variants of the strongest. Here each likely
first token grows a beam of its own, so that one sentence's variants cannot crowd out another
sentence, and an extension is scored by the mean log distance of its new position to the cut
spans of layers 2 to 4 (each layer's noise is drawn on its own) plus a light language
prior. No prefix is judged by a cut: the
best few of each beam at every length are handed to the embedding rows' whole-sentence check
(``confirm.py``), which tells the true sentences from the rest. Measured:
docs/design/dager-noise.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from gradleak.attacks.dager.check import LayerCheck, layer_check
from gradleak.attacks.dager.decoder import last_position_distance
from gradleak.attacks.dager.settings import DagerSettings
from gradleak.errors import GradleakError
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.server import ServerKnowledge
from gradleak.models.adapters import ModelAdapter, PastKeyValues
from gradleak.models.markers import document_token
from gradleak.models.tasks import unwrap

# Beams grown: this many per sentence of the batch, plus two (a weak sentence's first token
# may rank below every strong sentence's first tokens and some of their inner words).
BRANCHES_PER_SENTENCE = 2
# Prefixes each beam keeps at every length, and of them the best handed to the check.
WIDTH = 16
HANDED = 2
# The language prior's weight beside the layers' mean log distance: a content word is often
# the prior's 10th to 20th choice among the batch's tokens, where the layers still rank it
# first.
PRIOR_WEIGHT = 0.2
# A beam stops once its best prefix scores this far below the best ending it has handed
# over: the check takes the best-scored candidates first, and would not reach its later ones.
STOP_MARGIN = 8.0
# Layers after layer 2 whose spans also score an extension.
DEEPER = 2
# A beam grows this many tokens past the longest sentence the prefix search finished.
LENGTH_MARGIN = 4
# For the batch's last sentence, whose tokens are known, each beam is widened to about this
# many trials a step (the bag is then small: a narrow beam would waste the step's pass).
LAST_TRIALS = 1024


@dataclass
class PriorReader:
    """The model's own next-token log-probabilities, read where its output layer is its input
    table (a tied language-model head): the prefix read as a document, after ``marker``."""

    backbone: torch.nn.Module
    table: torch.Tensor  # [vocab, d]
    marker: int

    def start(self, n: int, device) -> tuple[torch.Tensor, PastKeyValues]:
        """Log-probabilities ``[n, vocab]`` of a document's first token, and its cache."""
        ids = torch.full((n, 1), self.marker, dtype=torch.long, device=device)
        return self.step(ids, [])

    def step(self, new: torch.Tensor, past: PastKeyValues) -> tuple[torch.Tensor, PastKeyValues]:
        """Log-probabilities after ``new`` ``[n, 1]`` follows prefixes cached in ``past``."""
        cache = DynamicCache(ddp_cache_data=past) if past else DynamicCache()
        with torch.no_grad():
            out = self.backbone(input_ids=new, past_key_values=cache, use_cache=True)
        scores = out[0][:, -1] @ self.table.T
        return scores.log_softmax(dim=-1), [(b.keys, b.values) for b in cache.layers]


@dataclass
class BranchSearch:
    """One beam per likely first token, scored by several layers' spans and a prior."""

    hf: torch.nn.Module
    adapter: ModelAdapter
    checks: list[LayerCheck]  # layers 2, 3, ... (their cut spans)
    prior: PriorReader | None

    def run(
        self, bag: Sequence[int], batch_size: int, longest: int, required: Sequence[int] = ()
    ) -> list[list[int]]:
        """Candidate sentences over the tokens ``bag``, best first: each beam's ``HANDED``
        best prefixes at every length up to ``longest``, ordered by how well each ends.

        ``required``: for the batch's last sentence, the tokens it must hold (those of the
        rows no confirmed sentence holds). Then every token of the bag starts a beam, the
        beams widen to ``LAST_TRIALS`` trials a step, a prefix that could no longer hold
        them all within ``longest`` is dropped, and every prefix that holds them all is handed
        over, and no other."""
        tokens = torch.tensor(list(bag), device=self.hf.device)
        layers = [check.layer for check in self.checks]
        firsts, _, _ = self._scores(tokens, layers, [], None, 1)
        if self.prior is not None:
            logp, _ = self.prior.start(1, tokens.device)
            firsts = firsts + PRIOR_WEIGHT * logp[:, tokens].log_softmax(dim=-1).double()
        firsts = firsts.log_softmax(dim=-1)
        beam = BeamPlan.of(tokens, required, longest)
        branches = len(bag) if required else BRANCHES_PER_SENTENCE * batch_size + 2
        order = firsts[0].argsort(descending=True)[:branches].tolist()
        found: list[tuple[list[int], float]] = []
        for index in order:
            first, score = int(tokens[index]), float(firsts[0, index])
            found += self._branch(beam, layers, first, score)
        found.sort(key=lambda item: -item[1])
        return [ids for ids, _ in found]

    def _branch(
        self, beam: BeamPlan, layers: list[int], first: int, score: float
    ) -> list[tuple[list[int], float]]:
        """One beam from ``first``: its best prefixes at each length, each with its score
        plus the evidence that it ends there."""
        tokens = beam.tokens
        device = tokens.device
        ids = torch.tensor([[first]], device=device)
        scores = torch.tensor([score], dtype=torch.float64)
        with torch.no_grad():
            hidden, past = self.adapter.layer_inputs_cached(self.hf, layers, ids, [])
        last = hidden[0][:, -1]
        prior_past: PastKeyValues = []
        if self.prior is not None:
            _, prior_past = self.prior.start(1, device)
        kept: list[tuple[list[int], float]] = []
        for _ in range(1, beam.longest):
            step, present, inputs = self._scores(tokens, layers, past, last, len(scores))
            # A prefix ends where no extension comes near the spans, and where the prior
            # expects the document to.
            ends = -step.max(dim=1).values
            if self.prior is not None:
                logp, prior_past = self.prior.step(ids[:, -1:], prior_past)
                step = step + PRIOR_WEIGHT * logp[:, tokens].log_softmax(dim=-1).double()
                ends = ends + logp[:, self.prior.marker].double()
            kept += beam.handed(ids, scores + ends)
            if kept and float(scores.max()) < max(score for _, score in kept) - STOP_MARGIN:
                break
            total = (scores[:, None] + step.log_softmax(dim=-1) + beam.reachable(ids)).flatten()
            best = total.topk(min(beam.width, int(torch.isfinite(total).sum())))
            if not len(best.values):
                break
            parent = best.indices // len(tokens)
            ids = torch.cat([ids[parent], tokens[best.indices % len(tokens), None]], dim=1)
            scores = best.values
            past = [(keys[best.indices], values[best.indices]) for keys, values in present]
            last = inputs[best.indices]
            if prior_past:
                prior_past = [(keys[parent], values[parent]) for keys, values in prior_past]
        return kept

    def _scores(
        self,
        tokens: torch.Tensor,
        layers: list[int],
        past: PastKeyValues,
        last: torch.Tensor | None,
        width: int,
    ) -> tuple[torch.Tensor, PastKeyValues, torch.Tensor]:
        """Each of ``width`` cached prefixes extended by each token: minus the mean log
        distance of the new position to the layers' spans ``[width, tokens]``, the trials'
        cache, and their layer-2 inputs. A trial whose layer-2 input repeats its prefix's
        last exactly (a run of one token on a rotary model) scores minus infinity."""
        new = tokens.repeat(width)[:, None]
        if past:
            repeat = torch.arange(width, device=tokens.device).repeat_interleave(len(tokens))
            past = [(keys[repeat], values[repeat]) for keys, values in past]
        with torch.no_grad():
            hidden, present = self.adapter.layer_inputs_cached(self.hf, layers, new, past)
        inputs = hidden[0][:, -1]
        previous = None if last is None else last.repeat_interleave(len(tokens), dim=0)
        logs = [last_position_distance(self.checks[0], inputs, previous)]
        logs += [
            check.distance(h[:, -1].to(torch.float64))
            for check, h in zip(self.checks[1:], hidden[1:], strict=True)
        ]
        score = -torch.stack(logs).clamp_min(1e-300).log().mean(dim=0)
        return score.view(width, len(tokens)), present, inputs


@dataclass
class BeamPlan:
    """What every beam of one run shares: the bag's tokens, how wide and how long a beam
    grows, and (for the last sentence) the tokens each handed prefix must hold."""

    tokens: torch.Tensor  # [n] the bag
    required: torch.Tensor  # [n] bool: a token the sentence must hold
    width: int
    longest: int

    @classmethod
    def of(cls, tokens: torch.Tensor, required: Sequence[int], longest: int) -> BeamPlan:
        must = torch.isin(
            tokens, torch.tensor(list(required), dtype=torch.long, device=tokens.device)
        )
        width = max(WIDTH, LAST_TRIALS // len(tokens)) if required else WIDTH
        return cls(tokens, must, width, longest)

    def _missing(self, ids: torch.Tensor) -> torch.Tensor:
        """``[k, n]``: the required tokens each prefix of ``ids`` ``[k, L]`` does not hold."""
        held = (ids[:, :, None] == self.tokens[None, None, :]).any(dim=1)
        return self.required[None, :] & ~held

    def handed(self, ids: torch.Tensor, ends: torch.Tensor) -> list[tuple[list[int], float]]:
        """The prefixes handed to the check, with their end scores: the best ``HANDED``;
        for the last sentence, each that holds every required token."""
        if not bool(self.required.any()):
            return [(ids[r].tolist(), float(ends[r])) for r in range(min(HANDED, len(ids)))]
        whole = ~self._missing(ids).any(dim=1)
        return [(ids[r].tolist(), float(ends[r])) for r in whole.nonzero().flatten().tolist()]

    def reachable(self, ids: torch.Tensor) -> torch.Tensor | float:
        """``[k, n]``: minus infinity for an extension after which the required tokens the
        prefix would still miss no longer fit within ``longest``; else 0."""
        if not bool(self.required.any()):
            return 0.0
        missing = self._missing(ids)
        after = missing.sum(dim=1, keepdim=True) - missing.to(torch.long)  # [k, n]
        fits = ids.shape[1] + 1 + after <= self.longest
        return torch.where(fits, 0.0, -math.inf).to(torch.float64)


def prior_reader(model: torch.nn.Module, adapter: ModelAdapter, tokenizer) -> PriorReader | None:
    """The model's prior where its output layer is its input table and a document marker
    opens a text; None elsewhere (the layers alone then score)."""
    if not getattr(model.config, "tie_word_embeddings", False):
        return None
    marker = document_token(tokenizer, model, "bos")
    if marker is None:
        return None
    table = adapter.token_embedding(model).weight
    return PriorReader(adapter.backbone(model), table, marker)


def branch_search(
    update: UpdatePayload, knowledge: ServerKnowledge, layer2: LayerCheck, settings: DagerSettings
) -> BranchSearch | None:
    """The beams' search over layer 2 and the ``DEEPER`` layers after it that the update
    carries; None where the settings turn it off or the family has no key/value cache."""
    gm = knowledge.global_model
    hf = unwrap(gm.model)
    if not settings.branches or not gm.adapter.supports_kv_cache:
        return None
    checks = [layer2]
    last = min(layer2.layer + DEEPER, gm.adapter.num_layers(hf) - 1)
    for layer in range(layer2.layer + 1, last + 1):
        try:
            checks.append(layer_check(update, knowledge, layer, settings))
        except GradleakError:  # a partial update without this layer's projections
            break
    return BranchSearch(hf, gm.adapter, checks, prior_reader(hf, gm.adapter, knowledge.tokenizer))
