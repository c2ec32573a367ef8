"""Each token's positions from the update's word- and position-embedding rows (encoders; not in
DAGER).

An encoder such as BERT reads its inputs as ``LayerNorm(E[t] + P[p] + T)``: token ``t``'s
embedding row, position ``p``'s row, a type row. Call ``g`` the gradient of one input's sum.
A token's row of the gradient is the sum of ``g`` over the batch's occurrences of the token, a
position's row the sum over the sentences that reach it. And a LayerNorm's input gradient is
orthogonal to its input (and to the all-ones vector): ``g`` is orthogonal to
``E[t] + P[p] + T`` for the very ``t`` and ``p`` it was read at.

So a token row that is one input's gradient (the token occurs at one position of the batch)
is orthogonal to that token's input at exactly one position: its own. Taking it off that
position's row may leave the position one input, orthogonal to one token's input there,
which takes that share off the token's row, and so on (``place``). What comes out is exact;
what a sum of several inputs at several positions keeps hidden stays open: those tokens may
sit at any position left open.

Layer 1's span cannot do this on an encoder batch: a token repeated at two positions puts the
difference of their position embeddings in the span, and every batch token then passes at
most positions; the rows place most inputs exactly and leave few tokens open (measured: see
docs/design/dager-encoder.md). Train-mode dropout acts after the LayerNorm, so the
orthogonality holds under it too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from gradleak.attacks.dager.embedding import table_update
from gradleak.federated.client import GlobalModel
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.server import ServerKnowledge
from gradleak.models.tasks import unwrap

# A token row (or a position row) is one input's gradient when its cosine with that input is
# under this, and no other candidate's is under three times it: between a float32 gradient's
# true pairs and the nearest false ones, the next position's input (measured:
# docs/design/dager-encoder.md).
ONE_INPUT = 3e-7

# A row is used up when what is left of it is under this share of its norm (float32 rounding
# leaves about 1e-7).
SPENT = 1e-5


@dataclass(frozen=True)
class Placement:
    """What the rows say per position: the tokens placed there for certain, and the tokens
    left open, which may sit at any position left open."""

    placed: list[set[int]]
    open_tokens: set[int]
    open_positions: set[int]

    def allowed(self, position: int) -> set[int]:
        """The tokens that may sit at ``position``."""
        return self.placed[position] | self.open_at(position)

    def open_at(self, position: int) -> set[int]:
        """The tokens that may sit at ``position`` without the rows placing them there."""
        return self.open_tokens if position in self.open_positions else set()

    def __len__(self) -> int:
        """Positions up to the longest sentence's last."""
        return len(self.placed)

    def least_alive(self) -> list[int]:
        """Per position, how many sentences reach it at least: one per distinct token placed
        there (two sentences with one token at one position count once)."""
        return [len(tokens) for tokens in self.placed]


def placed_tokens(
    update: UpdatePayload,
    knowledge: ServerKnowledge,
    moved: set[int],
    whole: UpdatePayload | None = None,
) -> Placement | None:
    """The rows' placement of the ``moved`` tokens, or None where the rows do not say: not
    one plain gradient (a weight delta sums gradients at moved weights, a defense alters
    them), no position table read through a LayerNorm alone, no such rows sent, or a
    placement whose open tokens and open positions do not go together.

    ``whole``: the update that ``update`` is a remainder of (found sentences taken off,
    ``peel.py``). Its rows set the float32 rounding's scale: a row of the remainder under
    ``SPENT`` of the whole update's is rounding, not an input."""
    gm = knowledge.global_model
    adapter, hf = gm.adapter, unwrap(gm.model)
    table = adapter.position_table(hf)
    if update.kind != "gradient" or knowledge.defenses or table is None:
        return None
    rows = _rows(update, gm, hf, table)
    scale = rows if whole is None else _rows(whole, gm, hf, table)
    if rows is None or scale is None:
        return None
    (word_rows, position_rows), (word_scale, position_scale) = rows, scale
    tokens = sorted(moved)
    word_floor = SPENT * word_scale[tokens].norm(dim=1)
    position_floor = SPENT * position_scale.norm(dim=1)
    used = torch.nonzero(position_rows.norm(dim=1) > position_floor).flatten()
    if len(used) == 0:
        return None
    n = int(used.max()) + 1
    with torch.no_grad():
        embeds = adapter.token_embedding(hf).weight[tokens].double()
        positions = torch.arange(n, device=embeds.device)
        inputs = adapter.normed_embedding_sum(hf, embeds[:, None, :], positions)
    inputs = inputs - inputs.mean(dim=-1, keepdim=True)
    inputs = inputs / inputs.norm(dim=-1, keepdim=True)
    edges, open_tokens, open_positions = place(
        word_rows[tokens], position_rows[:n], inputs, word_floor, position_floor[:n]
    )
    if bool(open_tokens) != bool(open_positions):
        return None
    placed: list[set[int]] = [set() for _ in range(n)]
    for i, p in edges:
        placed[p].add(tokens[i])
    return Placement(placed, {tokens[i] for i in open_tokens}, open_positions)


