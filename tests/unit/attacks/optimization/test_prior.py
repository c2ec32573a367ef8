"""The LM prior's prefix-tree scoring equals scoring each sequence on its own."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from gradleak.attacks.optimization.discrete.prior import CausalLMPrior, prefix_trees
from gradleak.models.markers import document_token
from tests.helpers import word_level_lm


@torch.no_grad()
def _plain_nll(model: nn.Module, ids: list[int]) -> tuple[float, int]:
    """One sequence alone, no padding, no cache: the reference."""
    if len(ids) < 2:
        return 0.0, 0
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum")
    return float(nll), len(ids) - 1


def _sequences(tokenizer) -> list[list[int]]:
    """Reorderings like a discrete round's, plus duplicates, prefixes, one token, none."""
    words = tokenizer("the cat sat on the mat today", add_special_tokens=False)["input_ids"]
    a, b, c, d, e, f, g = words
    return [
        words,
        [a, b, c, d, e, g, f],  # shares all but the last two
        [a, b, d, c, e, f, g],  # a swap in the middle
        [b, c, d, e, f, g, a],  # a rotation: shares only BOS
        words,  # a duplicate
        [a, b, c],  # a prefix of the first
        [a],  # one token after BOS
        [],  # BOS alone: nothing to score
        [g, f, e, d, c, b, a, a, b, c, d, e, f, g],  # longer than a small tree
        [a, b, d, c, e, f, g],  # another duplicate
    ]


