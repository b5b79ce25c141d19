import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer, RolloutBuffer, Turn
from textgym_agents.testing import paying_choice_env, paying_choice_policy, tiny_model


def small_config(**overrides):
    values = dict(num_steps=2, max_new_tokens=6, minibatch_size=8, micro_batch_size=4, seed=0)
    values.update(overrides)
    return PPOConfig(**values)


@pytest.fixture
def policy():
    model, tokenizer = tiny_model()
    return PPOPolicy(model, tokenizer, config=small_config())


def test_first_minibatch_ratio_is_exactly_one(policy, policy_loss_calls):
    calls = policy_loss_calls
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    trainer.update(trainer.collect())
    new, old, mask = calls[0]
    assert mask.sum() > 0
    assert torch.equal(new * mask, old * mask)  # bit-identical: same layout, same weights
    # later minibatches (after optimizer steps) move away from the old policy
    assert any(not torch.equal(n * m, o * m) for n, o, m in calls[2:])


@pytest.mark.parametrize("decoding", ["free", "choices"])
def test_trainers_with_one_seed_sample_the_same_rollout(decoding):
    """The trainer seeds sampling (torch's generator), as TRL's and SB3's trainers do."""
    replies = []
    for _ in range(2):
        torch.manual_seed(len(replies))  # whatever happened before in the process
        policy = PPOPolicy(*tiny_model(), config=small_config(decoding=decoding))
        trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
        replies.append([turn.response_ids for turn in trainer.collect()])
    assert replies[0] == replies[1]


def test_kl_to_reference_is_zero_before_training(policy):
    prompts = [policy.encode([{"role": "user", "content": "hit?"}])]
    responses = [[1, 2, 3]]
    with torch.no_grad():
        own = policy.score(prompts, responses)
        ref = policy.score(prompts, responses, adapter=False)
    assert torch.equal(own.logps, ref.logps)


def test_update_changes_lora_and_value_head_only(policy):
    base_before = {
        n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" not in n
    }
    lora_before = {
        n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" in n
    }
    head_before = [p.detach().clone() for p in policy.value_head.parameters()]
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    metrics = trainer.update(trainer.collect())
    for key in ["loss/policy", "loss/value", "policy/entropy", "policy/approx_kl"]:
        assert math.isfinite(metrics[key]), key
    named = dict(policy.model.named_parameters())
    assert all(torch.equal(named[n], p) for n, p in base_before.items())
    assert any(not torch.equal(named[n], p) for n, p in lora_before.items())
    assert any(
        not torch.equal(a, b)
        for a, b in zip(policy.value_head.parameters(), head_before, strict=True)
    )


@pytest.mark.parametrize("decoding", ["free", "choices"])
@pytest.mark.slow
def test_gradient_checkpointing_gives_the_same_update(decoding):
    from textgym_agents.model.gradient_checkpointing import gradient_checkpointing_enabled

    def one_update(checkpointing):
        torch.manual_seed(0)  # the same sampled rollout both times
        config = small_config(decoding=decoding, gradient_checkpointing=checkpointing)
        policy = PPOPolicy(*tiny_model(), config=config)
        trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
        assert gradient_checkpointing_enabled(policy.model) is checkpointing
        metrics = trainer.update(trainer.collect())
        weights = [p.detach() for n, p in policy.model.named_parameters() if "lora_" in n]
        return metrics, weights

    (plain, plain_weights), (ckpt, ckpt_weights) = one_update(False), one_update(True)
    for key in ["loss/policy", "loss/value", "policy/entropy", "policy/approx_kl"]:
        assert math.isclose(plain[key], ckpt[key], rel_tol=1e-5, abs_tol=1e-7), key
    for a, b in zip(plain_weights, ckpt_weights, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.slow
def test_kl_grows_after_updates():
    policy = PPOPolicy(*tiny_model(), config=small_config(kl_coef=0.02))
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    first = trainer.update(trainer.collect())
    assert first["objective/kl"] == 0.0
    trainer.update(trainer.collect())
    buffer = trainer.collect()
    trainer.score(buffer.turns(), np.arange(len(buffer)))
    trainer.compute_advantages(buffer)
    assert any(abs(t.kl) > 0 for t in buffer.turns())


def test_hand_filled_buffer_step_by_step(policy):
    """Users who own the loop fill a buffer themselves and call update()."""
    trainer = PPOTrainer(policy)
    env = gym.make("textgym/Blackjack-v1")
    buffer = RolloutBuffer()
    for episode in range(3):
        messages, _ = env.reset(seed=episode)
        done = False
        while not done:
            generation = policy.generate([messages])
            messages, reward, terminated, truncated, info = env.step(generation.texts[0])
            done = terminated or truncated
            turn = Turn(
                generation.prompt_ids[0],
                generation.response_ids[0],
                float(reward),
                terminated=terminated,
                truncated=truncated and not terminated,
                invalid=info["invalid"],
            )
            if turn.truncated:
                turn.bootstrap_ids = policy.encode(messages)
            buffer.add(episode, turn)
    added = len(buffer)
    lora, head = policy.trainable_parameters()
    before = [p.detach().clone() for p in [*lora, *head]]
    metrics = trainer.update(buffer)
    assert added >= 3  # at least one turn per episode
    assert metrics["env/turns"] == trainer.turns == added  # every turn the user added counted
    assert metrics["train/update"] == trainer.update_step == 1
    assert math.isfinite(metrics["loss/total"])
    assert any(not torch.equal(a, p) for a, p in zip(before, [*lora, *head], strict=True))
    assert len(buffer) == 0  # consumed
    with pytest.raises(ValueError, match="This trainer has no envs"):
        trainer.collect()


def test_single_env_and_episode_counting(policy):
    trainer = PPOTrainer(policy, gym.make("textgym/Blackjack-v1"))
    metrics = trainer.step()
    assert metrics["env/turns"] == policy.config.num_steps
    assert trainer.episodes == metrics["env/episodes"]
    assert metrics["throughput/turns_per_s"] > 0


def test_truncated_turns_bootstrap_from_final_observation(policy):
    # Every reply is invalid for a random tiny model: max_invalid=1 truncates each episode.
    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=2, max_invalid=1)
    trainer = PPOTrainer(policy, envs)
    buffer = trainer.collect()
    truncated = [t for t in buffer.turns() if t.truncated]
    assert truncated and all(t.bootstrap_ids is not None for t in truncated)


