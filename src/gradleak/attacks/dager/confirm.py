"""Whole sentences confirmed by the token-embedding rows of a noised update (not in DAGER).

A public noise drowns layer 2's weak directions, and the prefix search loses the sentences
whose prefixes lie in them. The embedding table's rows keep that noise spread over the whole
vocabulary while the batch's gradient sits in a few dozen rows (``embedding.py``), so each
of the batch's rows is known almost exactly: the sum, over the token's occurrences, of the
loss gradient at the occurrence's input. That gradient depends on the whole sentence, not on
a prefix: it cannot guide the search, but it recognises a finished sentence. The server
computes a candidate's own rows (the client's loss, the client's mode); where the candidate
is one of the batch's, its tokens that occur in no other sentence match the update's rows to
the noise, up to one scale (the 1/B of the mean, the label's softmax error, a per-sample
clip); anything else misses at every token (measured: docs/design/dager-noise.md).

A confirmed sentence is taken off the rows, so that tokens it shares with others can speak
for the others next; the tokens it alone holds are then spent (their rows are explained).
The candidates are the prefix search's finished prefixes and their one-token completions (a
token appended, dropped or replaced, as the model's own next-token prior proposes): under
noise the search most often stops a token short of a sentence or lets in a token that is not
the sentence's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from gradleak.attacks.dager.branches import LENGTH_MARGIN, BranchSearch
from gradleak.attacks.dager.embedding import moved_tokens, table_update
from gradleak.attacks.dager.peel import classes
from gradleak.attacks.dager.search import SearchState, one_edit, pick_distinct
from gradleak.defenses import noise_std
from gradleak.federated.client import GlobalModel, client_mode
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.server import ServerKnowledge
from gradleak.models.markers import document_token
from gradleak.models.tasks import EncodedBatch, right_padded, unwrap

# A row of noise alone lies within ``std * (sqrt(width) + NOISE_MARGIN)`` of its mean with
# probability about 1 - 1e-3 (a Gaussian vector's norm is 1-Lipschitz).
NOISE_MARGIN = math.sqrt(2 * math.log(1e3))
# Besides the noise, the client's and the server's float32 sums differ in their rounding.
RELATIVE_SLACK = 1e-3
# A row counts as evidence only when it stands this many tolerances above zero: a small row
# matches any small gradient.
EVIDENCE = 10.0
# Sentences whose rows are computed in one pass.
CHUNK = 32
# The search's best finished prefixes checked first; the sentences checked in all (each a
# forward and backward pass of the model); per candidate, the tokens appended (the model's
# likeliest next among the batch's), dropped or replaced (those it least expected) in the
# next round.
ROW_SEEDS = 24
CHECK_BUDGET = 320
APPENDS = 4
DROPS = 2
REPLACEMENTS = 2


@dataclass
class Confirmed:
    """A sentence the rows confirmed: its token ids, and the scale its own rows took."""

    ids: list[int]
    scale: float


@dataclass
class BatchRows:
    """The update's token-embedding rows still unexplained, and how near a match must be."""

    rows: dict[int, torch.Tensor]  # token -> row (float64)
    noise: float  # the noise's standard deviation per entry
    width: int
    confirmed: list[Confirmed] = field(default_factory=list)

    def tolerance(self, row: torch.Tensor) -> float:
        """How far a true sentence's own row may lie from the update's ``row``."""
        noise = self.noise * (math.sqrt(self.width) + NOISE_MARGIN)
        return noise + RELATIVE_SLACK * float(torch.linalg.vector_norm(row))

    def explains(self, gradients: dict[int, torch.Tensor]) -> float | None:
        """The scale at which a candidate's own rows (``gradients``: token -> its summed
        input gradient) match the update's at half or more of its evidence tokens (at least
        one); None where they do not."""
        scales, evidence = [], []
        for token, own in gradients.items():
            row = self.rows.get(token)
            if row is None:
                return None  # a token the batch does not hold
            power = float(own @ own)
            strength = float(torch.linalg.vector_norm(row))
            if power == 0.0 or strength < EVIDENCE * self.tolerance(row):
                continue
            scales.append(float(row @ own) / power)
            evidence.append(token)
        if not evidence:
            return None
        scale = float(torch.tensor(scales).median())
        matched = sum(
            float(torch.linalg.vector_norm(self.rows[t] - scale * gradients[t]))
            <= self.tolerance(self.rows[t])
            for t in evidence
        )
        return scale if matched >= max(1, math.ceil(len(evidence) / 2)) else None

    def spent_tokens(self) -> set[int]:
        """The confirmed sentences' tokens whose rows they explain whole (what is left lies
        within the noise): no other sentence of the batch holds them."""
        theirs = {token for sentence in self.confirmed for token in sentence.ids}
        return {
            token
            for token in theirs
            if float(torch.linalg.vector_norm(self.rows[token])) <= self.tolerance(self.rows[token])
        }

    def unheld_tokens(self) -> set[int]:
        """The batch's tokens no confirmed sentence holds: the sentences left hold them."""
        theirs = {token for sentence in self.confirmed for token in sentence.ids}
        return set(self.rows) - theirs

    def take_off(self, ids: list[int], gradients: dict[int, torch.Tensor], scale: float) -> None:
        """Remove a confirmed sentence's share from the rows."""
        for token, own in gradients.items():
            self.rows[token] = self.rows[token] - scale * own
        self.confirmed.append(Confirmed(ids, scale))