def _check(prior: CausalLMPrior, model: nn.Module, sequences: list[list[int]]) -> None:
    sums, counts = prior.sentence_nll(sequences)
    for i, ids in enumerate(sequences):
        total, count = _plain_nll(model, prior.prior_ids(ids))
        assert counts[i] == count
        assert sums[i] == pytest.approx(total, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
@pytest.mark.parametrize("tree_nodes", [8, 256])
def test_tree_scores_equal_one_sequence_at_a_time(tiny_victim, name, tree_nodes):
    victim = tiny_victim("tiny-bert")
    lm = tiny_victim(name, "causal_lm")
    prior = CausalLMPrior(name, lm.model, lm.tokenizer, victim.tokenizer, tree_nodes=tree_nodes)
    _check(prior, lm.model, _sequences(victim.tokenizer))
    assert prior._tree_ok  # the tree path ran, not the padded fallback


def test_tree_scores_with_sdpa_attention(tiny_victim):
    victim = tiny_victim("tiny-bert")
    lm = tiny_victim("tiny-llama", "causal_lm")
    lm.model.set_attn_implementation("sdpa")
    prior = CausalLMPrior("tiny-llama", lm.model, lm.tokenizer, victim.tokenizer)
    _check(prior, lm.model, _sequences(victim.tokenizer))
    assert prior._tree_ok


def test_tree_scores_after_retokenization(tiny_victim):
    words = ["<bos>", "<pad>", "<unk>", "the", "cat", "sat", "on", "mat", "today"]
    lm, tokenizer = word_level_lm(words, layers=2)
    victim = tiny_victim("tiny-bert")
    prior = CausalLMPrior("word-lm", lm, tokenizer, victim.tokenizer, tree_nodes=12)
    assert not prior.same_vocab
    _check(prior, lm, _sequences(victim.tokenizer))
    assert prior._tree_ok


class _WrappedLM(nn.Module):
    """A causal LM behind a forward of another signature (the test doubles below)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model
        self.config = model.config


class _IgnoresTreeMasks(_WrappedLM):
    """A causal LM that rebuilds its own causal mask: tree masks would give wrong scores."""

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        del position_ids  # positions follow the input order
        if attention_mask is not None and attention_mask.ndim == 4:
            attention_mask = None
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


def test_a_model_that_ignores_tree_masks_is_scored_padded(tiny_victim):
    victim = tiny_victim("tiny-bert")
    lm = tiny_victim("tiny-gpt2", "causal_lm")
    model = _IgnoresTreeMasks(lm.model)
    prior = CausalLMPrior("odd", model, lm.tokenizer, victim.tokenizer)
    _check(prior, lm.model, _sequences(victim.tokenizer))
    assert prior._tree_ok is False


def test_scores_are_remembered_up_to_the_limit(tiny_victim):
    victim = tiny_victim("tiny-bert")
    lm = tiny_victim("tiny-gpt2", "causal_lm")
    calls = []
    lm.model.register_forward_hook(lambda *_: calls.append(1))
    sequences = _sequences(victim.tokenizer)
    prior = CausalLMPrior("tiny-gpt2", lm.model, lm.tokenizer, victim.tokenizer, memo=100)
    first = prior.sentence_nll(sequences)
    before = len(calls)
    again = prior.sentence_nll(sequences[::-1])
    assert len(calls) == before  # nothing recomputed
    assert torch.equal(again[0], first[0].flip(0)) and torch.equal(again[1], first[1].flip(0))
    small = CausalLMPrior("tiny-gpt2", lm.model, lm.tokenizer, victim.tokenizer, memo=3)
    small.sentence_nll(sequences[:2])
    small.sentence_nll(sequences[2:4])
    # four texts seen, three kept: the oldest one goes, the latest call's two stay
    recent = {tuple(small.prior_ids(ids)) for ids in sequences[2:4]}
    assert len(small._scores) == 3 and recent <= set(small._scores)
    for key, (total, count) in small._scores.items():
        assert (total, count) == pytest.approx(_plain_nll(lm.model, list(key)), rel=1e-4)
    before = len(calls)
    again = small.sentence_nll(sequences[2:4])
    assert len(calls) == before  # served from memory
    assert torch.allclose(again[0], first[0][2:4], rtol=1e-6)


class _BigramLM(nn.Module):
    """A causal LM whose next-token distribution depends on the current token only, with
    probabilities proportional to ``weights[current]``: its scores can be worked out by hand."""

    def __init__(self, weights: list[list[float]]) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.tensor(weights).log())
        self.config = SimpleNamespace()  # no BOS/EOS beyond the tokenizer's

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return SimpleNamespace(logits=self.table[input_ids])


# vocabulary: <bos> <pad> <unk> the cat sat; row i: weights of the token after token i
BIGRAM_WORDS = ["<bos>", "<pad>", "<unk>", "the", "cat", "sat"]
BIGRAM_WEIGHTS = [
    [1, 1, 1, 4, 2, 1],  # after <bos>: the 4/10, cat 2/10, sat 1/10
    [1, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 5, 1],  # after the: cat 5/10
    [1, 1, 1, 1, 1, 5],  # after cat: sat 5/10
    [1, 1, 1, 3, 2, 2],  # after sat: the 3/10
]


@pytest.mark.parametrize("tree_nodes", [0, 256])
@pytest.mark.parametrize("victim_vocab", ["same", "bert"])
def test_scores_equal_a_hand_computation(tiny_victim, tree_nodes, victim_vocab):
    _, tokenizer = word_level_lm(BIGRAM_WORDS, layers=1)
    model = _BigramLM(BIGRAM_WEIGHTS)
    victim_tokenizer = tokenizer if victim_vocab == "same" else tiny_victim().tokenizer
    prior = CausalLMPrior("bigram", model, tokenizer, victim_tokenizer, tree_nodes=tree_nodes)
    texts = ["the cat sat", "sat the", "cat", ""]
    ids = [victim_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    sums, counts = prior.sentence_nll(ids)
    # each text after <bos>, nothing after it (this tokenizer has no EOS):
    #   the cat sat: -ln(4/10) - ln(5/10) - ln(5/10) = ln 10
    #   sat the:     -ln(1/10) - ln(3/10)            = ln(100/3)
    #   cat:         -ln(2/10)                       = ln 5
    #   (empty):     <bos> alone, nothing scored     = 0
    assert sums.tolist() == pytest.approx([math.log(10), math.log(100 / 3), math.log(5), 0.0])
    assert counts.tolist() == [3, 2, 1, 0]
    assert prior._tree_ok is (True if tree_nodes else None)


def test_prefix_trees_hold_each_distinct_prefix_once():
    rows = sorted({(0, 1, 2, 3), (0, 1, 2, 4), (0, 1, 5), (0, 6), (0, 1, 2)})
    (tree,) = prefix_trees(rows, max_nodes=100)
    prefixes = {row[: k + 1] for row in rows for k in range(len(row))}
    assert len(tree.tokens) == len(prefixes)
    allowed = tree.allowed()
    for node, parent in enumerate(tree.parents):  # a node sees its parent's view and itself
        expected = allowed[parent].clone() if parent >= 0 else torch.zeros_like(allowed[node])
        expected[node] = True
        assert torch.equal(allowed[node], expected)
        assert int(allowed[node].sum()) == tree.depths[node] + 1
    for row, end in tree.ends.items():
        path = allowed[end].nonzero().flatten().tolist()
        assert tuple(tree.tokens[a] for a in path) == row
    small = list(prefix_trees(rows, max_nodes=3))
    assert all(len(t.tokens) <= 4 for t in small)  # a 4-token row gets a tree of its own
    assert sorted(row for t in small for row in t.ends) == rows


class _NoLogitSelection(_WrappedLM):
    """A causal LM whose forward cannot restrict its logits to chosen positions."""

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        )


def test_trees_work_without_logit_selection(tiny_victim):
    victim = tiny_victim("tiny-bert")
    lm = tiny_victim("tiny-llama", "causal_lm")
    model = _NoLogitSelection(lm.model)
    prior = CausalLMPrior("plain", model, lm.tokenizer, victim.tokenizer, tree_nodes=16)
    _check(prior, lm.model, _sequences(victim.tokenizer))
    assert prior._tree_ok


def test_texts_are_scored_as_documents_not_chat_turns():
    """Instruct tokenizers name chat-turn markers as BOS and EOS; a text is scored between
    document separators instead, and between BOS and EOS where they are not turn markers."""
    words = ["<|im_start|>", "<pad>", "<unk>", "<|endoftext|>", "<|im_end|>", "the", "cat"]
    lm, tokenizer = word_level_lm(words, layers=1)
    tokenizer.bos_token, tokenizer.eos_token = "<|im_start|>", "<|im_end|>"
    assert document_token(tokenizer, lm, "bos") == document_token(tokenizer, lm, "eos") == 3
    prior = CausalLMPrior("chat-lm", lm, tokenizer, tokenizer)
    assert prior.prior_ids([5, 6]) == [3, 5, 6, 3]
    plain, plain_tokenizer = word_level_lm(["<bos>", "<pad>", "<unk>", "<|endoftext|>"], layers=1)
    plain_tokenizer.eos_token = "<pad>"
    assert document_token(plain_tokenizer, plain, "bos") == 0
    assert document_token(plain_tokenizer, plain, "eos") == 1
