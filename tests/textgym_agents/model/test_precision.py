import json

import gymnasium as gym
import pytest
import torch

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.model.adapters import ValueHead
from textgym_agents.model.loading import resolve_precision
from textgym_agents.model.precision import (
    BF16_MIN_SPEEDUP,
    CpuSpeeds,
    Precision,
    choose_precision,
    cpu_signature,
    decode_gweights,
    matmul_gflops,
    measured_choice,
    mixed_precision,
)
from textgym_agents.testing import perturb_adapter, tiny_model


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TEXTGYM_CACHE", str(tmp_path))
    return tmp_path / "precision.json"


def test_cpu_choice_is_measured_once_and_cached(cache, monkeypatch):
    calls = []

    def fake(dtype, **kwargs):
        calls.append(dtype)
        return {torch.float32: 100.0, torch.bfloat16: 40.0}[dtype]

    monkeypatch.setattr("textgym_agents.model.precision.matmul_gflops", fake)
    first = resolve_precision("auto", "cpu")
    second = resolve_precision("auto", "cpu")
    assert first == second
    assert first.dtype is torch.float32
    assert calls == [torch.float32, torch.bfloat16]  # the second call read the cache
    # bf16 is slow for passes, so generation's shape (only ever bf16 after them) is not timed
    assert json.loads(cache.read_text()) == {
        cpu_signature(): {"fp32": 100.0, "bf16": 40.0, "decode_fp32": None, "decode_bf16": None}
    }
    assert first.reason == (
        "auto: bf16 matmul 40 vs fp32 100 GFLOP/s on this CPU (0.40x; bf16 needs >= 1.25x)"
    )


def fake_speeds(monkeypatch, speeds):
    monkeypatch.setattr("textgym_agents.model.precision._measure_cpu", lambda path: speeds)


@pytest.mark.parametrize(
    ("bf16", "expected"),
    [(100 * BF16_MIN_SPEEDUP, torch.bfloat16), (100 * BF16_MIN_SPEEDUP - 1, torch.float32)],
)
def test_cpu_threshold(bf16, expected, cache, monkeypatch):
    fake_speeds(monkeypatch, CpuSpeeds(100.0, bf16, 4.0, 4.0))
    assert choose_precision(torch.device("cpu")).dtype is expected


@pytest.mark.parametrize(
    ("decode_bf16", "dtype", "name"),
    [(4.0, torch.bfloat16, "bfloat16"), (3.9, torch.float32, "bfloat16-passes")],
)
def test_bf16_weights_need_bf16_generation_at_least_as_fast(
    decode_bf16, dtype, name, cache, monkeypatch
):
    """Fast bf16 matmuls but slower bf16 generation: fp32 weights, bf16 passes."""
    fake_speeds(monkeypatch, CpuSpeeds(100.0, 300.0, 4.0, decode_bf16))
    choice = choose_precision(torch.device("cpu"))
    assert (choice.dtype, choice.name, choice.decode_bf16) == (dtype, name, decode_bf16)
    assert choice.pass_dtype is (torch.bfloat16 if name.endswith("passes") else None)
    assert choice.reason.startswith("auto: bf16 matmul 300 vs fp32 100 GFLOP/s")
    assert "generation-shaped products bf16" in choice.reason


def test_generation_shape_is_timed_only_when_bf16_passes_win(cache, monkeypatch):
    timed = []
    monkeypatch.setattr(
        "textgym_agents.model.precision.matmul_gflops",
        lambda dtype, **_: {torch.float32: 100.0, torch.bfloat16: 300.0}[dtype],
    )

    def fake_decode(dtype, **_):
        timed.append(dtype)
        return {torch.float32: 4.0, torch.bfloat16: 2.0}[dtype]

    monkeypatch.setattr("textgym_agents.model.precision.decode_gweights", fake_decode)
    cache.write_text(json.dumps({cpu_signature(): {"fp32": 100.0, "bf16": 300.0}}))
    choice = resolve_precision("auto", "cpu")  # an entry from before: measured again
    assert timed == [torch.float32, torch.bfloat16]
    assert choice.name == "bfloat16-passes" and choice.dtype is torch.float32
    assert json.loads(cache.read_text())[cpu_signature()]["decode_bf16"] == 2.0
    assert resolve_precision("auto", "cpu") == choice and len(timed) == 2  # cached now


