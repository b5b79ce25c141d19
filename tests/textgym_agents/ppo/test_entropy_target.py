"""The entropy bonus steered toward a target entropy (``PPOConfig.entropy_target``)."""

import math

import pytest
import torch

from tests.textgym_agents.ppo.test_informative_turns import grouped_buffer
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.ppo.core import EntropyController
from textgym_agents.testing import tiny_model


@pytest.mark.parametrize(
    ("entropy", "factor"),
    [(0.0, 2.0), (0.5, 2**0.5), (1.0, 1.0), (1.5, 2**-0.5), (2.0, 0.5), (9.0, 0.5)],
)
def test_the_weight_moves_by_at_most_a_factor_of_two_toward_the_target(entropy, factor):
    controller = EntropyController(0.1, target=1.0)
    controller.update(entropy)
    assert controller.value == pytest.approx(0.1 * factor)


def test_the_weight_stays_within_its_bounds_and_can_come_back():
    controller = EntropyController(0.1, target=1.0)
    for _ in range(40):
        controller.update(2.0)
    assert controller.value == EntropyController.BOUNDS[0]
    controller.update(0.0)
    assert controller.value == 2 * EntropyController.BOUNDS[0]
    for _ in range(40):
        controller.update(0.0)
    assert controller.value == EntropyController.BOUNDS[1]


def test_a_target_needs_a_starting_weight():
    with pytest.raises(ValueError, match="needs a starting ent_coef > 0"):
        PPOConfig(entropy_target=0.5)
    with pytest.raises(ValueError, match="entropy_target must be > 0 or None"):
        PPOConfig(entropy_target=0.0, ent_coef=0.1)


def test_an_update_steers_the_weight_by_its_own_entropy_and_the_next_update_uses_it():
    config = PPOConfig(
        decoding="choices",
        advantage_estimator="grpo",
        group_size=2,
        num_steps=2,
        minibatch_size=8,
        micro_batch_size=4,
        ent_coef=0.1,
        entropy_target=2.0,  # above ln 2, the most two replies can have: the weight grows
        seed=0,
    )
    torch.manual_seed(0)
    policy = PPOPolicy(*tiny_model(), config=config)
    trainer = PPOTrainer(policy)
    first = trainer.update(grouped_buffer(policy, [[1.0, 0.0], [0.0, 1.0]]))
    entropy = first["policy/entropy"]
    assert 0 < entropy < math.log(2)
    expected = 0.1 * 2 ** ((2.0 - entropy) / 2.0)
    assert first["objective/ent_coef"] == pytest.approx(expected)
    assert trainer.ent_ctl.value == pytest.approx(expected)
    # The loss of the next update weighs the entropy by the steered weight.
    buffer = grouped_buffer(policy, [[1.0, 0.0], [0.0, 1.0]])
    second = trainer.update(buffer)
    assert second["loss/total"] == pytest.approx(
        second["loss/policy"] - expected * second["policy/entropy"], rel=1e-4, abs=1e-6
    )


def test_without_a_target_the_weight_is_fixed():
    config = PPOConfig(
        decoding="choices", advantage_estimator="grpo", group_size=2, num_steps=2, ent_coef=0.3
    )
    policy = PPOPolicy(*tiny_model(), config=config)
    trainer = PPOTrainer(policy)
    metrics = trainer.update(grouped_buffer(policy, [[1.0, 0.0]]))
    assert metrics["objective/ent_coef"] == 0.3
