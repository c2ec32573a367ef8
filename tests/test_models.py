"""Model registry and adapters: names resolve, roles map to the right modules, tasks encode."""

from __future__ import annotations

import pytest
import torch
from transformers import MPNetConfig, MPNetForSequenceClassification

from gradleak.data import Example
from gradleak.errors import GradleakError
from gradleak.models.adapters import ROLES, MPNetAdapter
from gradleak.models.registry import MODELS, load_victim, model_status
from gradleak.models.tasks import encode_examples


def test_unknown_model_is_a_clear_error():
    with pytest.raises(GradleakError, match="unknown model 'bert-huge'"):
        load_victim("bert-huge")


def test_unknown_task_is_a_clear_error():
    with pytest.raises(GradleakError, match="unknown task"):
        load_victim("tiny-bert", task="translation")


def test_minilm_loads_offline_with_eager_attention():
    victim = load_victim("minilm")
    config = victim.model.config
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("bert", 384, 6)
    assert config._attn_implementation == "eager"
    assert victim.tokenizer.vocab_size == 30522
    assert victim.model.training  # clients train in train mode unless told otherwise
    assert victim.adapter.dropout_rate(victim.model) == pytest.approx(0.1)


def test_head_init_depends_on_the_seed():
    a = load_victim("tiny-bert", seed=1).model.classifier.weight
    b = load_victim("tiny-bert", seed=1).model.classifier.weight
    c = load_victim("tiny-bert", seed=2).model.classifier.weight
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_model_listing_knows_every_registered_model():
    for name in MODELS:
        assert model_status(name).startswith(("present", "missing"))
    assert model_status("tiny-bert") == "present"


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-gpt2", "tiny-llama"])
def test_every_role_of_every_layer_is_a_distinct_module_or_fused_part(name):
    victim = load_victim(name)
    seen = set()
    for layer in range(victim.adapter.num_layers(victim.model)):
        for role in ROLES:
            rm = victim.adapter.role_module(victim.model, layer, role)
            key = (id(rm.module), rm.part)
            assert key not in seen, (layer, role)
            seen.add(key)


def test_mpnet_adapter_roles_and_first_layer_input():
    config = MPNetConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    model = MPNetForSequenceClassification(config).eval()
    adapter = MPNetAdapter()
    assert adapter.num_layers(model) == 2
    assert (
        adapter.role_module(model, 1, "o").module is model.mpnet.encoder.layer[1].attention.attn.o
    )
    ids = torch.tensor([[0, 5, 6, 7, 2]])
    seen = {}

    def record_input(_module, args, _out):
        seen["x"] = args[0]

    handle = adapter.role_module(model, 0, "q").module.register_forward_hook(record_input)
    with torch.no_grad():
        model(input_ids=ids)
        ours = adapter.first_layer_input(model, adapter.token_embedding(model)(ids))
    handle.remove()
    assert torch.allclose(ours, seen["x"], atol=1e-6)


def test_qa_labels_point_at_the_answer_tokens():
    victim = load_victim("tiny-bert", task="qa")
    context = "The clinic opened in 1998 on Elm Street."
    example = Example(
        "When did the clinic open?", context=context, answer_start=21, answer_text="1998"
    )
    batch = encode_examples(victim.tokenizer, [example], "qa", 128)
    start, end = batch.labels["start"].item(), batch.labels["end"].item()
    answer = victim.tokenizer.decode(batch.input_ids[0, start : end + 1])
    assert answer == "1998"
    assert batch.token_type_ids[0, start] == 1


def test_classification_without_labels_is_an_error():
    victim = load_victim("tiny-bert")
    with pytest.raises(GradleakError, match="labeled"):
        encode_examples(victim.tokenizer, [Example("no label here")], "classification", 128)


def test_too_long_sequence_is_an_error_unless_truncated():
    victim = load_victim("tiny-bert")
    long = [Example(" ".join(["word"] * 300), label=0)]
    with pytest.raises(GradleakError, match="--max-tokens"):
        encode_examples(victim.tokenizer, long, "classification", 128)
    batch = encode_examples(victim.tokenizer, long, "classification", 128, max_tokens=16)
    assert batch.input_ids.shape == (1, 16)


def test_causal_lm_examples_end_with_one_eos_even_when_truncated(tiny_victim):
    victim = tiny_victim("tiny-gpt2", "causal_lm")
    tokenizer = victim.tokenizer
    # The tiny models' tokenizer ends rows with [SEP], their EOS: nothing is added.
    plain = encode_examples(tokenizer, [Example("a dog ran home")], "causal_lm", 128)
    assert plain.input_ids[0, plain.lengths[0] - 1] == tokenizer.sep_token_id
    assert (plain.input_ids[0] == tokenizer.sep_token_id).sum() == 1
    tokenizer.eos_token = "[MASK]"  # an EOS the tokenizer does not append itself
    batch = encode_examples(tokenizer, [Example("a dog ran home")], "causal_lm", 128)
    assert batch.lengths[0] == plain.lengths[0] + 1
    assert batch.input_ids[0, batch.lengths[0] - 1] == tokenizer.mask_token_id
    short = encode_examples(tokenizer, [Example("a dog ran home")], "causal_lm", 128, 4)
    assert short.input_ids[0].tolist()[-1] == tokenizer.mask_token_id
    assert short.lengths[0] == 4
    classification = encode_examples(tokenizer, [Example("a dog", label=0)], "classification", 128)
    assert tokenizer.mask_token_id not in classification.input_ids[0].tolist()