def test_a_measured_choice_is_kept_for_the_machine_beside_the_speeds(cache, monkeypatch):
    monkeypatch.setattr("textgym_agents.model.precision._CHOSEN", {})
    assert measured_choice("kernel", lambda: "fast one", cache_file=cache) == "fast one"
    assert measured_choice("kernel", lambda: "other", cache_file=cache) == "fast one"
    monkeypatch.setattr("textgym_agents.model.precision._CHOSEN", {})  # a new process
    assert measured_choice("kernel", lambda: "other", cache_file=cache) == "fast one"
    monkeypatch.setattr(
        "textgym_agents.model.precision.matmul_gflops",
        lambda dtype, **kwargs: {torch.float32: 100.0, torch.bfloat16: 40.0}[dtype],
    )
    resolve_precision("auto", "cpu")  # the speeds measured later keep the choices
    entry = json.loads(cache.read_text())[cpu_signature()]
    assert entry["choices"] == {"kernel": "fast one"} and entry["fp32"] == 100.0
    assert measured_choice("unsaved", lambda: "x", cache_file=None) == "x"
    assert "unsaved" not in json.loads(cache.read_text())[cpu_signature()]["choices"]


def test_when_two_processes_choose_at_once_the_first_written_wins(cache, monkeypatch):
    monkeypatch.setattr("textgym_agents.model.precision._CHOSEN", {})

    def measure_while_another_process_writes():
        cache.write_text(json.dumps({cpu_signature(): {"choices": {"kernel": "theirs"}}}))
        return "ours"

    assert measured_choice("kernel", measure_while_another_process_writes, cache_file=cache) == (
        "theirs"
    )


def test_decode_gweights_is_positive():
    assert decode_gweights(torch.float32, seconds=0.01) > 0


@pytest.mark.parametrize("spec", ["bfloat16-passes", "bf16-passes"])
def test_split_precision_spec(spec):
    choice = resolve_precision(spec, "cpu")
    assert (choice.dtype, choice.pass_dtype, choice.name) == (
        torch.float32,
        torch.bfloat16,
        "bfloat16-passes",
    )
    assert json.loads(json.dumps(choice.to_dict()))["pass_dtype"] == "bfloat16"


def test_a_damaged_cache_is_measured_again(cache):
    cache.write_text("{not json")
    choice = choose_precision(torch.device("cpu"), cache_file=cache)
    assert choice.fp32_gflops > 0 and choice.bf16_gflops > 0
    assert cpu_signature() in json.loads(cache.read_text())


def test_matmul_gflops_is_positive_for_both_dtypes():
    assert matmul_gflops(torch.float32, seconds=0.01) > 0
    assert matmul_gflops(torch.bfloat16, seconds=0.01) > 0


def test_precision_record_is_json():
    record = Precision(torch.bfloat16, "requested bfloat16").to_dict()
    assert json.loads(json.dumps(record))["dtype"] == "bfloat16"


def bf16_policy(num_kv_heads=None, split=False, **overrides):
    """A tiny policy in bf16; ``split``: fp32 weights with bf16 passes ("bfloat16-passes")."""
    dtype = torch.float32 if split else torch.bfloat16
    model, tokenizer = tiny_model(dtype=dtype, num_kv_heads=num_kv_heads)
    config = dict(num_steps=2, minibatch_size=8, micro_batch_size=4, kl_coef=0.0, seed=0)
    info = {"dtype": "bfloat16-passes"} if split else None
    config = PPOConfig(**{**config, **overrides})
    return PPOPolicy(model, tokenizer, config=config, base_info=info)


