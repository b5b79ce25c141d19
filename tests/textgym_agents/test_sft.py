"""sft_warm_start (TRL SFTTrainer on the policy's adapter) and gradient checkpointing."""

import math

import gymnasium as gym
import pytest
import torch
from datasets import Dataset

import textgym  # noqa: F401
from textgym import record_trajectories
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer, sft_warm_start
from textgym_agents.model.gradient_checkpointing import (
    disable_gradient_checkpointing,
    enable_gradient_checkpointing,
    gradient_checkpointing_enabled,
)
from textgym_agents.sft import prepare_sft_dataset
from textgym_agents.testing import tiny_model

ENV = "textgym/Blackjack-v1"
SFT = {"epochs": 2, "learning_rate": 3e-3, "batch_size": 8}


def hit_below_17(obs):
    return int(obs[0] < 17)


@pytest.fixture(scope="module")
def demos():
    """16 turns of a scripted expert: the policy's exact prompts and the expert's replies."""
    return record_trajectories(ENV, hit_below_17, n_episodes=14, seed=0).select(range(16))


def reply_nll(policy, dataset):
    """Mean NLL per reply token of the recorded replies, as the policy scores them for PPO."""
    eos = policy.tokenizer.eos_token_id
    prompts = [policy.encode(prompt) for prompt in dataset["prompt"]]
    replies = [policy.tokenizer.encode(c[0]["content"]) + [eos] for c in dataset["completion"]]
    with torch.no_grad():
        scores = policy.score(prompts, replies, values=False)
    return float(-(scores.logps * scores.mask).sum() / scores.mask.sum())


def base_and_head_state(policy):
    state = {k: v.clone() for k, v in policy.model.state_dict().items() if "lora_" not in k}
    state.update({f"value_head.{k}": v.clone() for k, v in policy.value_head.state_dict().items()})
    return state


@pytest.fixture(scope="module")
def warm(demos, tokenizer):
    """A tiny policy before and after sft_warm_start, with what it looked like before."""
    policy = PPOPolicy(*tiny_model(tokenizer), config=PPOConfig(num_steps=2, minibatch_size=8))
    before = {
        "nll": reply_nll(policy, demos),
        "base": base_and_head_state(policy),
        "lora": {k: v.clone() for k, v in policy.model.state_dict().items() if "lora_" in k},
        "config": policy.model.config.to_dict(),
    }
    metrics = sft_warm_start(policy, demos, **SFT)
    return policy, before, metrics


@pytest.mark.slow
def test_sft_lowers_the_loss_of_the_recorded_replies(warm, demos):
    policy, before, metrics = warm
    assert metrics["sft/rows"] == 16 and metrics["sft/steps"] == 4
    assert metrics["sft/loss_last"] < metrics["sft/loss_first"]
    assert math.isfinite(metrics["sft/train_loss"]) and metrics["sft/seconds"] > 0
    # The loss TRL minimised is the one PPO's scoring sees: the same reply tokens.
    assert reply_nll(policy, demos) < before["nll"] - 0.5


@pytest.mark.slow
def test_sft_changes_only_the_adapter_and_restores_the_model(warm):
    policy, before, _ = warm
    after = base_and_head_state(policy)
    assert after.keys() == before["base"].keys()
    assert all(torch.equal(after[k], v) for k, v in before["base"].items())
    lora = {k: v for k, v in policy.model.state_dict().items() if "lora_" in k}
    assert lora.keys() == before["lora"].keys()
    assert all(not torch.equal(lora[k], v) for k, v in before["lora"].items() if "lora_B" in k)
    # What the Trainer changes is put back: eval mode, left padding, KV cache on, no patches.
    assert not policy.model.training and policy.tokenizer.padding_side == "left"
    assert policy.model.config.to_dict() == before["config"]
    assert "forward" not in vars(policy.model.get_base_model())
    assert not gradient_checkpointing_enabled(policy.model)
    assert all(p.requires_grad for p in policy.trainable_parameters()[0])


