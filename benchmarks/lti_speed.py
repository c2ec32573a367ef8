"""What LTI's training costs on its victim (lti-lm, 16-token samples): making training updates
(per-example gradients by vmap over grad, then feature hashing to 10%), one Adam step of the
inversion model with each head, and reading one update once trained. Random token ids: the
costs do not depend on the text."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from report import write_results

from gradleak.attacks.lti.hashing import FeatureHasher
from gradleak.attacks.lti.model import InversionModel
from gradleak.attacks.lti.pairs import UpdateSampler, update_features
from gradleak.attacks.lti.training import predict
from gradleak.data import Example
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from gradleak.models.loading import load_victim

BATCH, LENGTH, REPEATS = 64, 16, 5


def lti_speed(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """Median and best of REPEATS timings of each part (``batches``, ``data_dir`` unused)."""
    started = time.perf_counter()
    victim = load_victim("lti-lm", "causal_lm")
    gm = GlobalModel.build(victim, Protocol(mode="train"))
    vocab = victim.model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    one = torch.randint(vocab, (LENGTH,), generator=generator).tolist()
    batch = gm.encode([Example(text="", token_ids=tuple(one))])
    knowledge = server_knowledge(gm, batch)
    keys = [s.key for s in gm.specs]
    size = UpdateSampler(knowledge, keys, FeatureHasher(1, 1), "train").size
    hasher = FeatureHasher(size, size // 10)
    sampler = UpdateSampler(knowledge, keys, hasher, "train")
    ids = torch.randint(vocab, (BATCH, 1, LENGTH), generator=generator)
    gradients = sampler.gradients(ids, None)  # warm-up, and the hashing's input
    features = hasher.hash_blocks(gradients, batch=BATCH)
    rows = [
        _row("per-example gradients", BATCH, lambda: sampler.gradients(ids, None)),
        _row("feature hashing", BATCH, lambda: hasher.hash_blocks(gradients, batch=BATCH)),
        _row("output layer's two products alone (a floor)", BATCH, _output_layer(victim)),
    ]
    table = victim.model.get_input_embeddings().weight
    targets = ids[:, 0, :]
    for head in ("embedding", "paper"):
        torch.manual_seed(0)
        model = InversionModel(hasher.k, LENGTH, vocab, head=head, embedding=table)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step(model=model, optimizer=optimizer):
            loss = torch.nn.functional.cross_entropy(model(features).flatten(0, 1),
                                                     targets.flatten())  # fmt: skip
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        step()
        params = sum(p.numel() for p in model.parameters())
        rows.append(_row(f"training step, {head} head ({params / 1e6:.1f}M)", BATCH, step))
        client = compute_update(gm, batch, seed=0)
        rows.append(_row(f"reading one update, {head} head", 1,
                         lambda model=model, client=client: predict(
                             model, update_features(client, keys, hasher)[None])))  # fmt: skip
    for row in rows:
        print(row, flush=True)
    notes = (
        f"lti-lm ({size:,} coordinates hashed to {hasher.k:,} bins), {BATCH} samples of "
        f"{LENGTH} tokens per call, train mode; median and best of {REPEATS} after one warm-up."
    )
    for path in write_results(out_dir, "lti_speed", rows, started, notes):
        print(f"wrote {path}")


def _output_layer(victim):
    """The two matrix products every exact per-example gradient needs at the output layer:
    the logits of BATCH x LENGTH positions over the vocabulary, and the backward pass through
    the frozen table (softmax minus the next tokens, times the table). No softmax, no rest of
    the model: a lower bound on the cost of making BATCH updates."""
    table = victim.model.get_output_embeddings().weight.detach()
    hidden = torch.randn(BATCH * LENGTH, table.shape[1])
    scores = torch.randn(BATCH * LENGTH, table.shape[0])

    def products():
        hidden @ table.T
        scores @ table

    return products


def _row(part: str, count: int, work) -> dict:
    seconds = []
    for _ in range(REPEATS):
        begin = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - begin)
    median = statistics.median(seconds)
    return {
        "part": part,
        "items per call": count,
        "s per call (median)": median,
        "s per call (best)": min(seconds),
        "items per s (median)": count / median,
    }


SUITES = {"lti_speed": lti_speed}