def test_bf16_model_keeps_trainable_weights_in_fp32():
    policy = bf16_policy()
    lora, head = policy.trainable_parameters()
    assert lora and all(p.dtype is torch.float32 for p in lora)
    assert all(p.dtype is torch.float32 for p in head)
    frozen = [p for p in policy.model.parameters() if not p.requires_grad]
    assert frozen and all(p.dtype is torch.bfloat16 for p in frozen)


@pytest.mark.parametrize("split", [False, True], ids=["bf16", "bf16-passes"])
@pytest.mark.parametrize("num_kv_heads", [None, 2])  # 2: grouped-query heads, sdpa_gqa
@pytest.mark.parametrize(
    ("decoding", "reuse", "atol"),
    [("free", True, 0.0), ("choices", False, 0.0), ("choices", True, 0.05)],
)
@pytest.mark.slow
def test_bf16_first_ratio_is_one(decoding, reuse, atol, num_kv_heads, split, policy_loss_calls):
    """Old and new log-probs in bf16: exact from one layout; reused rollout scores within 0.05."""
    calls = policy_loss_calls
    policy = bf16_policy(
        num_kv_heads, split, decoding=decoding, reuse_rollout_scores=reuse, max_new_tokens=4
    )
    grouped = policy.model.get_base_model().config._attn_implementation == "sdpa_gqa"
    assert grouped is (num_kv_heads is not None)
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    metrics = trainer.update(trainer.collect())
    new, old, mask = calls[0]
    assert new.dtype is torch.float32 and mask.sum() > 0
    torch.testing.assert_close(new * mask, old * mask, atol=atol, rtol=0)
    assert metrics["policy/ratio_mean"] == pytest.approx(1.0, abs=0.1)


CHATS = [
    [{"role": "user", "content": "Hit or stick?"}],
    [{"role": "user", "content": "Your hand totals 15. The dealer shows a 10. Hit or stick?"}],
]


def lora_dtypes(policy):
    """Records (input, output) dtypes of every LoRA A product while attached."""
    seen = []
    for name, module in policy.model.named_modules():
        if name.endswith("lora_A.default"):
            module.register_forward_hook(lambda m, a, out: seen.append((a[0].dtype, out.dtype)))
    return seen


@pytest.mark.parametrize(("mixed", "expected"), [(True, torch.bfloat16), (False, torch.float32)])
def test_mixed_precision_runs_lora_in_the_base_dtype_with_fp32_masters(mixed, expected):
    policy = perturb_adapter(bf16_policy(mixed_precision=mixed, max_new_tokens=4))
    generation = policy.generate(CHATS)
    seen = lora_dtypes(policy)
    scores = policy.score(generation.prompt_ids, generation.response_ids)
    assert seen and set(seen) == {(expected, expected)}
    assert scores.logps.dtype is torch.float32 and scores.values.dtype is torch.float32
    (scores.logps.sum() + scores.values.sum()).backward()
    lora, head = policy.trainable_parameters()
    assert all(p.grad is not None and p.grad.dtype is torch.float32 for p in lora + head)
    assert any(p.grad.abs().sum() > 0 for p in lora)
    assert all(p.dtype is torch.float32 for p in lora + head)


def test_mixed_precision_changes_bf16_results_by_rounding_only():
    mixed, plain = (perturb_adapter(bf16_policy(mixed_precision=m)) for m in (True, False))
    generation = plain.generate(CHATS)
    with torch.no_grad():
        a = mixed.score(generation.prompt_ids, generation.response_ids)
        b = plain.score(generation.prompt_ids, generation.response_ids)
    assert not torch.equal(a.logps * a.mask, b.logps * b.mask)  # the LoRA products differ
    # bf16 keeps ~3 significant digits: log-probs near -10 move by a few hundredths.
    torch.testing.assert_close(a.logps * a.mask, b.logps * b.mask, atol=0.05, rtol=0.02)
    torch.testing.assert_close(a.values, b.values, atol=0.05, rtol=0.02)


