"""Exact expected return of a greedy text policy on a tabular env: FrozenLake, CliffWalking, Taxi.

These toy-text envs publish their whole model as ``env.unwrapped.P`` (``P[s][a]`` is a list of
``(probability, next state, reward, terminated)``), and their text envs show the model only
the current state (no history). So with choice decoding a greedy text policy is a table over
the states, and its expected return under the env's time limit is a finite-horizon sum,
computed here by dynamic programming: no held-out episodes, no standard error, one model call
per state (16 on FrozenLake 4x4, 48 on CliffWalking) instead of hundreds of episodes.

    >>> import gymnasium as gym
    >>> env = gym.make("FrozenLake-v1", is_slippery=False)
    >>> right_then_down = np.zeros((16, 4))
    >>> right_then_down[[0, 1], 2] = 1  # right, right ...
    >>> right_then_down[[2, 6, 10], 1] = 1  # ... down, down, down ...
    >>> right_then_down[14, 2] = 1  # ... right: the goal
    >>> right_then_down[right_then_down.sum(1) == 0, 0] = 1  # left elsewhere (never reached)
    >>> expected_return(env, right_then_down, horizon=100)
    1.0
    >>> round(expected_return(env, uniform(env), horizon=100), 4)  # random moves
    0.0139
    >>> expected_return(env, optimal(env, horizon=100), horizon=100)
    1.0

``tests/benchmarks/test_tabular_exact.py`` checks these values against the Gymnasium envs
themselves (sampled episodes).

Run as a script, it prints what a text policy starts from: its greedy table's return and the
return and length of the episodes it *samples* (at each ``--temperatures``; training samples at
its config's), exactly, at each ``--horizons`` (default: the embedded model on FrozenLake):

    python benchmarks/tabular_exact.py --env textgym/FrozenLake-v1 \\
        --kwargs '{"is_slippery": false}' --temperatures 1,2 --horizons 16,100
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import gymnasium as gym
import numpy as np

from textgym.checker import find_text_wrapper
from textgym.curriculum import is_tabular

try:
    from blackjack_learning import state_choice_logps
except ImportError:  # imported as benchmarks.tabular_exact
    from benchmarks.blackjack_learning import state_choice_logps


def _model(env: gym.Env) -> tuple[dict[int, dict[int, list[tuple]]], np.ndarray]:
    """The env's transition table ``P`` and its initial-state distribution."""
    base = env.unwrapped
    if not is_tabular(env):
        raise TypeError(f"{base!r} publishes no transition table P: not a tabular toy-text env")
    return base.P, np.asarray(base.initial_state_distrib, dtype=float)


def _backup(
    P: dict, value: np.ndarray, num_actions: int, gamma: float = 1.0, steps: bool = False
) -> np.ndarray:
    """Q(s, a) = Σ p · (r + γ V(s') if the episode goes on), for every state and action.

    With ``steps`` every step counts 1 instead of its reward (V is then the expected length).
    """
    q = np.zeros((len(P), num_actions))
    for s, row in P.items():
        for a, outcomes in row.items():
            q[s, a] = sum(
                p * ((1.0 if steps else r) + (0.0 if done else gamma * value[s2]))
                for p, s2, r, done in outcomes
            )
    return q


def expected_return(env: gym.Env, policy: np.ndarray, horizon: int, steps: bool = False) -> float:
    """Expected undiscounted return of a stationary policy over at most ``horizon`` steps.

    Args:
        env: The env (text or not; its ``unwrapped`` must publish ``P``).
        policy: ``(states, actions)`` probabilities: one-hot rows for a greedy table.
        horizon: The time limit (an episode still running then is truncated).
        steps: Count 1 per step instead of the reward: the expected episode length.
    """
    P, start = _model(env)
    value = np.zeros(len(P))
    for _ in range(horizon):
        value = (_backup(P, value, policy.shape[1], steps=steps) * policy).sum(1)
    return float(start @ value)


def uniform(env: gym.Env) -> np.ndarray:
    """The uniformly random policy: every action in every state with the same probability."""
    n_states, n_actions = env.unwrapped.observation_space.n, env.unwrapped.action_space.n
    return np.full((n_states, n_actions), 1.0 / n_actions)