def _rows(
    update: UpdatePayload, gm: GlobalModel, hf: nn.Module, table: tuple[nn.Embedding, int]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The update's token-embedding rows and its position rows from position 0 on (float64),
    or None where either table was not sent whole."""
    words = table_update(update, gm, gm.adapter.token_embedding(hf).weight)
    positions = table_update(update, gm, table[0].weight)
    if words is None or positions is None:
        return None
    return words.double(), positions[table[1] :].double()


def place(
    word_rows: torch.Tensor,
    position_rows: torch.Tensor,
    inputs: torch.Tensor,
    word_floor: torch.Tensor,
    spot_floor: torch.Tensor,
) -> tuple[set[tuple[int, int]], set[int], set[int]]:
    """Split the rows into single inputs' gradients (see the module's docstring).

    ``word_rows`` [T, d] and ``position_rows`` [n, d] are the update's rows, ``inputs``
    [T, n, d] each token's unit, centred input sum at each position; a row is used up once
    its norm is under its floor (``word_floor`` [T], ``spot_floor`` [n]). Returns the placed
    (token, position) pairs and the token and position indices left open."""
    words, spots = word_rows.clone(), position_rows.clone()
    by_position = inputs.transpose(0, 1)  # [n, T, d]
    edges: set[tuple[int, int]] = set()
    while True:
        # token rows that are one input's gradient, then position rows that are
        found = _sweep(words, spots, word_floor, spot_floor, inputs)
        found += [(i, p) for p, i in _sweep(spots, words, spot_floor, word_floor, by_position)]
        if not found:
            break
        edges.update(found)
    open_tokens = torch.nonzero(words.norm(dim=1) > word_floor).flatten().tolist()
    open_positions = torch.nonzero(spots.norm(dim=1) > spot_floor).flatten().tolist()
    return edges, set(open_tokens), set(open_positions)


def _sweep(
    rows: torch.Tensor,
    others: torch.Tensor,
    floor: torch.Tensor,
    other_floor: torch.Tensor,
    inputs: torch.Tensor,
) -> list[tuple[int, int]]:
    """One pass over ``rows`` (token rows, or position rows): each that is one input's
    gradient, orthogonal to its input at one live row of ``others`` alone (``inputs[j]``: row
    ``j``'s unit inputs against each of ``others``), is moved onto that one, which loses it
    (in place). Returns the (row, other) pairs moved."""
    moved = []
    for j in range(len(rows)):
        live = torch.nonzero(others.norm(dim=1) > other_floor).flatten()
        if rows[j].norm() <= floor[j] or len(live) == 0:
            continue
        k = _one_input(inputs[j, live] @ rows[j], rows[j])
        if k is not None:
            other = int(live[k])
            others[other] -= rows[j]
            rows[j] = 0
            moved.append((j, other))
    return moved


def _one_input(products: torch.Tensor, row: torch.Tensor) -> int | None:
    """The one candidate whose input ``row`` is orthogonal to (``products``: the row's dot
    products with the candidates' unit inputs), or None when none or several are."""
    cosines = products.abs() / row.norm()
    if len(cosines) > 1:
        two = torch.topk(cosines, 2, largest=False)
        if two.values[0] < ONE_INPUT <= two.values[1] / 3:
            return int(two.indices[0])
        return None
    return 0 if cosines[0] < ONE_INPUT else None
