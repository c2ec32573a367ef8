"""What DAGER reads from an encoder's LoRA update: the bag of tokens, not their order.

MiniLM with LoRA r=32, alpha 64 on q and v, FedSGD at round 2 (the global model trained one
round by other clients), eval mode, CoLA in LAMP's order. Once a batch holds more (token,
position) pairs than layer 1's 64 gradient rows, its span is a slice of theirs and DAGER reads
it by sparse recovery over every (token, position) pair (``dager/sparse.py``): the record's
``info["tokens"]``. Scored here against the batch's own distinct tokens, beside the strict
scores of the tokens laid out by position.
"""

from __future__ import annotations

import time
from pathlib import Path

from report import cola_or_skip, write_results

import gradleak
from gradleak.api import load_model

BATCH_SIZES = (4, 8, 16)


def lora_encoder_bag(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """Per batch size: DAGER's exact share and strict ROUGE-1, and the batch tokens its
    token bag holds (found, and others), over ``batches`` CoLA batches."""
    started = time.perf_counter()
    if cola_or_skip("lora_encoder_bag", data_dir) is None:
        return
    _, tokenizer = load_model("minilm")
    special = set(tokenizer.all_special_ids)
    rows = []
    for batch_size in BATCH_SIZES:
        record = gradleak.attack(
            model="minilm",
            dataset="cola",
            data_dir=data_dir,
            attack="dager",
            batch_size=batch_size,
            n_inputs=batches,
            lora_rank=32,
            lora_alpha=64,
            round=2,
            mode="eval",
            known_lengths=False,
            workers=1,
            threads=1,
            progress=False,
        )
        for sample in record.samples:
            truth = {t for text in sample.reference for t in tokenizer(text)["input_ids"]}
            truth -= special
            bag = set(sample.info.get("tokens", [])) - special
            rows.append(
                {
                    "batch_size": batch_size,
                    "input": sample.index,
                    "rank_layer1": sample.info.get("rank_layer1"),
                    "exact_%": 100 * sum(sample.exact) / len(sample.exact),
                    "strict_rouge1": sample.metrics.strict.rouge1,
                    "batch_tokens": len(truth),
                    "bag_found": len(bag & truth) if bag else None,
                    "bag_others": len(bag - truth) if bag else None,
                    "attack_s": sample.attack_s,
                }
            )
            print(rows[-1], flush=True)
    notes = (
        "MiniLM, LoRA r=32 alpha 64 on q,v, FedSGD round 2, eval, CoLA (sample seed 101); "
        "DAGER's record; batch tokens without [CLS]/[SEP]; bag: info['tokens'] where the "
        "slice was read by sparse recovery (empty: the exact search ran)."
    )
    for path in write_results(out_dir, "lora_encoder_bag", rows, started, notes):
        print(f"wrote {path}")


SUITES = {"lora_encoder_bag": lora_encoder_bag}
