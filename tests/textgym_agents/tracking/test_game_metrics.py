"""Win/draw/loss metrics from scripted games, per opponent kind, and the Elo arithmetic."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from textgym.envs.pettingzoo_seat import ScriptedOpponent
from textgym.envs.pettingzoo_text import pettingzoo_text_env
from textgym_agents import PPOConfig, PPOPolicy
from textgym_agents.ppo.trainer import PPOTrainer
from textgym_agents.tracking.elo import elo_expected, elo_update
from textgym_agents.tracking.rollout_stats import game_metrics


class ForcedGame:
    """A two-seat AEC game whose result is fixed: ``loser`` may only resign (None: a draw).

    Moves: 0 passes, 1 resigns (the resigner gets -1, the other +1); two rounds of passes end
    in a draw.
    """

    possible_agents = ["player_0", "player_1"]
    metadata = {"render_modes": []}

    def __init__(self, loser):
        self.loser = loser

    def observation_space(self, agent):
        box = gym.spaces.Box(0, 4, (1,), np.int64)
        return gym.spaces.Dict({"observation": box, "action_mask": gym.spaces.MultiBinary(2)})

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def reset(self, seed=None):
        self.moves = 0
        self.agent_selection = "player_0"
        self.rewards = dict.fromkeys(self.possible_agents, 0.0)
        self.terminations = dict.fromkeys(self.possible_agents, False)
        self.truncations = dict.fromkeys(self.possible_agents, False)
        self.infos = {a: {} for a in self.possible_agents}

    def observe(self, agent):
        mask = np.array([0, 1] if agent == self.loser else [1, 0], dtype=np.int8)
        return {"observation": np.array([self.moves]), "action_mask": mask}

    def step(self, action):
        mover = self.agent_selection
        other = next(a for a in self.possible_agents if a != mover)
        self.moves += 1
        self.rewards = dict.fromkeys(self.possible_agents, 0.0)
        if action == 1:
            self.rewards.update({mover: -1.0, other: 1.0})
        if action == 1 or self.moves == 4:
            self.terminations = dict.fromkeys(self.possible_agents, True)
        self.agent_selection = other

    def render(self):
        return None

    def close(self):
        pass


def first_legal(observation, info):
    return int(np.argmax(info["action_mask"]))


def forced_env(loser, opponent):
    game = ForcedGame(loser)
    env = pettingzoo_text_env(game, opponent=opponent, seat=0, action_names=["pass", "resign"])
    return gym.wrappers.TimeLimit(env, 10)


def test_game_metrics_on_scripted_games(tiny):
    envs = gym.vector.SyncVectorEnv(
        [
            lambda: forced_env("player_1", ScriptedOpponent(first_legal, name="resigner")),
            lambda: forced_env(None, "random"),
            lambda: forced_env("player_0", ScriptedOpponent(first_legal, name="bully")),
        ]
    )
    policy = PPOPolicy(*tiny, config=PPOConfig(num_steps=5, decoding="choices", seed=0))
    trainer = PPOTrainer(policy, envs)
    buffer = trainer.collect()
    episodes = trainer.collector.drain()
    outcomes = {(e.opponent, e.outcome) for e in episodes}
    assert outcomes == {("resigner", "win"), ("random", "draw"), ("bully", "loss")}
    counts = {o: sum(e.outcome == o for e in episodes) for o in ("win", "draw", "loss")}
    assert counts["win"] > counts["draw"] > 0  # the win takes 1 move, the draw 2
    metrics = trainer.update(buffer, episodes)
    total = len(episodes)
    assert metrics["env/win_rate"] == pytest.approx(counts["win"] / total)
    assert metrics["env/draw_rate"] == pytest.approx(counts["draw"] / total)
    assert metrics["env/loss_rate"] == pytest.approx(counts["loss"] / total)
    assert metrics["env/win_rate/resigner"] == 1.0 and metrics["env/loss_rate/resigner"] == 0.0
    assert metrics["env/draw_rate/random"] == 1.0 and metrics["env/loss_rate/bully"] == 1.0
    assert metrics["env/games/bully"] == counts["loss"]
    assert metrics["env/success_rate"] == pytest.approx(counts["win"] / total)


def test_game_metrics_group_by_kind_and_skip_without_games():
    assert game_metrics([]) == {}
    m = game_metrics([("selfplay:2", "win"), ("selfplay:4", "loss"), (None, "draw")])
    assert m["env/win_rate/selfplay"] == 0.5 and m["env/games/selfplay"] == 2
    assert m["env/draw_rate/unknown"] == 1.0
    assert m["env/win_rate"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("rating", "opponent", "outcome", "expected"),
    [
        (1000, 1000, "win", (1008.0, 992.0)),
        (1000, 1000, "draw", (1000.0, 1000.0)),
        (1000, 1000, "loss", (992.0, 1008.0)),
        (1400, 1000, "win", (1400 + 16 / 11, 1000 - 16 / 11)),  # expected 10/11
        (1000, 1400, "draw", (1000 + 16 * (0.5 - 1 / 11), 1400 - 16 * (0.5 - 1 / 11))),
    ],
)
def test_elo_update_on_fixed_cases(rating, opponent, outcome, expected):
    assert elo_update(rating, opponent, outcome) == pytest.approx(expected)


def test_elo_expected_and_errors():
    assert elo_expected(1400, 1000) == pytest.approx(10 / 11)
    assert elo_expected(1000, 1400) + elo_expected(1400, 1000) == pytest.approx(1.0)
    assert elo_update(1000, 1000, "win", k=32) == (1016.0, 984.0)
    message = r"Expected outcome to be one of \['draw', 'loss', 'win'\], got 'resign'"
    with pytest.raises(ValueError, match=message):
        elo_update(1000, 1000, "resign")
    with pytest.raises(ValueError, match="Expected k to be a positive number, got 0"):
        elo_update(1000, 1000, "win", k=0)