def test_ppo_continues_from_the_warm_started_adapter(warm, demos):
    policy, before, _ = warm
    prompts = [policy.encode(p) for p in demos["prompt"][:4]]
    replies = [policy.tokenizer.encode(c[0]["content"]) for c in demos["completion"][:4]]
    with torch.no_grad():
        reference = policy.score(prompts, replies, adapter=False).logps
        adapted = policy.score(prompts, replies).logps
    fresh = PPOPolicy(*tiny_model(policy.tokenizer))  # same seed: the same base weights
    with torch.no_grad():
        base = fresh.score(prompts, replies, adapter=False).logps
    torch.testing.assert_close(reference, base)  # the reference is still the base model
    assert not torch.allclose(adapted, reference)  # the adapter carries the warm start

    trainer = PPOTrainer(policy, gym.make_vec(ENV, num_envs=2))
    lora = [p.detach().clone() for p in policy.trainable_parameters()[0]]
    metrics = trainer.update(trainer.collect())
    assert math.isfinite(metrics["loss/policy"]) and math.isfinite(metrics["loss/value"])
    moved = [
        not torch.equal(a, b) for a, b in zip(lora, policy.trainable_parameters()[0], strict=True)
    ]
    assert any(moved)


def test_sft_trains_the_tokens_the_policy_scores(demos, tokenizer):
    policy = PPOPolicy(*tiny_model(tokenizer))
    row = demos[0]
    messages = row["prompt"] + row["completion"]
    full = list(tokenizer.apply_chat_template(messages, return_dict=True)["input_ids"])
    prompt = policy.encode(row["prompt"])
    reply = tokenizer.encode(row["completion"][0]["content"]) + [tokenizer.eos_token_id]
    assert full[: len(prompt) + len(reply)] == prompt + reply


def test_prepare_sft_dataset_formats_filters_and_deduplicates(demos, tmp_path):
    demos.save_to_disk(tmp_path / "demos")
    rows = prepare_sft_dataset(tmp_path / "demos")
    assert rows.column_names == ["prompt", "completion"] and len(rows) == len(demos)
    assert rows.cache_files == []  # TRL's map()s must not write into the dataset directory
    distinct = {str(row) for row in zip(demos["prompt"], demos["completion"], strict=True)}
    assert len(prepare_sft_dataset(demos, deduplicate=True)) == len(distinct) < len(demos)

    invalid = demos.map(lambda row, i: {"invalid": i % 2 == 0}, with_indices=True)
    assert len(prepare_sft_dataset(invalid)) == len(demos) // 2

    chat = [{"role": "user", "content": "Hit?"}, {"role": "assistant", "content": "stick"}]
    rows = prepare_sft_dataset(Dataset.from_list([{"messages": chat}]))
    assert rows[0]["prompt"] == chat[:1] and rows[0]["completion"] == chat[1:]


@pytest.mark.parametrize(
    ("dataset", "prefix", "message"),
    [
        ({"text": ["hi"]}, "", "Expected a dataset with 'prompt' and 'completion' columns"),
        ({"messages": [[{"role": "user", "content": "hi"}]]}, "", "expected assistant messages"),
        (
            {"prompt": [[{"role": "user", "content": "?"}]]}
            | {"completion": [[{"role": "assistant", "content": "hit"}]]},
            '{"action": "',
            "does not start with the policy's reply_prefix",
        ),
    ],
)
def test_prepare_sft_dataset_rejects_what_it_cannot_train_on(dataset, prefix, message):
    with pytest.raises(ValueError, match=message):
        prepare_sft_dataset(Dataset.from_dict(dataset), prefix)


# --- gradient checkpointing ----------------------------------------------------------------------


def score_gradients(policy, prompts, responses, choices):
    """The loss and LoRA gradients of one scoring pass, and the bytes autograd kept for it."""
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    policy.model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        scores = policy.score(prompts, responses, choices=choices, with_entropy=True)
        loss = (scores.logps * scores.mask).sum() + scores.values.sum() + scores.entropy.sum()
    loss.backward()
    grads = [p.grad.clone() for p in policy.trainable_parameters()[0]]
    return loss.detach(), grads, sum(saved)


