"""The exact Blackjack return (textgym.envs.blackjack_exact) against Gymnasium's own env."""

import random

import gymnasium as gym
import numpy as np
import pytest

from textgym.envs import blackjack_exact


def hit_on_11_or_less(total, dealer, usable_ace):
    return "hit" if total <= 11 and not usable_ace else "stick"


def random_table(seed):
    """A policy that hits in a random half of the states, 21 included (so it can bust)."""
    rng = random.Random(seed)
    table = {state: rng.choice(["hit", "stick"]) for state in blackjack_exact.states()}
    return lambda *state: table[state]


def random_probabilities(seed):
    """A stochastic policy: P(hit) drawn at random for every state."""
    rng = random.Random(seed)
    table = {state: rng.random() for state in blackjack_exact.states()}
    return lambda *state: table[state]


def simulate(decide, hands, seen=None, **rules):
    """Returns of ``decide`` over ``hands`` hands of the real env (the same deals for any rules)."""
    env = gym.make("Blackjack-v1", **rules).unwrapped
    coin = np.random.default_rng(1)  # draws the stochastic policies' actions
    returns = np.empty(hands)
    env.reset(seed=0)
    for i in range(hands):
        obs, _ = env.reset()
        done, total = False, 0.0
        while not done:
            state = (int(obs[0]), int(obs[1]), bool(obs[2]))
            if seen is not None:
                seen.add(state)
            choice = decide(*state)
            hit = coin.random() < choice if isinstance(choice, float) else choice == "hit"
            obs, reward, done, _, _ = env.step(int(hit))
            total += reward
        returns[i] = total
    return returns


def within(exact, returns, n_se=4.0):
    se = returns.std() / np.sqrt(len(returns))
    return abs(exact - returns.mean()) < n_se * se


@pytest.mark.slow
@pytest.mark.parametrize(
    "decide",
    [
        lambda *s: "stick",
        hit_on_11_or_less,
        random_table(0),
        random_table(1),
        lambda *s: 0.5,
        random_probabilities(0),
    ],
)
def test_exact_return_matches_the_gymnasium_env(decide):
    seen = set()
    returns = simulate(decide, 100_000, seen)
    assert within(blackjack_exact.expected_return(decide), returns), returns.mean()
    assert seen <= set(blackjack_exact.states())  # every state the env shows has a decision


@pytest.mark.slow
@pytest.mark.parametrize("rules", [{"sab": False}, {"sab": False, "natural": True}])
def test_natural_rules_match_on_the_same_deals(rules):
    """Only naturals differ between the rules, so paired hands resolve a 0.002 difference."""
    decide = hit_on_11_or_less
    default, changed = simulate(decide, 50_000), simulate(decide, 50_000, **rules)
    exact = blackjack_exact.expected_return(decide, **rules) - blackjack_exact.expected_return(
        decide
    )
    assert abs(exact) > 0.001
    assert within(exact, changed - default), ((changed - default).mean(), exact)


def test_known_values():
    assert blackjack_exact.expected_return(lambda *s: "stick") == pytest.approx(-0.18292, abs=1e-5)
    # hitting on a natural forfeits its sure win: strictly worse than standing on it
    stand = blackjack_exact.expected_return(hit_on_11_or_less)
    hit_21 = blackjack_exact.expected_return(
        lambda t, d, a: "hit" if (t, a) == (21, True) else hit_on_11_or_less(t, d, a)
    )
    assert hit_21 < stand


@pytest.mark.parametrize("bad", ["Hit", 1.5, -0.1, True, None])
def test_decide_must_say_hit_stick_or_a_probability(bad):
    with pytest.raises(ValueError, match="'hit', 'stick' or P\\(hit\\)"):
        blackjack_exact.expected_return(lambda *s: bad)


@pytest.mark.slow
def test_basic_strategy_is_optimal():
    """No change of one state's decision raises the return, so nothing beats basic strategy."""
    table = {s: blackjack_exact.basic_strategy(*s) for s in blackjack_exact.states()}
    best = blackjack_exact.expected_return(lambda *s: table[s])
    assert best == pytest.approx(-0.04311, abs=1e-5)
    for state, choice in table.items():
        flipped = {**table, state: "stick" if choice == "hit" else "hit"}
        assert blackjack_exact.expected_return(lambda *s, f=flipped: f[s]) <= best + 1e-12, state
