"""What the last block's down-projection update decides past the hidden size (issue 57):
SmolLM2, the first client batch of 32 Rotten Tomatoes reviews (961 tokens against the
width 576, a batch DAGER refuses), a float32 FedSGD client of the next-token loss.

In the last block nothing mixes positions after the MLP, so the update of its ``down_proj``
is a sum of one term per predicting position, ``g_i a_i^T``: ``a_i`` (the 1536-wide
intermediate activation) depends on the prefix up to ``i`` only, and ``g_i`` (the error at the
block's output) on that prefix and the next token only: ``J^T W^T (p_i - e_y) / N``, with ``J``
the final RMSNorm's Jacobian, ``W`` the output embedding, ``p_i`` the model's next-token
distribution and ``N`` the batch's predicted tokens. So the server can compute every term of
a candidate (prefix, next token), and the true terms fit the update with equal coefficients.
Unlike layer 1's down_proj (``past_width``), no side of the term is unknown.

Measured here: how exactly the terms sum to the update; the coefficients of a least-squares
fit on all true terms; and, for true prefixes, whether the true next token (among the batch's
distinct tokens, which DAGER's layer 1 recovers below its own wall) is the best fit of the
update's residual once a share of the other true terms is known, with the activations as they
are and whitened by their second moment on public text (SST-2's first 300 sentences).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from report import examples_or_skip, write_results

from gradleak.config.options import config_from_options
from gradleak.data import Example
from gradleak.models.loading import Victim, load_victim, model_status
from gradleak.models.tasks import encode_examples, task_loss
from gradleak.scenario.examples import client_batches

BATCH_SIZE, PUBLIC_SENTENCES, SAMPLED_POSITIONS = 32, 300, 40
KNOWN_SHARES = (0.0, 0.5, 0.9, 1.0)  # 1.0: every other true term
WHITENING_RIDGE = 1e-3  # times the mean eigenvalue, added before inverting the second moment


class LastBlock:
    """The model's last block seen from the server: each position's activation, final hidden
    state and error term, in float64."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.down = model.model.layers[-1].mlp.down_proj
        self.norm = model.model.norm
        self.output = model.lm_head.weight.detach().double()

    def states(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The down_proj inputs and the final norm's inputs at every position ``[B, L, .]``."""
        seen: dict[str, torch.Tensor] = {}
        hooks = [
            self.down.register_forward_hook(lambda _m, i, _o: seen.update(a=i[0].detach())),
            self.norm.register_forward_hook(lambda _m, i, _o: seen.update(h=i[0].detach())),
        ]
        try:
            with torch.no_grad():
                self.model(input_ids=ids, attention_mask=mask)
        finally:
            for hook in hooks:
                hook.remove()
        return seen["a"].double(), seen["h"].double()

    def errors(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """``J^T W^T (p - e_t)`` for each hidden state ``[n, d]`` and each of its targets
        ``[n, k]`` (token ids): ``[n, k, d]``, the loss's 1/N left out."""
        eps = self.norm.variance_epsilon
        gamma = self.norm.weight.detach().double()
        rms = torch.sqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
        unit = hidden / rms
        probs = torch.softmax((gamma * unit) @ self.output.T, dim=-1)
        w = (probs @ self.output)[:, None, :] - self.output[targets]  # W^T (p - e_t)
        scaled = w * gamma
        along = (scaled * unit[:, None, :]).sum(-1, keepdim=True) / hidden.shape[-1]
        return (scaled - unit[:, None, :] * along) / rms[:, None, :]


def last_block(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """One row per activation form and known share (``batches`` unused: one batch)."""
    started = time.perf_counter()
    reviews = examples_or_skip("last_block", "rotten_tomatoes", data_dir)
    public = examples_or_skip("last_block", "sst2", data_dir)
    if reviews is None or public is None or model_status("smollm2").startswith("missing"):
        print("last_block: skipped (Rotten Tomatoes, SST-2 or SmolLM2 missing)")
        return
    torch.manual_seed(0)
    victim = load_victim("smollm2", "causal_lm", seed=0)
    model, tokenizer = victim.model.eval(), victim.tokenizer
    options = {"model": "smollm2", "dataset": "rotten_tomatoes", "task": "causal_lm",
               "batch_size": BATCH_SIZE, "n_inputs": 1, "attack": "dager"}  # fmt: skip
    batch = client_batches(reviews, config_from_options(options), 1)[0][0]
    encoded = encode_examples(tokenizer, batch, "causal_lm", 8192)
    ids, mask = encoded.input_ids, encoded.attention_mask
    update, predicted = _client_update(victim, ids, mask)
    whitening = _whitening(LastBlock(model), tokenizer, public)  # float32 statistics
    block = LastBlock(model.double())
    activations, hidden = block.states(ids, mask)
    # the predicting positions: every real one but the last of each row (its EOS)
    at = mask.bool().clone()
    at[:, :-1] &= mask[:, 1:].bool()
    at[:, -1] = False
    next_tokens = ids.roll(-1, dims=1)[at]
    acts, hid = activations[at], hidden[at]
    errors = block.errors(hid, next_tokens[:, None])[:, 0] / predicted
    summed = errors.T @ acts
    bag = torch.tensor(sorted(set(ids[mask.bool()].tolist())))
    # the positions tested, each with its error term for every batch token (the candidates)
    positions = list(range(0, len(errors), max(1, len(errors) // SAMPLED_POSITIONS)))
    candidates = block.errors(hid[positions], bag.expand(len(positions), -1))
    truth = [int((bag == next_tokens[i]).nonzero()) for i in positions]
    table = []
    for form, transform in (("as they are", None), ("whitened", whitening)):
        a = acts if transform is None else acts @ transform
        target = update if transform is None else update @ transform
        gram = (errors @ errors.T) * (a @ a.T)
        fitted = torch.einsum("nd,de,ne->n", errors, target, a)
        coefficients = torch.linalg.lstsq(gram, fitted[:, None], driver="gelsd").solution[:, 0]
        for share in KNOWN_SHARES:
            tested = (positions, candidates, truth)
            top1, ranks = _next_token_test(errors, a, target, gram, fitted, tested, share)
            table.append({
                "activations": form,
                "known share of the other terms": share,
                "positions tested": len(ranks),
                "true next token first": top1,
                "mean rank of the true token": sum(ranks) / len(ranks),
                "batch tokens": int(mask.sum()),
                "predicting positions": int(at.sum()),
                "distinct tokens": len(bag),
                "terms vs update (rel. error)": float((summed - update).norm() / update.norm()),
                "fit coefficients min / max": float(coefficients.min() / coefficients.max()),
            })  # fmt: skip
    notes = (
        "A float32 client's update of the last block's down_proj, the server's terms in "
        "float64; the next-token test over the batch's distinct tokens, at every "
        f"{SAMPLED_POSITIONS}th-share of the predicting positions, the residual of a "
        "least-squares fit on the known share of the other true terms."
    )
    json_path, _ = write_results(out_dir, "last_block", table, started, notes)
    print(f"last_block: {len(table)} rows -> {json_path}")


def _client_update(
    victim: Victim, ids: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """The float32 FedSGD update of the last down_proj under the client's mean next-token
    loss, and the number of predicted tokens it averages over."""
    down = victim.model.model.layers[-1].mlp.down_proj
    loss = task_loss(victim.model, victim.adapter, "causal_lm", mask, {}, input_ids=ids)
    (gradient,) = torch.autograd.grad(loss, [down.weight])
    return gradient.double(), int(mask[:, 1:].sum())


def _whitening(block: LastBlock, tokenizer, public: list[Example]) -> torch.Tensor:
    """``L`` with ``L L^T`` the inverse second moment (ridged) of the last down_proj's inputs
    on public sentences: activations ``a L`` are near-orthogonal where the raw ones share a
    large common part."""
    by_length = sorted(public[:PUBLIC_SENTENCES], key=lambda example: len(example.text))
    seen = []
    for part in range(0, len(by_length), 50):  # sentences of like length padded together
        encoded = encode_examples(tokenizer, by_length[part : part + 50], "causal_lm", 8192)
        activations, _ = block.states(encoded.input_ids, encoded.attention_mask)
        seen.append(activations[encoded.attention_mask.bool()])
    seen = torch.cat(seen)
    moment = seen.T @ seen / seen.shape[0]
    values, vectors = torch.linalg.eigh(moment)
    inverse = vectors @ torch.diag(1.0 / (values + WHITENING_RIDGE * values.mean())) @ vectors.T
    return torch.linalg.cholesky(inverse)


def _next_token_test(
    errors: torch.Tensor,
    acts: torch.Tensor,
    target: torch.Tensor,
    gram: torch.Tensor,
    fitted: torch.Tensor,
    tested: tuple[list[int], torch.Tensor, list[int]],
    share: float,
) -> tuple[int, list[int]]:
    """For the tested true positions (``tested``: the positions, their candidates' error
    terms, the true candidate's index): the rank of the true next token by the fit of the
    residual left by a least-squares fit on ``share`` of the other true terms."""
    generator = torch.Generator().manual_seed(0)
    count = errors.shape[0]
    top1, ranks = 0, []
    for i, options, true in zip(*tested, strict=True):
        others = torch.tensor([j for j in range(count) if j != i])
        keep = others[torch.rand(len(others), generator=generator) < share] if share < 1 else others
        direction = target @ acts[i]
        if len(keep):
            solved = torch.linalg.lstsq(gram[keep][:, keep], fitted[keep][:, None], driver="gelsd")
            weights = solved.solution[:, 0] * (acts[keep] @ acts[i])
            direction = direction - errors[keep].T @ weights
        scores = (options @ direction) / options.norm(dim=1)
        rank = int((scores > scores[true]).sum())
        top1 += int(rank == 0)
        ranks.append(rank)
    return top1, ranks


SUITES = {"last_block": last_block}
