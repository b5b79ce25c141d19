"""TextArena games as one-seat text envs: the game's text, its judgement, opponents in step."""

import re

import gymnasium as gym
import pytest

import textgym
from textgym.envs.textarena_text import SYSTEM_PROMPT, TEXTARENA_GAMES, make_textarena_text_env

pytest.importorskip("textarena")


def test_the_prompt_is_the_games_own_text():
    messages, info = gym.make("textgym/ta-GuessTheNumber-v0").reset(seed=1)
    assert messages[0] == {
        "role": "system",
        "content": SYSTEM_PROMPT
        + "\n\nReply with your move written exactly as the game's rules ask.",
    }
    assert messages[1]["content"].startswith("You are Player 0. You are playing Guess The Number.")
    assert info["game"] == "GuessTheNumber-v0-raw"


def test_a_binary_search_wins_and_the_game_pays_it():
    env = gym.make("textgym/ta-GuessTheNumber-v0")
    messages, _ = env.reset(seed=1)
    low, high = 1, 20
    for _ in range(10):
        guess = (low + high) // 2
        messages, reward, terminated, truncated, info = env.step(f"[{guess}]")
        if terminated:
            break
        hint = messages[-1]["content"].splitlines()[-1]
        assert hint in ("The target number is higher.", "The target number is lower.")
        low, high = (guess + 1, high) if "higher" in hint else (low, guess - 1)
        assert reward == 0.0
    assert (reward, terminated, truncated, info["is_success"]) == (1.0, True, False, True)
    assert "Congratulations" in info["reason"] and not info["invalid_move"]


def test_a_move_the_game_cannot_read_is_the_games_to_punish():
    env = gym.make("textgym/ta-GuessTheNumber-v0")
    env.reset(seed=1)
    messages, _, terminated, _, info = env.step("twelve, I think")
    assert not info["invalid"]  # the reply reached the game: textgym's parser took it as it is
    assert "You attempted an invalid move" in messages[-1]["content"] and not terminated
    for _ in range(10):  # the game's rule: a few resubmissions, then it ends the game
        _, reward, terminated, _, info = env.step("still twelve")
        if terminated:
            break
    assert (reward, terminated, info["invalid_move"]) == (0.0, True, True)
    assert not info["is_success"]


@pytest.mark.parametrize("game", TEXTARENA_GAMES)
def test_every_registered_game_plays_a_few_replies(game):
    env = gym.make(f"textgym/ta-{game}")
    messages, _ = env.reset(seed=0)
    assert messages[-1]["content"]
    for reply in ["[1]", "[0 0]", "[A C]", "[1 2 3 4]", "hello"]:
        messages, reward, terminated, truncated, _ = env.step(reply)
        assert isinstance(reward, float)
        if terminated or truncated:
            break


def first_free_cell(text):
    """A tic-tac-toe opponent: the first of the 'Available Moves' the game lists."""
    return re.findall(r"'(\[\d\])'", text.split("Available Moves:")[-1])[0]


def test_two_player_games_play_the_other_seat_inside_step():
    env = make_textarena_text_env("TicTacToe-v0", num_players=2, opponents={1: first_free_cell})
    messages, _ = env.reset(seed=0)
    assert "You are Player 0 in Tic Tac Toe." in messages[-1]["content"]
    messages, reward, terminated, *_ = env.step("[4]")
    board = messages[-1]["content"]
    assert "Player 1 placed their symbol (X) in cell 0." in board and not terminated
    for cell in ("[8]", "[6]", "[2]", "[7]", "[5]", "[3]", "[1]"):
        messages, reward, terminated, _, info = env.step(cell)
        if terminated:
            break
    assert terminated and reward in (-1.0, 0.0, 1.0)


def test_other_seats_need_players():
    with pytest.raises(ValueError, match=r"seats without one: \[1\]"):
        make_textarena_text_env("TicTacToe-v0", num_players=2)
    with pytest.raises(ValueError, match="Unknown TextArena game 'NoSuchGame-v0'"):
        make_textarena_text_env("NoSuchGame-v0")


def test_a_checked_text_env():
    assert textgym.check_text_env(gym.make("textgym/ta-TowerOfHanoi-v0")) >= 0
