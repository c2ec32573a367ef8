"""What an encoder's LoRA update leaks at layer 1: the bag of tokens, not their positions.

MiniLM with LoRA r=32, alpha 64 on q and v, FedSGD at round 2 (the global model trained one
round by other clients), eval mode, CoLA in LAMP's order. Layer 1's A-gradients show a
64-dimensional slice of the span of the batch's layer-1 inputs, each the LayerNorm of a
token's, a position's and the type's embeddings. The server's dictionary is every (token,
position) pair; the slice's sparse support in it (rank-aware matching pursuit, DAGER's
``sparse.py``, run greedily until the slice lies in the picked span) gives the batch's tokens
and, where the position embeddings tell neighbours apart, their positions.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from report import cola_or_skip, write_results

from gradleak.attacks.dager.sparse import Pursuit, sparse_support, weighted_slice
from gradleak.config import RunConfig
from gradleak.config.options import config_from_options
from gradleak.models.tasks import unwrap
from gradleak.running.recipe import Prepared, client_round, prepare

BATCH_SIZES = (4, 8, 16)
POSITIONS = 64  # every position a CoLA batch of MiniLM reaches, and more
SHORTLIST = 8192  # (token, position) pairs nearest the slice the pursuit picks from


def lora_encoder_bag(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """Per batch: the slice's rank, the batch's distinct tokens and (token, position) pairs,
    and what the greedy pursuit picks of them."""
    started = time.perf_counter()
    if cola_or_skip("lora_encoder_bag", data_dir) is None:
        return
    torch.set_num_threads(1)
    rows = []
    for batch_size in BATCH_SIZES:
        config = config_from_options(
            {
                "model": "minilm",
                "dataset": "cola",
                "data_dir": data_dir,
                "attack": "dager",
                "batch_size": batch_size,
                "n_inputs": batches,
                "lora_rank": 32,
                "lora_alpha": 64,
                "round": 2,
                "mode": "eval",
                "known_lengths": False,
            }
        )
        prepared = prepare(config)
        for index in range(batches):
            rows.append(_one_batch(config, prepared, index, batch_size))
            print(rows[-1], flush=True)
    notes = (
        "MiniLM, LoRA r=32 alpha 64 on q,v, FedSGD round 2, eval, CoLA (sample seed 101); "
        "layer 1's A-gradient slice; greedy rank-aware pursuit over the (token, position) "
        f"pairs of positions 0-{POSITIONS - 1}, from the {SHORTLIST} nearest the slice."
    )
    for path in write_results(out_dir, "lora_encoder_bag", rows, started, notes):
        print(f"wrote {path}")


def _one_batch(
    config: RunConfig, prepared: Prepared, index: int, batch_size: int
) -> dict[str, object]:
    one = client_round(config, prepared, index)
    gm = one.knowledge.global_model
    model = unwrap(gm.copy_model().eval())
    adapter = gm.adapter
    target = weighted_slice(one.plan.layer1.checks[0].span)
    pairs = {(token, at) for ids in one.references_ids for at, token in enumerate(ids)}
    tokens = {token for token, _ in pairs}
    started = time.perf_counter()
    with torch.no_grad():
        embeddings = adapter.token_embedding(model).weight
        vocabulary = len(embeddings)
        inputs = [
            adapter.first_layer_input(model, embeddings, torch.full((vocabulary,), at))
            for at in range(POSITIONS)
        ]
        left = Pursuit(target).left().to(torch.float32)
        cosines = torch.stack([_cosine(x, left) for x in inputs]).flatten()
        nearest = torch.topk(cosines, SHORTLIST).indices.tolist()
        dictionary = torch.stack([inputs[i // vocabulary][i % vocabulary] for i in nearest]).to(
            torch.float64
        )
        # one pick at a time: a token's pairs at neighbouring positions are near twins
        support, picks, _ = sparse_support(target, lambda: dictionary, end_game=False)
    found = [(nearest[i] % vocabulary, nearest[i] // vocabulary) for i in support]
    found_tokens = {token for token, _ in found}
    return {
        "batch_size": batch_size,
        "input": index,
        "slice_rank": one.plan.layer1.rank,
        "distinct_tokens": len(tokens),
        "distinct_pairs": len(pairs),
        "picks": picks,
        "support": len(found),
        "tokens_found": len(found_tokens & tokens),
        "tokens_false": len(found_tokens - tokens),
        "picks_at_true_position": sum(pair in pairs for pair in found),
        "seconds": time.perf_counter() - started,
    }


def _cosine(inputs: torch.Tensor, left: torch.Tensor) -> torch.Tensor:
    along = inputs @ left
    return (along.square().sum(-1) / inputs.square().sum(-1)).sqrt()


SUITES = {"lora_encoder_bag": lora_encoder_bag}
