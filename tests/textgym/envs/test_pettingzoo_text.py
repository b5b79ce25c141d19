"""PettingZoo games as text envs: seats, opponents, rewards as PettingZoo's, checkers clean."""

import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import textgym
from textgym import check_text_env
from textgym.checker import find_text_wrapper
from textgym.envs.pettingzoo_seat import AECSeatEnv, Opponent, TextOpponent
from textgym.envs.pettingzoo_text import CONNECT_FOUR_COLUMNS, TICTACTOE_CELLS
from textgym.extras import MissingExtraError

pettingzoo = pytest.importorskip("pettingzoo")

GAMES = {
    "textgym/TicTacToe-v0": ("classic/tictactoe_v3", TICTACTOE_CELLS),
    "textgym/ConnectFour-v0": ("classic/connect_four_v3", CONNECT_FOUR_COLUMNS),
}


class CountingOpponent(Opponent):
    """A random legal mover that records the seat and mask it was asked for."""

    def __init__(self):
        self.calls = []
        self.rng = np.random.default_rng(0)

    def reset(self, seed=None):
        self.rng = np.random.default_rng(seed)

    def act(self, observation, info):
        self.calls.append((info["seat"], info["action_mask"].copy()))
        return int(self.rng.choice(np.flatnonzero(info["action_mask"])))


def play(env, seed, rng, reply_choices=True):
    """One episode with random legal replies; returns the agent's moves, return, last info."""
    _, info = env.reset(seed=seed)
    moves, total, done = [], 0.0, False
    while not done:
        move = int(rng.choice(np.flatnonzero(info["action_mask"])))
        names = find_text_wrapper(env).parser.schema.names
        _, reward, terminated, truncated, info = env.step(f'{{"move": "{names[move]}"}}')
        assert not info["invalid"]
        moves.append(move)
        total += float(reward)
        done = terminated or truncated
    return moves, total, info


@pytest.mark.parametrize("env_id", GAMES)
@pytest.mark.parametrize("seat", [0, 1])
def test_an_episode_plays_to_the_end_from_either_seat(env_id, seat):
    env = gym.make(env_id, seat=seat)
    messages, info = env.reset(seed=3)
    assert info["seat_index"] == seat
    assert ("You move first." in messages[-1]["content"]) == (seat == 0)
    _, total, info = play(env, 3, np.random.default_rng(seat))
    assert info["outcome"] in ("win", "draw", "loss")
    assert info["is_success"] == (info["outcome"] == "win") == (total > 0)
    with pytest.raises(RuntimeError, match="The game is over: call reset()"):
        env.unwrapped.step(0)


def test_alternate_seats_follow_the_seed_and_take_turns_without_one():
    env = gym.make("textgym/TicTacToe-v0")  # seat="alternate"
    assert [env.reset(seed=s)[1]["seat_index"] for s in (0, 1, 2, 7)] == [0, 1, 0, 1]
    assert [env.reset()[1]["seat_index"] for _ in range(4)] == [0, 1, 0, 1]
    seats = {
        gym.make("textgym/TicTacToe-v0", seat="random").reset(seed=s)[1]["seat"] for s in range(8)
    }
    assert seats == {"player_1", "player_2"}
    assert env.reset(seed=0, options={"seat": 1})[1]["seat"] == "player_2"
    with pytest.raises(ValueError, match="Expected seat to be one of \\('alternate', 'random'\\)"):
        gym.make("textgym/TicTacToe-v0", seat=2)


@pytest.mark.parametrize("env_id", GAMES)
def test_the_opponent_is_called_exactly_for_the_opponents_turns(env_id):
    for seat in (0, 1):
        opponent = CountingOpponent()
        env = gym.make(env_id, opponent=opponent, seat=seat)
        moves, _, info = play(env, 0, np.random.default_rng(1))
        agent = env.unwrapped.agent
        assert all(who != agent for who, _ in opponent.calls)
        assert all(mask.any() for _, mask in opponent.calls)  # asked only when it can move
        # the board holds the agent's moves and one per opponent call, nothing else
        obs = env.unwrapped.game.observe(agent)["observation"]
        assert obs[..., 0].sum() == len(moves) and obs[..., 1].sum() == len(opponent.calls)
        assert len(opponent.calls) in (len(moves) - 1 + seat, len(moves) + seat)


@pytest.mark.parametrize("env_id", GAMES)
def test_exploring_starts_open_with_random_moves_the_agent_can_always_answer(env_id):
    import copy

    from textgym.envs.pettingzoo_text import EXPLORING_OPENINGS

    env = gym.make(env_id, exploring_starts=True)
    most = EXPLORING_OPENINGS[env_id.split("/")[1]]
    stones = []
    for seed in range(150):
        _, info = env.reset(seed=seed)
        seat = env.unwrapped
        assert not seat._over() and seat.game.agent_selection == seat.agent
        assert info["action_mask"].any()
        board = seat.game.observe(seat.agent)["observation"]
        stones.append(int(board.sum()))
        assert len(seat._moves) == stones[-1] <= most + 1  # the opening, then the opponent's
    assert min(stones) == 0 and max(stones) >= most - 1 and len(set(stones)) >= most
    # a seed gives the same opening; a copy (as a vector env's worker gets) replays it
    first = env.reset(seed=7)[0][-1]["content"]
    assert env.reset(seed=7)[0][-1]["content"] == first
    twin, seat = copy.deepcopy(env.unwrapped), env.unwrapped
    board = seat.game.observe(seat.agent)["observation"]
    assert board.sum() > 0 and (twin.game.observe(seat.agent)["observation"] == board).all()
    _, total, info = play(env, 7, np.random.default_rng(0))
    assert info["outcome"] in ("win", "draw", "loss")
    plain = gym.make(env_id)  # off by default: every game from the empty board
    assert {int(plain.reset(seed=s)[1]["action_mask"].sum()) for s in (0, 2, 4)} == {
        len(GAMES[env_id][1])
    }