def tuner_layers(model):
    """peft's adapted layers (those with an input-cast switch)."""
    return [m for m in model.modules() if hasattr(m, "cast_input_dtype_enabled")]


def test_mixed_precision_leaves_a_float32_model_alone():
    model = PPOPolicy(*tiny_model()).model
    layers = tuner_layers(model)
    with mixed_precision(model):
        assert not torch.is_autocast_enabled("cpu")
        assert layers and all(m.cast_input_dtype_enabled for m in layers)
    policies = []
    for mixed in (True, False):
        model, tokenizer = tiny_model()
        config = PPOConfig(mixed_precision=mixed, max_new_tokens=4)
        policies.append(perturb_adapter(PPOPolicy(model, tokenizer, config=config)))
    generation = policies[1].generate(CHATS)
    with torch.no_grad():
        a, b = (p.score(generation.prompt_ids, generation.response_ids) for p in policies)
    assert torch.equal(a.logps, b.logps) and torch.equal(a.values, b.values)


def test_value_head_stays_fp32_under_autocast():
    head = ValueHead(8)
    torch.nn.init.normal_(head.summary.weight)
    hidden = torch.randn(2, 3, 8).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = head(hidden)
    assert inside.dtype is torch.float32
    assert torch.equal(inside, head(hidden))


def test_mixed_precision_restores_peft_input_casting():
    policy = bf16_policy()
    layers = tuner_layers(policy.model)
    with mixed_precision(policy.model):
        with mixed_precision(policy.model):  # nested (generate -> score_choices): entered once
            pass
        assert layers and not any(m.cast_input_dtype_enabled for m in layers)
        assert torch.is_autocast_enabled("cpu")
    assert all(m.cast_input_dtype_enabled for m in layers)
    assert not torch.is_autocast_enabled("cpu")


def base_matmul_dtypes(policy):
    """Records the output dtype of every frozen base projection's call while attached."""
    seen = []
    for name, module in policy.model.named_modules():
        if name.endswith("q_proj.base_layer"):
            module.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    return seen


def test_split_precision_generates_in_fp32_and_runs_passes_in_bf16():
    policy = perturb_adapter(bf16_policy(split=True, max_new_tokens=4, decoding="auto"))
    assert policy.pass_dtype is torch.bfloat16
    assert all(p.dtype is torch.float32 for p in policy.model.parameters())  # one copy, fp32
    seen = base_matmul_dtypes(policy)
    generation = policy.generate(CHATS)  # free text, token by token
    assert seen and set(seen) == {torch.float32}
    seen.clear()
    scores = policy.score(generation.prompt_ids, generation.response_ids)
    assert seen and set(seen) == {torch.bfloat16}
    assert scores.logps.dtype is torch.float32 and scores.values.dtype is torch.float32
    seen.clear()
    picked = policy.generate(CHATS, choices=[["hit", "stick"]] * 2)  # choices: a pass
    assert set(picked.texts) <= {"hit", "stick"} and set(seen) == {torch.bfloat16}
    (scores.logps.sum() + scores.values.sum()).backward()
    lora, head = policy.trainable_parameters()
    assert all(p.grad is not None and p.grad.dtype is torch.float32 for p in lora + head)
    assert any(p.grad.abs().sum() > 0 for p in lora)


def test_split_precision_scores_as_bf16_weights_do_up_to_rounding():
    split = perturb_adapter(bf16_policy(split=True))
    reference = perturb_adapter(bf16_policy(split=False))  # the same tiny weights, stored in bf16
    generation = split.generate(CHATS, greedy=True)  # likely tokens: no log-prob near -20
    with torch.no_grad():
        a = split.score(generation.prompt_ids, generation.response_ids)
        b = reference.score(generation.prompt_ids, generation.response_ids)
    # The same weights rounded to bf16 in both; the split policy keeps its residual stream fp32.
    torch.testing.assert_close(a.logps * a.mask, b.logps * b.mask, atol=0.05, rtol=0.02)
    torch.testing.assert_close(a.values, b.values, atol=0.05, rtol=0.02)
