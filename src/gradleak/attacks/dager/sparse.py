"""DAGER where an update shows only a slice of its inputs' span: sparse recovery.

A LoRA adapter's A-gradient has r rows, each a combination of the layer's inputs, so q's and
v's together span at most 2r directions. A batch with more distinct inputs than that leaves a
2r-dimensional slice of their span: no input lies in it and DAGER's span test fails. The slice
is still a combination of a few vectors of a dictionary the server can compute (the
vocabulary's layer-1 inputs; at layer 2, the extensions of prefixes already found), so the
inputs are the sparse support of ``slice = inputs @ coefficients``.

``Pursuit`` finds that support by rank-aware order-recursive matching pursuit: it picks, one at
a time, the dictionary vector nearest in angle to what the picked ones leave of the slice
(after taking the picked directions off both). A true input's share of the slice is about
``rank / inputs`` against ``rank / hidden size`` for any other vector, and once all but
``rank`` of the true inputs are picked the rest lie exactly in the picked vectors' span plus the
slice (angle 0): the test is exact again and they are taken at once. The slice then lies in the
picked span, and a least-squares fit of it on the picked vectors gives the false picks zero
coefficients (generic coefficients need every true input). Not in the DAGER paper: it is how
the multiple-measurement sparse-recovery literature (simultaneous OMP, rank-aware ORMP)
reads a low-rank observation of a sparse support (measured: docs/design/dager-sparse.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gradleak.attacks.dager.span import SpanBasis

# The slice lies in the picked span when what is left of it is under this share (float32
# gradients and float32 candidate inputs agree to about 1e-6 of the largest direction; a
# missing input leaves its weight there).
DONE = 1e-5
# Directions of what is left under this weight (the slice's largest 1) are rounding.
ROUNDING = 1e-6
# A vector this close to angle 0 with what is left (1 - cosine) lies in the picked span plus
# the slice: in the end game every true input left does, at float32 accuracy (1 - cosine
# about 1e-12).
EXACT = 1e-6
# Vocabulary tokens the layer-1 pursuit starts from, the nearest to the slice in angle (others
# join as the picks bring them near: ``Vocabulary``).
SHORTLIST = 1024
# An encoder's tokens screened at every position: the nearest to the slice at a few positions
# (every 5th from 1 to 16). A batch's tokens ranked 264th at worst of MiniLM's 30,522 at a
# single position (CoLA B=8, docs/design/dager-sparse.md).
TOKEN_SHORTLIST = 2048
TOKEN_PROBES = (5, 16)
# An encoder's (token, position) pairs the pursuit picks from, per position screened: the
# nearest to the slice in angle. A batch token lies near the slice at every position (the
# position embedding is a small part of the input), so the shortlist grows with the
# positions, or the batch tokens' other positions crowd its true pairs out
# (docs/design/dager-sparse.md).
PAIRS_PER_POSITION = 128
# A pair picked at a cosine under this is no input: the batch's pairs lie at 0.77 and more
# from the start and near 1 as the picks go on, while once they are spent the next best lie
# at about 0.2 (MiniLM, CoLA B=8).
LEAST_PAIR_COSINE = 0.5
# A picked vector whose share of the least-squares fit is under this (relative to the largest)
# was not needed: a false pick.
NEEDED = 1e-3


@dataclass
class Pursuit:
    """The pursuit's state: the slice (columns ``[d, m]``, float64, ``weighted_slice``), the
    picked vectors and an orthonormal basis of their span. A dictionary it scores may only grow
    (rows appended): each row's squared norm inside the picked span is kept and updated
    pick by pick rather than recomputed."""

    target: torch.Tensor
    picked: list[torch.Tensor] = field(default_factory=list)
    basis: torch.Tensor | None = None  # [d, k]
    _seen: torch.Tensor | None = None  # the dictionary last scored
    _whole: torch.Tensor | None = None  # its rows' squared norms
    _inside: torch.Tensor | None = None  # their squared norms inside the picked span

    def remainder(self) -> tuple[torch.Tensor, float]:
        """What the picked span leaves of the slice: an orthonormal basis ``[d, m']`` of it
        (directions under ``ROUNDING`` dropped), and its share (Frobenius) of the slice."""
        rest = self.target
        if self.basis is not None:
            rest = rest - self.basis @ (self.basis.T @ rest)
        u, s, _ = torch.linalg.svd(rest, full_matrices=False)
        share = float(torch.linalg.vector_norm(s) / torch.linalg.matrix_norm(self.target))
        return u[:, s > ROUNDING], share

    def left(self) -> torch.Tensor:
        """``remainder``'s basis."""
        return self.remainder()[0]

    def share_left(self) -> float:
        """``remainder``'s share."""
        return self.remainder()[1]

    def cosines(self, vectors: torch.Tensor, left: torch.Tensor) -> torch.Tensor:
        """Each vector's cosine with the slice's part ``left`` once the picked directions are
        off it (1: it lies in the picked span plus the slice)."""
        v = vectors.to(torch.float64)
        known = 0 if self._whole is None else len(self._whole)
        if known > len(v):
            raise ValueError("a pursuit's dictionary may only grow")
        new = v[known:]
        whole = new.square().sum(dim=-1)
        inside = torch.zeros_like(whole) if self.basis is None else self._inside_of(new)
        self._whole = whole if self._whole is None else torch.cat([self._whole, whole])
        self._inside = inside if self._inside is None else torch.cat([self._inside, inside])
        self._seen = v
        return _cosines(v @ left, self._whole, self._whole - self._inside, floor=1e-12)

    def _inside_of(self, vectors: torch.Tensor) -> torch.Tensor:
        return (vectors @ self.basis).square().sum(dim=-1)

    def pick(self, vector: torch.Tensor) -> None:
        """Add one vector to the picked span (Gram-Schmidt twice, for float64 stability)."""
        v = vector.to(torch.float64)
        self.picked.append(v)
        q = v.clone()
        for _ in range(2):
            if self.basis is not None:
                q = q - self.basis @ (self.basis.T @ q)
        norm = torch.linalg.vector_norm(q)
        if norm <= 1e-12 * torch.linalg.vector_norm(v):
            return  # already in the span
        q = q / norm
        self.basis = q[:, None] if self.basis is None else torch.cat([self.basis, q[:, None]], 1)
        if self._seen is not None:
            self._inside = self._inside + (self._seen @ q).square()

    def needed(self) -> list[int]:
        """Indices of the picked vectors the slice needs: nonzero rows of the least-squares
        fit ``picked @ c = slice``, weighted by each vector's norm."""
        if not self.picked:
            return []
        stacked = torch.stack(self.picked, dim=1)  # [d, k]
        coefficients = torch.linalg.lstsq(stacked, self.target).solution  # [k, m]
        weight = torch.linalg.vector_norm(coefficients, dim=1) * torch.linalg.vector_norm(
            stacked, dim=0
        )
        return torch.nonzero(weight > NEEDED * weight.max()).flatten().tolist()


def _cosines(
    along: torch.Tensor, whole: torch.Tensor, outside: torch.Tensor, floor: float
) -> torch.Tensor:
    """Cosines from each vector's coordinates ``along`` what is left of the slice, its squared
    norm ``whole`` and its squared norm ``outside`` the picked span; 0 for a vector all but
    ``floor`` of whose norm lies inside that span (a repeat: nothing new to offer)."""
    cosines = (along.square().sum(dim=-1) / outside.clamp_min(1e-300)).clamp(0, 1).sqrt()
    return cosines.masked_fill(outside <= floor * whole, 0.0)


def weighted_slice(span: SpanBasis) -> torch.Tensor:
    """The span's directions weighted by their singular values (the largest 1): the weak
    directions of a float32 gradient carry its rounding at a larger share, and weighted they
    count for as little in the pursuit's fit as in the gradient."""
    values = span.singular_values[: span.rank].to(span.basis.dtype)
    return span.basis * (values / values[0])


def sparse_support(
    target: torch.Tensor,
    dictionary: Callable[[], torch.Tensor],
    on_pick: Callable[[list[int]], None] | None = None,
    max_picks: int | None = None,
    grow: Callable[[Pursuit, torch.Tensor, float], bool] | None = None,
    end_game: bool = True,
    least_cosine: float = 0.0,
) -> tuple[list[int], int, float]:
    """Indices of the dictionary's vectors that make up the slice ``target``.

    ``dictionary()`` returns every vector so far (``[n, d]``); ``on_pick`` hears the indices
    just picked and may grow the dictionary (a decoder's prefixes: the extensions of a picked
    prefix); ``grow(pursuit, left, best)``, called when no vector lies at angle 0, may add
    vectors nearer than ``best`` (a vocabulary's shortlist: the tokens the picks have brought
    near) and says whether it did. At most ``max_picks`` picks (default: the hidden size less
    the slice's directions, past which the picked span holds everything). Without
    ``end_game`` every pick is one vector (a dictionary of near twins, an encoder's token at
    neighbouring positions, would put them all at angle 0 together). The pursuit ends where
    no vector lies nearer than ``least_cosine``. Returns the support, the number of picks
    and the share of the slice left."""
    if max_picks is None:
        max_picks = target.shape[0] - target.shape[1]
    pursuit = Pursuit(target)
    chosen: set[int] = set()
    order: list[int] = []
    while len(order) < max_picks:
        left, share = pursuit.remainder()
        vectors = dictionary()
        if share <= DONE or not len(vectors):
            break
        cosines = pursuit.cosines(vectors, left)
        if chosen:
            cosines[torch.tensor(sorted(chosen), device=cosines.device)] = -1.0
        best = float(cosines.max())
        if best < 1 - EXACT and grow is not None and grow(pursuit, left, best):
            continue  # score the new vectors too
        if best <= least_cosine:
            break
        # In the end game every true vector left lies at angle 0: take them all at once.
        exact = end_game and best >= 1 - EXACT
        batch = torch.nonzero(cosines >= 1 - EXACT).flatten().tolist() if exact else []
        picks = batch or [int(cosines.argmax())]
        for index in picks:
            pursuit.pick(vectors[index])
            chosen.add(index)
            order.append(index)
        if on_pick is not None:
            on_pick(picks)
    needed = pursuit.needed()
    return sorted(order[i] for i in needed), len(order), pursuit.share_left()


@dataclass
class Vocabulary:
    """The layer-1 dictionary: a shortlist of the vocabulary, grown as the picks bring other
    tokens near. A token of the batch may start far from the slice (one whose gradient adds
    little to it) and come to angle 0 only once others are picked. Scoring every token in
    float64 at every pick would cost most of the attack, so the whole vocabulary is screened
    in float32, and only where the shortlist has no token at angle 0."""

    inputs: torch.Tensor  # [V, d], every token's layer-1 input
    members: list[int]  # the tokens in the dictionary, in its order
    _rows: torch.Tensor | None = None  # the members' inputs in float64
    _screen: torch.Tensor | None = None  # every token's input in float32
    _whole: torch.Tensor | None = None  # their squared norms
    _inside: torch.Tensor | None = None  # their squared norms inside the picked span
    _columns: int = 0  # picked directions counted in ``_inside``

    def __call__(self) -> torch.Tensor:
        known = 0 if self._rows is None else len(self._rows)
        if known < len(self.members):
            new = self.inputs[torch.tensor(self.members[known:])].to(torch.float64)
            self._rows = new if self._rows is None else torch.cat([self._rows, new])
        return self._rows

    def grow(self, pursuit: Pursuit, left: torch.Tensor, best: float, count: int = 64) -> bool:
        """Add up to ``count`` tokens nearer than ``best`` to the slice's part ``left``."""
        if self._screen is None:
            self._screen = self.inputs.to(torch.float32)
            self._whole = self._screen.square().sum(dim=-1)
            self._inside = torch.zeros_like(self._whole)
        if pursuit.basis is not None and pursuit.basis.shape[1] > self._columns:
            new = pursuit.basis[:, self._columns :].to(torch.float32)
            self._inside += (self._screen @ new).square().sum(dim=-1)
            self._columns = pursuit.basis.shape[1]
        along = self._screen @ left.to(torch.float32)
        # float32 cannot tell a token inside the picked span from one near it: 1e-6, not 0
        cosines = _cosines(along, self._whole, self._whole - self._inside, floor=1e-6)
        cosines[torch.tensor(self.members)] = -1.0
        top = torch.topk(cosines, min(count, len(cosines)))
        added = top.indices[top.values > best].tolist()
        self.members += added
        return bool(added)


def sparse_tokens(
    inputs: torch.Tensor, target: torch.Tensor, shortlist: int
) -> tuple[list[int], float]:
    """The vocabulary tokens (rows of ``inputs``, their layer-1 inputs) that make up the
    slice ``target``, and the share of the slice they leave. The pursuit starts from the
    ``shortlist`` tokens nearest the slice in angle (a true token's share of it is about
    ``rank / tokens``, another's ``rank / d``) and takes in others as they come near."""
    pursuit = Pursuit(target)
    cosines = pursuit.cosines(inputs, pursuit.left())
    nearest = torch.topk(cosines, min(shortlist, len(cosines))).indices
    vocabulary = Vocabulary(inputs, nearest.tolist())
    support, _, left = sparse_support(target, vocabulary, grow=vocabulary.grow)
    return sorted(vocabulary.members[i] for i in support), left


def sparse_pairs(
    inputs_at: Callable[[torch.Tensor, int], torch.Tensor],
    vocabulary: int,
    positions: int,
    target: torch.Tensor,
) -> tuple[list[tuple[int, int]], float]:
    """An encoder batch's (token, position) pairs from layer 1's slice ``target``, and the
    share of the slice they leave. ``inputs_at(ids, position)`` gives the layer-1 inputs of
    tokens ``ids`` at ``position``; the dictionary is tokens at positions below ``positions``.

    A token's nearness to the slice hardly depends on its position (the position embedding is
    a small part of the input), so the tokens are screened first, at a few positions, and
    only the nearest ``TOKEN_SHORTLIST`` are screened at every position, keeping the pairs
    nearest the slice (``PAIRS_PER_POSITION`` a position). A token's pairs at neighbouring
    positions come to angle 0 together, so the pursuit picks one at a time (no end game) and
    positions are less sure than tokens (docs/design/dager-sparse.md)."""
    left = Pursuit(target).left().to(torch.float32)
    device = target.device

    def cosines(ids: torch.Tensor, position: int) -> torch.Tensor:
        inputs = inputs_at(ids, position).to(torch.float32)
        along = inputs @ left
        return (along.square().sum(-1) / inputs.square().sum(-1).clamp_min(1e-30)).sqrt()

    every = torch.arange(vocabulary, device=device)
    probes = range(1, min(positions, TOKEN_PROBES[1]), TOKEN_PROBES[0])
    nearness = torch.stack([cosines(every, position) for position in probes]).amax(dim=0)
    tokens = torch.topk(nearness, min(TOKEN_SHORTLIST, vocabulary)).indices
    scores = torch.stack([cosines(tokens, position) for position in range(positions)])
    shortlist = min(PAIRS_PER_POSITION * positions, scores.numel())
    nearest = torch.topk(scores.flatten(), shortlist).indices  # position-major
    by_position: dict[int, list[int]] = {}
    for index in sorted(nearest.tolist()):
        by_position.setdefault(index // len(tokens), []).append(int(tokens[index % len(tokens)]))
    pairs = [(token, q) for q, ids in by_position.items() for token in ids]
    dictionary = torch.cat(
        [inputs_at(torch.tensor(ids, device=device), q) for q, ids in by_position.items()]
    ).to(torch.float64)
    support, _, share = sparse_support(
        target, lambda: dictionary, end_game=False, least_cosine=LEAST_PAIR_COSINE
    )
    return sorted((pairs[i] for i in support), key=lambda pair: (pair[1], pair[0])), share


def arranged(pairs: list[tuple[int, int]], rows: int) -> list[list[int]]:
    """(token, position) pairs laid out as ``rows`` sequences: at each position its tokens,
    one to a row. The pairs do not say which sentence a token belongs to, so the rows are
    the bag of tokens in their positions' order, not the sentences."""
    at: dict[int, list[int]] = {}
    for token, position in pairs:
        at.setdefault(position, []).append(token)
    laid = [[] for _ in range(rows)]
    for position in sorted(at):
        for row, token in enumerate(at[position][:rows]):
            laid[row].append(token)
        laid[-1] += at[position][rows:]  # more tokens than rows at a position: none dropped
    return [row for row in laid if row]


@dataclass
class PrefixDictionary:
    """A decoder's prefixes as a growing dictionary: each picked prefix adds its extensions by
    every candidate token, with their last position's layer-2 input (causal: it depends on
    the prefix only). The start tokens (BOS) are an entry too: their position is an input."""

    layer_input: Callable[[torch.Tensor], torch.Tensor]  # ids [n, L] -> last inputs [n, d]
    tokens: list[int]
    max_length: int
    prefixes: list[tuple[int, ...]] = field(default_factory=list)
    extended: set[tuple[int, ...]] = field(default_factory=set)
    index: dict[tuple[int, ...], int] = field(default_factory=dict)  # prefix -> its row
    _buffer: torch.Tensor | None = None

    def start(self, start: list[int]) -> None:
        """The first entries: the start tokens themselves (if any) and their extensions."""
        if start:
            ids = torch.tensor([start], dtype=torch.long)
            self._add([tuple(start)], self.layer_input(ids).to(torch.float64))
        self.extend(tuple(start))

    def extend(self, prefix: tuple[int, ...]) -> None:
        """Add ``prefix``'s extensions, but those whose new position repeats the prefix's
        last input exactly (a run of one token: the attention averages equal values)."""
        if prefix in self.extended or len(prefix) >= self.max_length or not self.tokens:
            return
        self.extended.add(prefix)
        ids = torch.tensor([[*prefix, t] for t in self.tokens], dtype=torch.long)
        vectors = self.layer_input(ids).to(torch.float64)
        keep = torch.ones(len(vectors), dtype=torch.bool)
        if prefix in self.index:
            last = self.vectors()[self.index[prefix]]
            change = torch.linalg.vector_norm(vectors - last, dim=-1)
            keep = change > 1e-6 * torch.linalg.vector_norm(last)
        extensions = [
            (*prefix, t) for t, kept in zip(self.tokens, keep.tolist(), strict=True) if kept
        ]
        self._add(extensions, vectors[keep])

    def _add(self, prefixes: list[tuple[int, ...]], vectors: torch.Tensor) -> None:
        self.index.update((p, len(self.prefixes) + i) for i, p in enumerate(prefixes))
        used = len(self.prefixes)
        self.prefixes += prefixes
        if self._buffer is None or len(self._buffer) < len(self.prefixes):
            capacity = max(2 * len(self.prefixes), 1024)
            grown = vectors.new_empty(capacity, vectors.shape[1])
            if self._buffer is not None:
                grown[:used] = self._buffer[:used]
            self._buffer = grown
        self._buffer[used : len(self.prefixes)] = vectors

    def vectors(self) -> torch.Tensor:
        """Every entry's vector so far (a view of a buffer that doubles as it fills)."""
        if self._buffer is None:
            return torch.zeros(0, 0, dtype=torch.float64)
        return self._buffer[: len(self.prefixes)]

    def on_pick(self, indices: list[int]) -> None:
        for index in indices:
            self.extend(self.prefixes[index])


def sparse_sentences(
    layer_input: Callable[[torch.Tensor], torch.Tensor],
    target: torch.Tensor,
    tokens: list[int],
    start: list[int],
    max_length: int,
) -> tuple[list[list[int]], int, float]:
    """A decoder batch's sentences from layer 2's slice ``target``: the prefixes the slice
    is made of, grown from ``start`` by the pursuit, and of them those no other extends,
    longest first. Returns the sentences, the picks and the share of the slice left."""
    prefixes = PrefixDictionary(layer_input, tokens, max_length)
    prefixes.start(start)
    support, picks, left = sparse_support(target, prefixes.vectors, prefixes.on_pick)
    found = {prefixes.prefixes[i] for i in support}
    ends = [p for p in found if not any(len(q) > len(p) and q[: len(p)] == p for q in found)]
    ends.sort(key=lambda p: (-len(p), p))
    return [list(p) for p in ends], picks, left