@pytest.mark.parametrize("decoding", ["free", "choices"])
def test_checkpointing_keeps_ppo_gradients_with_the_prefix_cache(decoding, tokenizer):
    config = PPOConfig(decoding=decoding, reply_prefix='{"action": "')
    policy = PPOPolicy(*tiny_model(tokenizer, num_layers=4), config=config)
    env = gym.make(ENV)
    prompts = [policy.encode(env.reset(seed=seed)[0]) for seed in range(6)]
    choices = policy.choice_ids(_choices(env))
    responses = [choices[seed % 2] for seed in range(6)]
    per_row = [choices] * 6 if decoding == "choices" else None

    loss, grads, kept = score_gradients(policy, prompts, responses, per_row)
    assert not policy.model.training  # PPO's eval mode, where transformers' checkpointing is off
    enable_gradient_checkpointing(policy.model)
    assert gradient_checkpointing_enabled(policy.model)
    loss_gc, grads_gc, kept_gc = score_gradients(policy, prompts, responses, per_row)
    assert torch.equal(loss_gc, loss)
    for grad, grad_gc in zip(grads, grads_gc, strict=True):
        torch.testing.assert_close(grad_gc, grad, rtol=1e-5, atol=1e-7)
    assert kept_gc < 0.8 * kept
    with torch.no_grad():  # generation and rollout scoring run the layers as usual
        assert policy.generate([env.reset(seed=0)[0]], choices=[_choices(env)]).texts

    disable_gradient_checkpointing(policy.model)
    assert not gradient_checkpointing_enabled(policy.model)
    assert score_gradients(policy, prompts, responses, per_row)[2] == kept


def _choices(env):
    return env.get_wrapper_attr("reply_choices")()


@pytest.mark.slow
def test_sft_with_gradient_checkpointing_trains_the_same(demos, tokenizer):
    rows = demos.select(range(8))
    results = []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # the LoRA A matrices are drawn from the global RNG
        policy = PPOPolicy(*tiny_model(tokenizer))
        metrics = sft_warm_start(
            policy, rows, epochs=1, batch_size=8, gradient_checkpointing=checkpointing
        )
        results.append((metrics["sft/loss_first"], policy.trainable_parameters()[0]))
        assert not gradient_checkpointing_enabled(policy.model)
    (loss, params), (loss_gc, params_gc) = results
    assert loss_gc == pytest.approx(loss, rel=1e-5)
    for p, p_gc in zip(params, params_gc, strict=True):
        torch.testing.assert_close(p_gc, p, rtol=1e-4, atol=1e-6)

    enable_gradient_checkpointing(policy.model)  # enabled by the caller: left enabled
    sft_warm_start(policy, rows, max_steps=1, gradient_checkpointing=True)
    assert gradient_checkpointing_enabled(policy.model)


@pytest.mark.parametrize(("mixed", "expected"), [(True, torch.bfloat16), (False, torch.float32)])
@pytest.mark.slow
def test_sft_on_a_bf16_base_uses_ppos_mixed_precision(demos, tokenizer, mixed, expected):
    model, _ = tiny_model(tokenizer, dtype=torch.bfloat16)
    policy = PPOPolicy(model, tokenizer, config=PPOConfig(mixed_precision=mixed))
    seen = []
    for name, module in policy.model.named_modules():
        if name.endswith("lora_A.default"):
            module.register_forward_hook(lambda m, a, out: seen.append((a[0].dtype, out.dtype)))
    before = reply_nll(policy, demos)
    seen.clear()
    metrics = sft_warm_start(policy, demos, **SFT)
    assert seen and set(seen) == {(expected, expected)}  # the products SFT ran
    assert all(p.dtype is torch.float32 for p in policy.trainable_parameters()[0])
    assert metrics["sft/loss_last"] < metrics["sft/loss_first"]
    assert reply_nll(policy, demos) < before - 0.5
    assert not torch.is_autocast_enabled("cpu")  # nothing left switched on