def batch_rows(update: UpdatePayload, knowledge: ServerKnowledge) -> BatchRows | None:
    """The update's rows of the batch's tokens where whole sentences can be checked by them:
    one FedSGD gradient of a classification loss, no dropout (its masks are the client's),
    only additive public defenses, the embedding table sent whole. None elsewhere."""
    gm = knowledge.global_model
    metadata = update.metadata
    no_dropout = metadata.get("mode") == "eval" or not metadata.get("dropout")
    if not (
        update.kind == "gradient"
        and metadata.get("algorithm") == "fedsgd"
        and gm.task == "classification"
        and gm.adapter.is_decoder
        and no_dropout
    ):
        return None
    moved = moved_tokens(update, knowledge)  # the batch's tokens: rows above the noise
    if moved is None:
        return None
    tensor = table_update(update, gm, gm.adapter.token_embedding(unwrap(gm.model)).weight)
    std = noise_std(knowledge.defenses, tensor, metadata=metadata)
    table = tensor.to(torch.float64)
    return BatchRows({int(t): table[t] for t in moved}, std, table.shape[1])


def confirmed_batch(
    rows: BatchRows,
    found: list[tuple[list[int], float]],
    update: UpdatePayload,
    knowledge: ServerKnowledge,
    state: SearchState,
    branches: Callable[[], BranchSearch | None] | None = None,
) -> list[tuple[list[int], float | None]]:
    """The batch among a decoder search's finished prefixes (``found``, with their layer-2
    distances): the sentences the rows confirm first, then the search's own picks among the
    rest (none within one edit of a confirmed sentence, none holding a token the confirmed
    ones explain whole). ``branches``: where given, the sentences the rows have not confirmed
    among the search's are grown again from their likely first tokens (``branches.py``); the
    search is built only then (its deeper layers' spans cost a decomposition each)."""
    size = knowledge.batch_size
    seeds = [ids for ids, _ in sorted(found, key=lambda item: item[1])[:ROW_SEEDS]]
    labels = classes(knowledge)
    labels = labels[:1] if len(labels) == 2 else labels  # two classes: one direction
    mode = update.metadata.get("mode", "eval")
    gm = knowledge.global_model
    confirmed = confirm(rows, gm, mode, seeds, labels, size)
    # A sentence rarely repeats a token: no longer than the batch has distinct tokens.
    longest = min(max((len(ids) for ids, _ in found), default=0), len(rows.rows)) + LENGTH_MARGIN
    search = branches() if branches is not None and len(confirmed) < size else None
    while search is not None and len(confirmed) < size:
        # Beams over the tokens the confirmed sentences have not spent, for the sentences
        # left; a round that confirms nothing ends the search.
        before = len(confirmed)
        spent = rows.spent_tokens()
        bag = [token for token in sorted(rows.rows) if token not in spent]
        # The last sentence holds every token no confirmed one does, and no others: it is
        # no longer than its bag (its beams are wide, so every step saved counts).
        required = sorted(rows.unheld_tokens()) if size - before == 1 else []
        reach = min(longest, len(bag) + LENGTH_MARGIN) if required else longest
        started = time.perf_counter()
        grown = search.run(bag, size - before, reach, required)
        grown_s = time.perf_counter() - started
        confirmed = confirm(rows, gm, mode, grown, labels, size)
        last = f", the last sentence holding {len(required)} of them" if required else ""
        state.notes.append(
            f"beams per first token over {len(bag)} tokens{last}, up to {reach} long "
            f"({grown_s:.0f} s): {len(confirmed) - before} more confirmed"
        )
        if len(confirmed) == before:
            break
    state.notes.append(f"{len(confirmed)} of {size} sentences confirmed by the embedding rows")
    spent = rows.spent_tokens()
    rest = [
        item
        for item in found
        if spent.isdisjoint(item[0]) and not any(one_edit(item[0], c.ids) for c in confirmed)
    ]
    return [(c.ids, 0.0) for c in confirmed] + pick_distinct(rest, size - len(confirmed))