@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP"])
def test_autoreset_modes(policy, mode):
    # Every reply of the random tiny model is invalid: with max_invalid=1 each episode is one
    # turn, so every env autoresets after every turn, inside the rollout.
    envs = gym.make_vec(
        "textgym/Blackjack-v1",
        num_envs=2,
        max_invalid=1,
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode[mode]},
    )
    trainer = PPOTrainer(policy, envs)
    buffer = trainer.collect()
    num_steps = policy.config.num_steps
    assert sorted(buffer.streams) == [0, 1]
    # NEXT_STEP spends a step on the reset, which is neither a turn nor counted as a step.
    assert [len(turns) for turns in buffer.streams.values()] == [num_steps] * 2
    assert all(turn.done for turn in buffer.turns())  # no reset step became a turn
    episodes = trainer.collector.drain()
    assert [(e.env_index, e.length) for e in episodes] == [(0, 1), (1, 1)] * num_steps


def test_same_step_autoreset_keeps_the_invalid_flag_of_the_final_turn(policy):
    envs = gym.make_vec(
        "textgym/Blackjack-v1",
        num_envs=2,
        max_invalid=1,
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    buffer = PPOTrainer(policy, envs).collect()
    assert all(turn.invalid for turn in buffer.turns())  # as NEXT_STEP records them


def test_policy_learns_to_prefer_paying_reply():
    """A tiny model learns that "yes" pays: > 90% of greedy replies within 20 updates."""
    policy = paying_choice_policy()
    envs = gym.vector.SyncVectorEnv([paying_choice_env for _ in range(16)])
    trainer = PPOTrainer(policy, envs)
    prompts = [paying_choice_env().reset(seed=seed)[0] for seed in range(16)]
    assert len({p[-1]["content"] for p in prompts}) == 4

    def greedy_yes_rate():
        return np.mean([reply == "yes" for reply in policy.act(prompts, greedy=True)])

    history = []
    for _ in range(20):
        metrics = trainer.step()
        # No rate until an episode ends with a valid reply: invalid ones are no success.
        history.append((metrics.get("env/success_rate", 0.0), greedy_yes_rate()))
        if history[-1][0] > 0.8 and history[-1][1] > 0.9:
            break
    assert history[-1][1] > 0.9, history
    assert history[-1][0] > 0.8, history
    assert history[0][0] < 0.5  # it did not start out knowing


def choice_policy(**overrides):
    model, tokenizer = tiny_model()
    return PPOPolicy(model, tokenizer, config=small_config(decoding="choices", **overrides))


def first_ratio_logps(policy, calls):
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    trainer.update(trainer.collect())
    new, old, mask = calls[0]
    assert mask.sum() > 0
    return new * mask, old * mask


def test_choices_reuse_rollout_scores_first_ratio_is_one(policy_loss_calls):
    new, old = first_ratio_logps(choice_policy(), policy_loss_calls)
    # The rollout batch differs from the training micro-batch (other rows, other shared
    # prefix), so the same computation agrees to float32 rounding, not bit for bit.
    torch.testing.assert_close(new, old, atol=1e-5, rtol=0)


def test_choices_rescored_first_ratio_is_exactly_one(policy_loss_calls):
    new, old = first_ratio_logps(choice_policy(reuse_rollout_scores=False), policy_loss_calls)
    assert torch.equal(new, old)


@pytest.mark.parametrize("reuse", [True, False])
def test_choices_scoring_pass_runs_only_when_asked(reuse, monkeypatch):
    policy = choice_policy(reuse_rollout_scores=reuse, kl_coef=0.0)
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    buffer = trainer.collect()
    rollout = [(t.old_logps.clone(), t.value) for t in buffer.turns()]
    calls = []
    original = policy.score

    def counting(*args, **kwargs):
        calls.append(kwargs.get("with_entropy", False))
        return original(*args, **kwargs)

    monkeypatch.setattr(policy, "score", counting)
    turns = buffer.turns()
    trainer.score(turns, np.arange(len(turns)))
    assert len(calls) == (0 if reuse else math.ceil(len(turns) / 4))
    for turn, (logps, value) in zip(turns, rollout, strict=True):
        torch.testing.assert_close(turn.old_logps, logps, atol=1e-5, rtol=0)
        assert turn.value == pytest.approx(value, abs=1e-5)
        assert turn.ref_logps is turn.old_logps  # no KL penalty: the reference is not scored
