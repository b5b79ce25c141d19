"""The perfect tic-tac-toe player: solved values, never loses, blunders at the rate asked."""

import functools

import gymnasium as gym
import numpy as np
import pytest

import textgym  # noqa: F401
from textgym.envs.pettingzoo_seat import AECSeatEnv, Opponent, RandomOpponent, play_games
from textgym.envs.pettingzoo_text import TICTACTOE_CELLS
from textgym.envs.tictactoe_minimax import (
    LINES,
    MinimaxOpponent,
    best_moves,
    position_value,
)

pettingzoo = pytest.importorskip("pettingzoo")


@functools.cache
def brute_value(board):
    """A plain negamax sharing no code with the module: the value for the player to move."""
    for a, b, c in LINES:
        if board[a] != 0 and board[a] == board[b] == board[c]:
            return -1
    empty = [i for i in range(9) if board[i] == 0]
    if not empty:
        return 0
    return max(-brute_value(tuple(-v for v in board[:i] + (1,) + board[i + 1 :])) for i in empty)


def reachable(board=(0,) * 9):
    """Every position reachable from the empty board (mover's marks 1), the finished ones too."""
    seen, todo = {board}, [board]
    while todo:
        here = todo.pop()
        if any(here[a] != 0 and here[a] == here[b] == here[c] for a, b, c in LINES):
            continue
        for i in range(9):
            if here[i] == 0:
                after = tuple(-v for v in here[:i] + (1,) + here[i + 1 :])
                if after not in seen:
                    seen.add(after)
                    todo.append(after)
    return seen


def test_the_solved_values_match_a_plain_negamax_on_every_reachable_position():
    positions = reachable()
    assert len(positions) == 5478  # the known count of legal tic-tac-toe positions
    assert all(position_value(p) == brute_value(p) for p in positions)
    assert position_value((0,) * 9) == 0


def test_best_moves_are_the_moves_of_best_value_and_a_finished_game_has_none():
    board = (-1, -1, 0, 0, 1, 0, 0, 0, 0)  # the other player threatens 0-1-2: only 2 holds
    values = {
        i: -brute_value(tuple(-v for v in board[:i] + (1,) + board[i + 1 :]))
        for i in range(9)
        if board[i] == 0
    }
    assert best_moves(board) == [i for i, v in values.items() if v == max(values.values())]
    assert best_moves(board) == [2]
    with pytest.raises(ValueError, match="No move to make"):
        best_moves((1, 1, 1, -1, -1, 0, 0, 0, 0))


def games(player, opponent, n, seed=0):
    env = AECSeatEnv(pettingzoo.make("aec", "classic/tictactoe_v3"), opponent)
    return play_games(env, player, n, seed=seed)


def test_perfect_play_never_loses_from_either_seat_and_draws_itself():
    assert "loss" not in games(MinimaxOpponent(), RandomOpponent(), 200)
    assert set(games(MinimaxOpponent(), MinimaxOpponent(), 40)) == {"draw"}
    assert "win" not in games(RandomOpponent(), MinimaxOpponent(), 200)


class Counting(Opponent):
    """Random legal moves; counts how often the move differs from every best move."""

    def __init__(self, epsilon):
        self.inner, self.moves, self.off_best = MinimaxOpponent(epsilon), 0, 0

    def reset(self, seed=None):
        self.inner.reset(seed)

    def act(self, observation, info):
        move = self.inner.act(observation, info)
        planes = np.asarray(observation)
        board = tuple(int(v) for v in planes[..., 0].reshape(9) - planes[..., 1].reshape(9))
        self.moves += 1
        self.off_best += int(move) not in best_moves(board)
        return move


def test_a_blundering_player_leaves_the_best_moves_at_about_its_rate_and_loses_sometimes():
    perfect, half = Counting(0.0), Counting(0.5)
    games(perfect, RandomOpponent(), 100)
    outcomes = games(half, RandomOpponent(), 300)
    assert perfect.off_best == 0
    # A random move is off-best with probability < 1, so the off-best share is below 0.5.
    assert 0.1 < half.off_best / half.moves < 0.5
    assert "loss" in outcomes
    assert MinimaxOpponent(0.25).name == "minimax:0.25" and MinimaxOpponent().name == "minimax"


def test_one_seed_gives_one_opponent_luck_whatever_the_board():
    a, b = MinimaxOpponent(0.5), MinimaxOpponent(0.5)
    a.reset(seed=0)  # the first draw is 0.637: no blunder, so b has a single best move
    b.reset(seed=0)
    empty = np.zeros((3, 3, 2), dtype=np.int8)
    mask = np.ones(9, dtype=np.int8)
    a.act(empty, {"action_mask": mask})  # different first boards, the same draws used
    corner = empty.copy()
    corner[0, 0, 1] = 1
    assert b.act(corner, {"action_mask": np.array([0] + [1] * 8, dtype=np.int8)}) == 4
    assert a._rng.random() == b._rng.random()


@pytest.mark.parametrize("bad", [-0.1, 1.5, "x"])
def test_bad_epsilons_and_names_are_refused(bad):
    with pytest.raises(ValueError, match="Expected epsilon"):
        MinimaxOpponent(bad)
    with pytest.raises(ValueError, match="Expected 'minimax' or 'minimax:<epsilon>'"):
        MinimaxOpponent.from_name(f"minimax:{bad}")


def test_the_env_id_takes_the_opponent_by_name_and_each_env_gets_its_own():
    envs = gym.make_vec("textgym/TicTacToe-v0", num_envs=2, opponent="minimax:0.3")
    opponents = [e.unwrapped.opponent for e in envs.envs]
    assert [o.name for o in opponents] == ["minimax:0.3"] * 2
    assert opponents[0] is not opponents[1]
    env = gym.make("textgym/TicTacToe-v0", opponent="minimax", seat=1)
    for seed in range(20):  # random legal replies never beat it
        _, info = env.reset(seed=seed)
        rng, done = np.random.default_rng(seed), False
        while not done:
            move = TICTACTOE_CELLS[int(rng.choice(np.flatnonzero(info["action_mask"])))]
            _, _, terminated, truncated, info = env.step(f'{{"move": "{move}"}}')
            done = terminated or truncated
        assert info["outcome"] != "win" and info["opponent"] == "minimax"
    with pytest.raises(ValueError, match=r"one of \['random', 'minimax'\]"):
        gym.make("textgym/TicTacToe-v0", opponent="perfect")
    for name, epsilon in [("minimax", 0.0), ("minimax:0", 0.0), ("minimax:1", 1.0)]:
        assert MinimaxOpponent.from_name(name).epsilon == epsilon
    with pytest.raises(ValueError, match="Expected epsilon"):
        MinimaxOpponent(True)
