"""Blackjack's per-state value gaps (benchmarks/blackjack_budget.py) against exact returns and
the Gymnasium env itself."""

import math

import gymnasium as gym
import numpy as np
import pytest

from benchmarks.blackjack_budget import budget_return, state_gaps
from textgym.envs.blackjack_exact import basic_strategy, expected_return


def test_first_turn_values_add_up_to_the_exact_returns():
    """Shown only first turns, the states' chances sum to 1 and their values to the policies'."""
    first = state_gaps(hit_share=0.0)
    assert sum(g.visit for g in first) == pytest.approx(1.0)
    best = sum(g.visit * max(g.hit[0], g.stick[0]) for g in first)
    assert best == pytest.approx(expected_return(basic_strategy), abs=1e-12)
    stick = sum(g.visit * g.stick[0] for g in first)
    assert stick == pytest.approx(expected_return(lambda *state: "stick"), abs=1e-12)


def test_an_action_value_and_spread_match_sampled_hands():
    """Hard 11 against a 10: hit once, then basic strategy, in the real env."""
    gap = next(g for g in state_gaps() if g.state == (11, 10, False))
    env = gym.make("Blackjack-v1", sab=True)
    rng = np.random.default_rng(0)
    returns = []
    for episode in range(8_000):
        env.reset(seed=episode)
        game = env.unwrapped
        game.player = [5, 6]
        game.dealer = [10, int(rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 10, 10]))]
        obs, reward, done, _, _ = env.step(1)  # hit
        while not done:
            obs, reward, done, _, _ = env.step(int(basic_strategy(*obs) == "hit"))
        returns.append(reward)
    mean, spread = float(np.mean(returns)), float(np.std(returns))
    assert mean == pytest.approx(gap.hit[0], abs=4 * spread / math.sqrt(len(returns)))
    assert spread == pytest.approx(gap.hit[1], rel=0.03)


def test_a_budget_resolves_the_states_whose_gap_it_can_tell():
    gaps = state_gaps()
    assert budget_return(gaps, 0, "stick") == (pytest.approx(-0.1829, abs=1e-4), 0)
    value, resolved = budget_return(gaps, math.inf, "hit17")
    assert resolved == sum(g.hands_needed < math.inf for g in gaps)
    assert value == pytest.approx(expected_return(basic_strategy), abs=1e-12)
    # the hands needed grow as the gap shrinks, for states shown equally often
    tens = sorted((g for g in gaps if g.state[1] == 10 and not g.state[2]), key=lambda g: g.gap)
    assert tens[-1].hands_needed < tens[len(tens) // 2].hands_needed


def test_hands_needed_follow_the_rarer_action():
    even = {g.state: g for g in state_gaps(0.5)}
    sticky = {g.state: g for g in state_gaps(0.2)}
    five = (5, 10, False)  # only ever dealt (2 + 3), never reached by a hit
    assert sticky[five].visit == pytest.approx(even[five].visit)
    ratio = sticky[five].hands_needed / even[five].hands_needed
    assert ratio == pytest.approx(0.5 / 0.2)
