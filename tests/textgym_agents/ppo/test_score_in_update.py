"""The update scores nothing twice (``PPOConfig.score_in_update``).

The first minibatch's old log-probs come from the first epoch's own pass and the critic's
values from the rollout's generation, so no scoring pass runs for those turns.
"""

import gymnasium as gym
import numpy as np
import pytest
import torch

import textgym  # noqa: F401
from tests.textgym_agents.ppo.test_packed_turns import conversation_buffer
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.ppo.steps import minibatch_loss
from textgym_agents.testing import perturb_adapter, tiny_model


def scored_rows(policy):
    """Count the rows ``policy.score`` runs without gradients (the scoring pass)."""
    rows = []
    original = policy.score

    def spy(prompts, *args, **kwargs):
        if not torch.is_grad_enabled():
            rows.append(len(prompts))
        return original(prompts, *args, **kwargs)

    policy.score = spy
    return rows


def update(estimator, score_in_update, minibatch_size, calls):
    config = PPOConfig(
        advantage_estimator=estimator,
        score_in_update=score_in_update,
        minibatch_size=minibatch_size,
        micro_batch_size=2,
        num_epochs=2,
        seed=0,
    )
    policy = perturb_adapter(PPOPolicy(*tiny_model(), config=config))
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=2))
    buffer = conversation_buffer(policy)
    rows = scored_rows(policy)
    calls.clear()
    trainer.update(buffer)
    weights = [p.detach().clone() for p in policy.model.parameters() if p.requires_grad]
    weights += [p.detach().clone() for p in policy.value_head.parameters()]
    return sum(rows), calls[0], weights


@pytest.mark.parametrize("estimator", ["gae", "reinforce"])
@pytest.mark.parametrize("minibatch_size", [5, 3])
def test_an_update_that_scores_in_its_first_pass_trains_as_one_that_scores_first(
    estimator, minibatch_size, policy_loss_calls
):
    fused_rows, (new, old, mask), fused = update(estimator, True, minibatch_size, policy_loss_calls)
    assert torch.equal(new * mask, old * mask)  # the first ratio is exactly 1
    plain_rows, _, plain = update(estimator, False, minibatch_size, policy_loss_calls)
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert plain_rows == 5
    # A hand-filled buffer has no rollout values: GAE scores every turn for them either way.
    # Critic-free, only the turns after the first minibatch are scored before the update.
    assert fused_rows == (5 if estimator == "gae" else 5 - minibatch_size)


def test_turns_with_rollout_values_are_not_scored_before_the_update():
    config = PPOConfig(num_steps=3, max_new_tokens=4, minibatch_size=64, seed=0)
    policy = PPOPolicy(*tiny_model(), config=config)
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Calculator-v0", num_envs=2))
    buffer = trainer.collect()
    assert all(turn.value is not None for turn in buffer.turns())
    rows = scored_rows(policy)
    valued = []
    policy.prompt_values = lambda prompts: valued.append(prompts)  # must not be needed
    trainer.update(buffer)
    assert sum(rows) == 0 and not valued


@pytest.mark.parametrize("env_id", ["textgym/Calculator-v0", "textgym/Blackjack-v1"])
def test_rollout_values_are_the_values_scoring_computes(env_id):
    config = PPOConfig(num_steps=3, max_new_tokens=6, decoding="free", seed=0)
    policy = PPOPolicy(*tiny_model(), config=config)
    with torch.no_grad():  # a value head that is not zero, so the check can fail
        policy.value_head.summary.weight.normal_()
    trainer = PPOTrainer(policy, gym.make_vec(env_id, num_envs=3))
    turns = trainer.collect().turns()
    rollout = torch.tensor([turn.value for turn in turns])
    with torch.no_grad():
        scored = policy.score(
            [t.prompt_ids for t in turns], [t.response_ids for t in turns], values=True
        ).values
    assert rollout.abs().max() > 1e-3
    torch.testing.assert_close(rollout, scored.cpu(), atol=1e-4, rtol=1e-4)
    # The unfinished episodes' next prompts were valued on the rows the rollout carried.
    cut = [turn for turn in turns if turn.bootstrap_ids is not None]
    assert cut and all(turn.bootstrap_value is not None for turn in cut)
    expected = policy.prompt_values([turn.bootstrap_ids for turn in cut]).cpu()
    got = torch.tensor([turn.bootstrap_value for turn in cut])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_rollouts_compute_no_values_without_the_switch_or_a_critic():
    for settings in ({"score_in_update": False}, {"advantage_estimator": "reinforce"}):
        config = PPOConfig(num_steps=2, max_new_tokens=4, seed=0, **settings)
        trainer = PPOTrainer(
            PPOPolicy(*tiny_model(), config=config),
            gym.make_vec("textgym/Calculator-v0", num_envs=2),
        )
        assert all(turn.value is None for turn in trainer.collect().turns())


def test_a_turn_without_old_logprobs_is_refused_after_the_first_pass():
    policy = PPOPolicy(*tiny_model(), config=PPOConfig(advantage_estimator="reinforce"))
    turns = conversation_buffer(policy).turns()
    with pytest.raises(ValueError, match="no old log-probs"):
        minibatch_loss(policy, policy.config, turns, [[0, 1]], 10.0, 2.0)
    minibatch_loss(policy, policy.config, turns, [[0, 1]], 10.0, 2.0, first_pass=True)
    assert turns[0].old_logps is not None and turns[2].old_logps is None
    np.testing.assert_equal(len(turns[0].old_logps), len(turns[0].response_ids))