def test_an_opening_length_below_zero_is_refused():
    with pytest.raises(ValueError, match="opening_moves must be an int >= 0, got -1"):
        AECSeatEnv(pettingzoo.make("aec", "classic/tictactoe_v3"), opening_moves=-1)


@pytest.mark.parametrize("env_id", GAMES)
def test_terminal_rewards_match_pettingzoos(env_id):
    """Replaying the same moves in PettingZoo's own loop gives each seat the same reward."""
    game_id, _ = GAMES[env_id]
    outcomes = set()
    for seed in range(24):
        opponent = CountingOpponent()
        env = gym.make(env_id, opponent=opponent, seat="alternate")
        _, total, info = play(env, seed, np.random.default_rng(seed))
        outcomes.add(info["outcome"])
        history = [a for _, a in env.unwrapped._moves]
        game = pettingzoo.make("aec", game_id)
        game.reset(seed=seed)
        moves, final = iter(history), None
        for agent in game.agent_iter():
            _, reward, termination, truncation, _ = game.last()
            if agent == env.unwrapped.agent and (termination or truncation):
                final = reward
            game.step(None if termination or truncation else next(moves))
        assert final == total
    assert {"win", "loss"} <= outcomes


def test_an_illegal_move_is_invalid_and_never_reaches_the_game():
    first = lambda obs, info: int(np.flatnonzero(info["action_mask"])[0])  # noqa: E731
    env = gym.make("textgym/TicTacToe-v0", opponent=first, seat=1)
    messages, info = env.reset(seed=0)
    assert "Your opponent played a1." in messages[-1]["content"]
    assert "a1" not in messages[-1]["content"].split("Legal moves:")[1]
    _, reward, terminated, _, info = env.step('{"move": "a1"}')
    assert info["invalid"] and info["illegal_action"] == 0 and reward == -1.0 and not terminated
    assert env.unwrapped.game.observe("player_2")["observation"].sum() == 1  # a1 only


def test_a_text_opponent_reads_its_seats_prompt_and_falls_back_when_invalid():
    prompts = []

    def llm(messages):
        prompts.append(messages[-1]["content"])
        legal = messages[-1]["content"].split("Legal moves: ")[1].rstrip(".").split(", ")
        return "pass" if len(prompts) == 2 else f'{{"move": "{legal[-1]}"}}'

    opponent = TextOpponent(llm)
    env = gym.make("textgym/TicTacToe-v0", opponent=opponent, seat=1)
    messages, _ = env.reset(seed=0)
    assert prompts[0].startswith("You play X; your opponent plays O. You move first.")
    assert "Your opponent played c3." in messages[-1]["content"]
    env.step('{"move": "a1"}')
    assert prompts[1].startswith("You play X; your opponent plays O. Your opponent played a1.")
    assert opponent.invalid_replies == 1  # "pass" was replaced by a random legal move
    bare = AECSeatEnv(pettingzoo.make("aec", "classic/tictactoe_v3"), TextOpponent(llm), seat=1)
    with pytest.raises(RuntimeError, match="TextOpponent needs the text env around its seat"):
        bare.reset(seed=0)


def test_a_text_opponent_sees_the_prompt_the_agent_would_see_there():
    # the same history window and invalid-reply note as the agent's own prompts
    seen = []

    def llm(messages):
        seen.append(messages)
        legal = messages[-1]["content"].split("Legal moves: ")[1].rstrip(".").split(", ")
        return "pass" if len(seen) == 1 else f'{{"move": "{legal[0]}"}}'

    opponent = TextOpponent(llm)
    env = gym.make("textgym/TicTacToe-v0", opponent=opponent, seat=1, history=1)
    env.reset(seed=0)
    env.step('{"move": "b2"}')
    first, second = seen
    assert [m["role"] for m in first] == ["system", "user"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] == "pass"
    assert second[3]["content"].startswith("Your last reply was invalid (")
    assert "A random legal move was played." in second[3]["content"]
    env.reset(seed=1)  # a new game forgets the seat's turns
    assert [m["role"] for m in seen[-1]] == ["system", "user"]


@pytest.mark.parametrize("env_id", GAMES)
def test_checkers_are_clean(env_id):
    env = gym.make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every warning but the text wrapper's being a wrapper
        warnings.filterwarnings("ignore", message=".*is different from the unwrapped version")
        check_env(env.unwrapped, skip_render_check=True)
        check_env(find_text_wrapper(env), skip_render_check=True)
    assert check_text_env(env, n_samples=20) == 20


def test_without_pettingzoo_the_ids_are_listed_and_making_one_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pettingzoo", None)
    assert "textgym/TicTacToe-v0" in textgym.registered_ids()
    with pytest.raises(MissingExtraError, match='pip install "textgym\\[pettingzoo\\]"'):
        gym.make("textgym/ConnectFour-v0")