def optimal(env: gym.Env, horizon: int, gamma: float = 0.999) -> np.ndarray:
    """The greedy table of value iteration run for ``horizon`` steps: the usual "optimal".

    The small discount ``gamma`` only breaks ties towards shorter paths (undiscounted, "stay
    put" is as good as "go" while time is left, and a stationary table of such ties can loop
    forever). The finite-horizon optimum may need a policy that changes with the step; score
    the returned table with :func:`expected_return`.
    """
    P, _ = _model(env)
    n_actions = env.unwrapped.action_space.n
    value = np.zeros(len(P))
    for _ in range(horizon):
        q = _backup(P, value, n_actions, gamma)
        value = q.max(1)
    return np.eye(n_actions)[q.argmax(1)]


def policy_tables(policy: Any, env: gym.Env) -> tuple[np.ndarray, np.ndarray]:
    """The text policy's greedy and sampling tables: ``(states, actions)`` arrays.

    Each state's prompt is what the model sees in it (the system prompt and the state drawn by
    the env's formatter; these envs keep no history); the choices are scored as choice
    decoding scores them, and each reply is parsed back into the env's action. The greedy table
    is one-hot on the best reply's action; the sampling table is the distribution training
    samples moves from (the softmax over the replies at the policy's temperature), summed over
    replies that parse to the same action.
    """
    text_env = find_text_wrapper(env)
    options = text_env.reply_choices()
    if not options:
        raise ValueError(f"{env} lists no valid replies: a greedy table needs choice decoding")
    n_states, n_actions = env.unwrapped.observation_space.n, env.unwrapped.action_space.n
    probs = state_choice_logps(policy, text_env, range(n_states)).float().exp().cpu().numpy()
    to_action = np.eye(n_actions)[[text_env.parse_reply(option)[0] for option in options]]
    return to_action[probs.argmax(1)], probs @ to_action


def greedy_policy(policy: Any, env: gym.Env) -> np.ndarray:
    """The text policy's greedy choice in every state, as a one-hot ``(states, actions)`` table
    (see :func:`policy_tables`)."""
    return policy_tables(policy, env)[0]


def main() -> None:
    """Print the greedy and sampling returns of a text policy, exactly, per horizon."""
    from textgym_agents import PPOConfig, PPOPolicy

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="textgym/FrozenLake-v1")
    parser.add_argument("--kwargs", default="{}", help="JSON of gym.make keyword arguments")
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--temperatures", default="1,2")
    parser.add_argument("--horizons", default="16,100")
    args = parser.parse_args()
    env = gym.make(args.env, **json.loads(args.kwargs))
    horizons = [int(h) for h in args.horizons.split(",")]
    text_env = find_text_wrapper(env)
    names = {text_env.parse_reply(o)[0]: o for o in reversed(text_env.reply_choices())}
    tables = {"random": uniform(env), "optimal": optimal(env, env.spec.max_episode_steps)}
    policy = PPOPolicy.from_pretrained(args.model, config=PPOConfig.for_env(env, progress=False))
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        # Only the temperature differs: the choices' scores are divided by it when scored.
        policy.config = PPOConfig.for_env(env, temperature=temperature, progress=False)
        greedy, sampling = policy_tables(policy, env)
        tables["greedy"] = greedy
        tables[f"sampling, T = {temperature:g}"] = sampling
        moves = ", ".join(f"{names.get(a, a)} {p:.3f}" for a, p in enumerate(sampling.mean(0)))
        print(f"T = {temperature:g}: mean move probabilities over the states: {moves}")
    print(f"{args.env} {args.kwargs}: exact return (expected length) at each horizon")
    print("| policy | " + " | ".join(f"{h} steps" for h in horizons) + " |")
    print("|---|" + "---|" * len(horizons))
    for name, table in tables.items():
        cells = [
            f"{expected_return(env, table, h):.4f} ({expected_return(env, table, h, True):.1f})"
            for h in horizons
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
