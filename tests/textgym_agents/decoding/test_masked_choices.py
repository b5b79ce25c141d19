"""Masked choices: a state's legal replies are what is sampled, stored and scored in training."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import textgym  # noqa: F401
from textgym.envs.pettingzoo_text import TICTACTOE_CELLS
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.decoding.generation import Generation

pytest.importorskip("pettingzoo")


def tictactoe(num_envs=2, **options):
    return gym.make_vec("textgym/TicTacToe-v0", num_envs=num_envs, **options)


def policy_for(tiny_dir, decoding, **overrides):
    values = dict(num_steps=6, minibatch_size=12, micro_batch_size=6, decoding=decoding, seed=0)
    values.update(overrides)
    torch.manual_seed(0)
    return PPOPolicy.from_pretrained(tiny_dir, config=PPOConfig(**values))


@pytest.mark.parametrize("decoding", ["choices", "constrained"])
@pytest.mark.slow
def test_only_legal_moves_are_ever_sampled(tiny_dir, decoding):
    envs = tictactoe(max_invalid=1)
    trainer = PPOTrainer(policy_for(tiny_dir, decoding, num_steps=8), envs)
    buffer = trainer.collect()
    assert len(buffer) >= 8 and not any(t.invalid for t in buffer)
    if decoding == "choices":
        sizes = {len(t.choice_ids) for t in buffer}
        assert len(sizes) > 1 and max(sizes) <= 9  # the sets shrink as the board fills


def test_each_turn_keeps_the_legal_set_it_was_sampled_from(tiny_dir):
    """A turn's choices are the legal moves of its state, not the game's nine cells."""
    policy = policy_for(tiny_dir, "choices")
    envs = tictactoe(num_envs=1, seat=0)
    trainer = PPOTrainer(policy, envs)
    buffer = trainer.collect()
    tokens = policy.tokenizer
    for turn in buffer:
        prompt = tokens.decode(turn.prompt_ids)
        legal = prompt.rsplit("Legal moves: ", 1)[1].split(".")[0].split(", ")
        replies = [tokens.decode(ids[:-1]) for ids in turn.choice_ids]  # minus EOS
        assert replies == [f'{{"move": "{cell}"}}' for cell in legal]


def test_training_scores_the_masked_set_it_sampled_from(tiny_dir, policy_loss_calls):
    # Rescored in the update's layout, so the first ratio is exact (not within rounding).
    policy = policy_for(tiny_dir, "choices", reuse_rollout_scores=False)
    trainer = PPOTrainer(policy, tictactoe())
    buffer = trainer.collect()
    turn = next(t for t in buffer if len(t.choice_ids) < 9)
    trainer.update(buffer)
    new, old, mask = policy_loss_calls[0]
    assert new.shape[1] == 1 and mask.sum() == new.shape[0]
    assert torch.equal(new, old)  # the update's log-probs are the rollout's, bit for bit
    # Scored over all nine cells instead, a masked turn's log-prob is another number.
    every = [policy.choice_ids([f'{{"move": "{c}"}}' for c in TICTACTOE_CELLS])]
    with torch.no_grad():
        full = policy.score([turn.prompt_ids], [turn.response_ids], choices=every).logps[0, 0]
        masked = policy.score([turn.prompt_ids], [turn.response_ids], choices=[turn.choice_ids])
    assert not torch.isclose(full, masked.logps[0, 0])


class IllegalMover(PPOPolicy):
    """Always writes a1, which the opponent has already taken."""

    def generate(self, batch, **kwargs):
        prompts = [self.encode(messages) for messages in batch]
        text = '{"move": "a1"}'
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return Generation(prompts, [list(ids) for _ in prompts], [text] * len(prompts))


def test_an_illegal_free_text_move_is_penalised_and_recorded(tiny_dir):
    first = lambda obs, info: int(np.flatnonzero(info["action_mask"])[0])  # noqa: E731
    envs = gym.make_vec("textgym/TicTacToe-v0", num_envs=1, seat=1, opponent=first, max_invalid=2)
    torch.manual_seed(0)
    policy = IllegalMover.from_pretrained(tiny_dir, config=PPOConfig(num_steps=4, seed=0))
    trainer = PPOTrainer(policy, envs)
    buffer = trainer.collect()
    assert all(t.invalid and t.reward == -1.0 for t in buffer)
    assert [t.truncated for t in buffer][:2] == [False, True]  # max_invalid=2 ends the game
    metrics = trainer.update(buffer)
    assert metrics["env/invalid_rate"] == 1.0
