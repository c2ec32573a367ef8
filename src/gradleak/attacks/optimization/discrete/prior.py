"""Language-model priors: how natural a candidate text is, for LAMP's discrete steps.

LAMP scores a reordered candidate by its matching loss plus ``alpha_lm`` times the mean token
cross-entropy of an auxiliary causal LM on the candidate's tokens. The paper's LM was a GPT-2
trained with BERT's vocabulary, so it read the victim's token ids directly. Any causal LM works
here: with the victim's vocabulary it reads the ids as they are; otherwise the ids are decoded
with the victim's tokenizer and the text is re-tokenized with the prior's.

A discrete round scores hundreds of reorderings of one sentence, and reorderings share
prefixes (at least BOS, often several tokens). The prior therefore reads them as a prefix tree:
every distinct prefix is one token of a single flattened sequence that attends only to its
ancestors (a 4D attention mask, positions set to the depth), so a shared prefix is computed
once, and the vocabulary projection runs only where a next token is scored.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedTokenizerBase

from gradleak.errors import GradleakError
from gradleak.models.loading import load_victim
from gradleak.models.markers import document_token

# A candidate is scored as a whole document: after a start token and followed by an end token
# (``document_token``), as LAMP's BERT-vocabulary GPT-2 read [CLS] text [SEP] (the end rewards
# a sentence that ends where sentences end, e.g. at its full stop).

Row = tuple[int, ...]


class LanguagePrior(Protocol):
    """Scores texts given as the victim's token ids (the content tokens, no specials)."""

    name: str

    def sentence_nll(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per sequence: summed token cross-entropy (nats) and the number of scored tokens.

        Sums and counts (rather than means) let a caller form the mean over a whole batch of
        sentences, as LAMP's loss is defined on the batch.
        """


@dataclass
class PrefixTree:
    """Distinct prefixes of lexicographically sorted rows, as nodes in depth-first order.

    Node ``i`` holds one token at position ``depths[i]``; its parent is the node of the prefix
    one token shorter (-1 for a root), and it may attend to exactly its ancestors and itself.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    ends: dict[Row, int] = field(default_factory=dict)  # row -> the node of its last token
    _path: list[int] = field(default_factory=list)  # nodes of the last row added
    _last: Row = ()

    def new_nodes(self, row: Row) -> int:
        """How many nodes adding ``row`` creates (rows come in sorted order)."""
        return len(row) - _common_prefix(row, self._last)

    def add(self, row: Row) -> None:
        shared = _common_prefix(row, self._last)
        del self._path[shared:]
        for depth in range(shared, len(row)):
            self.parents.append(self._path[-1] if self._path else -1)
            self._path.append(len(self.tokens))
            self.tokens.append(row[depth])
            self.depths.append(depth)
        self.ends[row] = self._path[-1]
        self._last = row

    def allowed(self) -> torch.Tensor:
        """``[n, n]`` bool: node i may attend to node j (j is i or an ancestor of i)."""
        n = len(self.tokens)
        allowed = torch.zeros((n, n), dtype=torch.bool, device="cpu")
        for i, parent in enumerate(self.parents):
            if parent >= 0:  # parents precede their children: its row is complete
                allowed[i] = allowed[parent]
            allowed[i, i] = True
        return allowed


def _common_prefix(a: Row, b: Row) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def prefix_trees(rows: list[Row], max_nodes: int) -> Iterator[PrefixTree]:
    """Split sorted ``rows`` into prefix trees of at most ``max_nodes`` nodes each (a row longer
    than that gets a tree of its own): the attention mask grows with the square of the nodes."""
    tree = PrefixTree()
    for row in rows:
        if tree.ends and len(tree.tokens) + tree.new_nodes(row) > max_nodes:
            yield tree
            tree = PrefixTree()
        tree.add(row)
    if tree.ends:
        yield tree


class CausalLMPrior:
    """A causal LM as a prior; scores many candidates in a few forward passes.

    Scores are remembered (up to ``memo`` texts): LAMP's rounds propose many of the same
    reorderings again, and the prior model is frozen. ``tree_nodes=0`` scores padded batches of
    ``chunk`` texts instead of prefix trees (``chunk=1, tree_nodes=0, memo=0`` is the
    reference's one text per forward pass).
    """

    def __init__(
        self,
        name: str,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        victim_tokenizer: PreTrainedTokenizerBase,
        chunk: int = 32,
        tree_nodes: int = 256,
        memo: int = 50_000,
    ) -> None:
        self.name = name
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.victim_tokenizer = victim_tokenizer
        self.chunk = chunk
        self.tree_nodes = tree_nodes
        self.memo = memo
        self._scores: dict[Row, tuple[float, int]] = {}
        self._tree_ok: bool | None = None  # whether the model honours tree masks; probed once
        # Same vocabulary: the victim's ids are the prior's ids (LAMP's own setting).
        self.same_vocab = tokenizer.get_vocab() == victim_tokenizer.get_vocab()
        self.bos: int | None = document_token(tokenizer, model, "bos")
        self.end: int | None = document_token(tokenizer, model, "eos")
        pad = tokenizer.pad_token_id
        self.pad: int = pad if pad is not None else (tokenizer.eos_token_id or 0)

    def prior_ids(self, victim_ids: list[int]) -> list[int]:
        """The prior's input for one text: its BOS (if any) and the text in its vocabulary."""
        if self.same_vocab:
            ids = list(victim_ids)
        else:
            text = self.victim_tokenizer.decode(victim_ids, skip_special_tokens=True)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        start = [self.bos] if self.bos is not None else []
        return start + ids + ([self.end] if self.end is not None else [])

    @torch.no_grad()
    def sentence_nll(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = [tuple(self.prior_ids(ids)) for ids in sequences]
        todo = sorted({key for key in inputs if key not in self._scores})
        fresh = {key: (0.0, 0) for key in todo if len(key) < 2}  # nothing to predict
        todo = [key for key in todo if len(key) >= 2]
        if todo:
            trees = self.tree_nodes > 0 and self._trees_work()
            fresh |= self._score_trees(todo) if trees else self._score_padded(todo)
        found = {key: self._scores.get(key) or fresh[key] for key in inputs}
        self._remember(fresh)
        device = self.device
        sums = torch.tensor([found[key][0] for key in inputs], dtype=torch.float64, device=device)
        counts = torch.tensor([found[key][1] for key in inputs], dtype=torch.float64, device=device)
        return sums, counts

    def _remember(self, fresh: dict[Row, tuple[float, int]]) -> None:
        if len(fresh) > self.memo:
            return
        for key in list(self._scores)[: max(0, len(self._scores) + len(fresh) - self.memo)]:
            del self._scores[key]  # the oldest first
        self._scores.update(fresh)

    def _trees_work(self) -> bool:
        """Whether the model honours a custom 4D mask and positions: compared once, on a small
        tree, with the plain padded computation (an architecture that rebuilds its own mask or
        derives positions from it fails here and is scored padded)."""
        if self._tree_ok is None:
            first = self.bos if self.bos is not None else 0
            probe = sorted([(first, 1, 2, 3), (first, 1, 5), (first, 4, 5)])
            try:
                tree = self._score_trees(probe)
                plain = self._score_padded(probe)
                self._tree_ok = all(
                    abs(tree[key][0] - plain[key][0]) <= 1e-5 + 1e-4 * abs(plain[key][0])
                    and tree[key][1] == plain[key][1]
                    for key in probe
                )
            except Exception:  # noqa: BLE001 - any failure means: use the plain path
                self._tree_ok = False
        return self._tree_ok

    def _score_trees(self, rows: list[Row]) -> dict[Row, tuple[float, int]]:
        scores: dict[Row, tuple[float, int]] = {}
        for tree in prefix_trees(rows, self.tree_nodes):
            scores |= self._score_tree(tree)
        return scores

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _score_tree(self, tree: PrefixTree) -> dict[Row, tuple[float, int]]:
        device, dtype = self.device, next(self.model.parameters()).dtype
        allowed = tree.allowed()
        blocked = torch.finfo(dtype).min  # additive: works for eager and SDPA attention
        allowed = allowed.to(device)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(
            ~allowed, blocked
        )
        parents = torch.tensor(tree.parents, device=device)
        scored = (parents >= 0).nonzero().flatten()  # every non-root node is a scored token
        keep, slot = parents[scored].unique(return_inverse=True)  # nodes whose logits we need
        kwargs = {"logits_to_keep": keep} if _accepts(self.model, "logits_to_keep") else {}
        logits = self.model(
            input_ids=torch.tensor([tree.tokens], device=device),
            attention_mask=mask[None, None],
            position_ids=torch.tensor([tree.depths], device=device),
            **kwargs,
        ).logits[0]
        logits = (logits if kwargs else logits[keep]).float()
        targets = torch.tensor(tree.tokens, device=device)[scored]
        token_nll = logits.logsumexp(-1)[slot] - logits[slot, targets]
        # a node's sum is its parent's plus its own token's (parents come first)
        total = [0.0] * len(tree.tokens)
        for node, nll in zip(scored.tolist(), token_nll.double().tolist(), strict=True):
            total[node] = total[tree.parents[node]] + nll
        return {row: (total[end], tree.depths[end]) for row, end in tree.ends.items()}

    def _score_padded(self, rows: list[Row]) -> dict[Row, tuple[float, int]]:
        """Plain scoring: padded batches of whole rows, similar lengths together."""
        rows = sorted(rows, key=len)
        scores: dict[Row, tuple[float, int]] = {}
        for start in range(0, len(rows), self.chunk):
            part = rows[start : start + self.chunk]
            sums, counts = self._score(part)
            for key, total, count in zip(part, sums.tolist(), counts.tolist(), strict=True):
                scores[key] = (total, int(count))
        return scores

    def _score(self, rows: list[Row]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        if width < 2:  # nothing to predict
            return torch.zeros(len(rows), device="cpu"), torch.zeros(len(rows), device="cpu")
        ids = torch.full((len(rows), width), self.pad, dtype=torch.long, device="cpu")
        mask = torch.zeros((len(rows), width), dtype=torch.long, device="cpu")
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long, device="cpu")
            mask[i, : len(row)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        logits = self.model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        targets = ids[:, 1:]
        valid = mask[:, 1:].bool()
        token_nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        token_nll = token_nll.masked_fill(~valid, 0.0)
        return token_nll.sum(dim=1).double(), valid.sum(dim=1).double()


def _accepts(model: nn.Module, argument: str) -> bool:
    try:
        return argument in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def load_prior_model(name: str) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """Load causal LM ``name`` (a registered model, a folder or hf:ORG/NAME) for use as a prior."""
    try:
        victim = load_victim(name, "causal_lm")
    except GradleakError as exc:
        raise GradleakError(
            f"cannot use '{name}' as the LM prior ({exc}); use smollm2, none, or a causal LM"
        ) from None
    if not victim.is_decoder:
        raise GradleakError(
            f"the LM prior must be a causal (decoder) LM; '{name}' is a "
            f"{victim.adapter.family} encoder: use smollm2 or none"
        )
    return victim.model, victim.tokenizer