def confirm(
    rows: BatchRows,
    gm: GlobalModel,
    mode: str,
    seeds: Sequence[list[int]],
    labels: Sequence[int],
    limit: int,
) -> list[Confirmed]:
    """The sentences the rows confirm, at most ``limit``: the ``seeds`` (the search's
    finished prefixes, best first), then rounds of their completions (``completions``) for
    the candidates no confirmed sentence is within one edit of, ``CHECK_BUDGET`` sentences
    checked in all."""
    checked: dict[tuple[int, ...], OwnRows] = {}
    pending: dict[tuple[int, ...], OwnRows] = {}
    bag = sorted(rows.rows)

    def check(candidates: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
        spent = rows.spent_tokens()
        new = [
            c
            for c in dict.fromkeys(map(tuple, candidates))
            if c and c not in checked and spent.isdisjoint(c)
        ]
        new = new[: max(0, CHECK_BUDGET - len(checked))]
        own = own_rows(gm, mode, [list(c) for c in new], labels, bag)
        checked.update(zip(new, own, strict=True))
        pending.update(zip(new, own, strict=True))
        _take_confirmed(rows, pending, limit)
        return new

    frontier = check(seeds)
    while frontier and len(rows.confirmed) < limit and len(checked) < CHECK_BUDGET:
        open_ = [c for c in frontier if c in pending and not _near_confirmed(c, rows)]
        frontier = check([grown for c in open_ for grown in completions(c, checked[c])])
    return rows.confirmed


def completions(ids: Sequence[int], own: OwnRows) -> list[list[int]]:
    """``ids`` with a token appended, or a token dropped or replaced, as ``own`` proposes:
    under noise the prefix search most often stops a token short of a sentence or lets in a
    token that is not the sentence's."""
    appended = [[*ids, token] for token in own.next_tokens]
    dropped = [[*ids[:i], *ids[i + 1 :]] for i in own.unlikely if len(ids) > 1]
    replaced = [[*ids[:i], token, *ids[i + 1 :]] for i in own.unlikely for token in own.instead[i]]
    return appended + dropped + replaced


def _near_confirmed(ids: Sequence[int], rows: BatchRows) -> bool:
    return any(one_edit(list(ids), c.ids) for c in rows.confirmed)


def _take_confirmed(rows: BatchRows, pending: dict[tuple[int, ...], OwnRows], limit: int) -> None:
    """Take off the pending candidates the rows confirm, one at a time (a shared token may
    speak only once the sentences beside it are off), until none is or ``limit`` are."""
    while len(rows.confirmed) < limit:
        found = next(
            (
                (ids, own, scale)
                for ids, candidate in pending.items()
                for own in candidate.per_label
                if (scale := rows.explains(own)) is not None
            ),
            None,
        )
        if found is None:
            return
        ids, own, scale = found
        rows.take_off(list(ids), own, scale)
        del pending[ids]


@dataclass
class OwnRows:
    """A candidate sentence's own rows, and the completions worth checking next: with a
    language prior the model's ``APPENDS`` likeliest next tokens, its ``DROPS`` least
    expected positions and there its ``REPLACEMENTS`` likeliest tokens; without one, every
    token of the batch and every position."""

    per_label: list[dict[int, torch.Tensor]]  # under each label: token -> its summed gradient
    next_tokens: list[int]  # tokens to append
    unlikely: list[int]  # positions to drop or replace
    instead: dict[int, list[int]]  # position -> tokens to put there


def own_rows(
    gm: GlobalModel,
    mode: str,
    sentences: list[list[int]],
    labels: Sequence[int],
    tokens: Sequence[int],
) -> list[OwnRows]:
    """Each sentence's own loss gradient at its inputs, summed per token, under each label,
    computed as the client computes its loss (``mode``, its padding), a chunk of sentences per
    pass. Where the model's output embedding is its input table (a tied language-model head,
    as SmolLM2's), a forward pass of the sentence read as a document ranks the batch's
    ``tokens`` as its next and its own tokens by how little the model expected each;
    elsewhere they keep their order."""
    model = unwrap(gm.model)
    embedding = gm.adapter.token_embedding(model)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    pad = gm.victim.tokenizer.pad_token_id
    marker = document_token(gm.victim.tokenizer, model, "bos")
    bag = torch.tensor(list(tokens), device=gm.device)
    out: list[OwnRows] = []
    for first in range(0, len(sentences), CHUNK):
        chunk = sentences[first : first + CHUNK]
        batch = _padded(chunk, pad, labels[0], gm.device)
        per_label = []
        for label in labels:
            batch.labels = {"label": torch.full((len(chunk),), label, device=gm.device)}
            per_label.append(_input_gradients(gm, model, embedding, batch, mode))
        hidden = _prior_states(gm, model, batch, marker) if tied else None
        for row, ids in enumerate(chunk):
            rows_ = [_summed(ids, grads[row]) for grads in per_label]
            if hidden is not None:
                scores = hidden[row, : len(ids)] @ embedding.weight.T  # [L, vocab]
                prior = scores.log_softmax(dim=-1)
                following = torch.tensor(ids[1:], device=gm.device)
                expected = prior[:-1].gather(1, following[:, None]).flatten()
                unlikely = (expected.argsort() + 1).tolist()[:DROPS]  # the first: no prior
                nexts = _likeliest(prior[-1], bag, None)[:APPENDS]
                instead = {
                    i: _likeliest(prior[i - 1], bag, ids[i])[:REPLACEMENTS] for i in unlikely
                }
            else:
                nexts, unlikely = list(tokens), list(range(len(ids)))
                instead = {i: [t for t in tokens if t != ids[i]] for i in unlikely}
            out.append(OwnRows(rows_, nexts, unlikely, instead))
    return out


def _likeliest(prior: torch.Tensor, bag: torch.Tensor, other_than: int | None) -> list[int]:
    """The ``bag``'s tokens by ``prior`` (log-probabilities over the vocabulary), likeliest
    first, without ``other_than``."""
    ranked = bag[prior[bag].argsort(descending=True)].tolist()
    return [token for token in ranked if token != other_than]


def _padded(sentences: list[list[int]], pad: int, label: int, device) -> EncodedBatch:
    """Sentences right-padded as a client's batch is."""
    longest = max(len(ids) for ids in sentences)
    input_ids = right_padded(sentences, longest, pad, device)
    mask = right_padded([[1] * len(ids) for ids in sentences], longest, 0, device)
    labels = {"label": torch.full((len(sentences),), label, device=device)}
    return EncodedBatch(input_ids, mask, labels)


def _summed(ids: list[int], grads: torch.Tensor) -> dict[int, torch.Tensor]:
    """A sentence's input gradients ``[L, d]`` summed per token."""
    per_token: dict[int, torch.Tensor] = {}
    for position, token in enumerate(ids):
        value = grads[position]
        per_token[token] = per_token[token] + value if token in per_token else value
    return per_token


def _input_gradients(
    gm: GlobalModel, model, embedding, batch: EncodedBatch, mode: str
) -> torch.Tensor:
    """d(sum of the examples' losses) / d(token embedding output) ``[n, L, d]`` (float64)."""
    captured: list[torch.Tensor] = []

    def take_input(_module, _args, output):
        output = output.detach().requires_grad_(True)
        captured.append(output)
        return output

    handle = embedding.register_forward_hook(take_input)
    try:
        with torch.enable_grad(), client_mode(model, mode):
            losses = gm.example_losses(model, batch)
            (grads,) = torch.autograd.grad(losses.sum(), captured[0])
    finally:
        handle.remove()
    return grads.to(torch.float64)


def _prior_states(gm: GlobalModel, model, batch: EncodedBatch, marker: int | None) -> torch.Tensor:
    """The backbone's last hidden states ``[n, L, d]`` at the sentences' positions, read as
    a document: after the tokenizer's document marker where it has one, without which a
    model guesses a text's first words badly (docs/design/dager-noise.md)."""
    input_ids, mask = batch.input_ids, batch.attention_mask
    if marker is not None:
        column = torch.full_like(input_ids[:, :1], marker)
        input_ids = torch.cat([column, input_ids], dim=1)
        mask = torch.cat([torch.ones_like(column), mask], dim=1)
    with torch.no_grad(), client_mode(model, "eval"):
        hidden = gm.adapter.backbone(model)(input_ids=input_ids, attention_mask=mask)[0]
    return hidden[:, 1:] if marker is not None else hidden
