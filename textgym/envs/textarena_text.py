"""TextArena's games as text envs: ``textgym/ta-<Game>-v0``, one seat, the game's own text.

`TextArena <https://github.com/LeonGuertler/TextArena>`_ has its own, non-Gymnasium API
(``reset(num_players)``, ``get_observation()``, ``step(text)``, ``close()``) and writes
observations as text for language models. :class:`TextArenaSeatEnv` is one player's seat as a
Gymnasium env: the observation is the game's rules and what the game said since the seat's last
move, the action is the reply text, passed to the game as it is (the game judges it; an invalid
move is the game's to punish), and any other seats are played inside ``step`` by opponents, as
in the PettingZoo seat. The reward is the seat's at the end of the game (1 for a win; some games
pay partial credit, GuessTheNumber for a near miss at the turn limit), and ``is_success`` a
reward of 1. The registered games
are single-player puzzles that need no data downloads (``pip install "textgym[textarena]"``).

Example:
    >>> import gymnasium as gym, textgym
    >>> env = gym.make("textgym/ta-GuessTheNumber-v0")
    >>> messages, info = env.reset(seed=1)
    >>> print(messages[-1]["content"].splitlines()[1])
    You have to guess the number between 1 and 20 within 10 turns.
    >>> messages, reward, terminated, truncated, info = env.step("My guess: [10]")
    >>> messages[-1]["content"].splitlines()[-1], reward, terminated
    ('The target number is lower.', 0.0, False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from textgym.envs.calculator import observation_text
from textgym.extras import require
from textgym.parsers import ActionParseError, ActionParser
from textgym.spaces import UnicodeText
from textgym.wrappers import TextEnvWrapper

__all__ = [
    "SYSTEM_PROMPT",
    "TEXTARENA_GAMES",
    "RawReplyParser",
    "TextArenaSeatEnv",
    "make_textarena_text_env",
]

TEXTARENA_GAMES = (
    "FifteenPuzzle-v0",
    "FrozenLake-v0",
    "GuessTheNumber-v0",
    "LightsOut-v0",
    "Mastermind-v0",
    "Minesweeper-v0",
    "Sudoku-v0",
    "TowerOfHanoi-v0",
)
"""Registered as ``textgym/ta-<Game>``: single-player, offline (no word lists to download).
Any other TextArena game runs through :func:`make_textarena_text_env` with ``game=``."""

SYSTEM_PROMPT = (
    "You are playing a text game. Follow the game's instructions and write your move in the "
    "form it asks for."
)
_REPLY_CHARS = 4096
_PROMPT, _PLAYER_ACTION = "PROMPT", "PLAYER_ACTION"  # names of textarena's ObservationType


class RawReplyParser(ActionParser):
    """Passes the reply text to the game as it is: the game reads and judges the move.

    Example:
        >>> RawReplyParser().parse("I pick [4]")
        'I pick [4]'
    """

    def parse(self, text: str) -> str:
        """Return ``text`` unchanged; one longer than the action space allows is refused."""
        if len(text) > _REPLY_CHARS:
            raise ActionParseError(f"reply longer than {_REPLY_CHARS} characters", text)
        return text

    def instructions(self) -> str:
        """Where the format comes from: the game's own rules."""
        return "Reply with your move written exactly as the game's rules ask."


class TextArenaSeatEnv(gym.Env[str, str]):
    """One seat of a TextArena game as a Gymnasium env (see the module docstring).

    Args:
        game: A TextArena env id (``textarena.envs.registration.ENV_REGISTRY``), without the
            ``-raw`` suffix; the raw variant is played, so no TextArena wrapper rewrites the text.
        num_players: Seats in the game.
        seat: The player id this env plays.
        opponents: For each other seat, a function from its observation text to its move; needed
            when ``num_players > 1``.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        game: str,
        *,
        num_players: int = 1,
        seat: int = 0,
        opponents: dict[int, Callable[[str], str]] | None = None,
    ) -> None:
        require("textarena", "textarena", f"textgym/ta-{game}")
        from textarena.envs.registration import ENV_REGISTRY

        raw = game if game.endswith("-raw") else f"{game}-raw"
        if raw not in ENV_REGISTRY:
            raise ValueError(f"Unknown TextArena game {game!r}; see textarena's ENV_REGISTRY")
        others = {p for p in range(num_players) if p != seat}
        missing = others - set(opponents or {})
        if not 0 <= seat < num_players or missing:
            raise ValueError(
                f"seat must be in [0, {num_players}) and every other seat needs an opponent; "
                f"seat={seat}, seats without one: {sorted(missing)}"
            )
        self.game_id, self.num_players, self.seat = raw, num_players, seat
        self.opponents = dict(opponents or {})
        self.observation_space = UnicodeText(max_length=1_000_000)
        self.action_space = UnicodeText(max_length=_REPLY_CHARS)
        self.game: Any = None
        self.rules = ""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start a game (seeded by ``seed``, else by the env's generator) and play to our turn."""
        super().reset(seed=seed)
        import textarena

        game_seed = seed if seed is not None else int(self.np_random.integers(2**31))
        self.game = textarena.make(self.game_id)
        self.game.reset(num_players=self.num_players, seed=game_seed)
        self.rules = ""
        observation, ended = self._play_opponents()
        if ended:  # a game over before the seat's first move: nothing to learn from
            raise RuntimeError(f"{self.game_id} ended before seat {self.seat} could move")
        return observation, {"game": self.game_id}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Send ``action`` to the game, play the other seats, and return the seat's next view."""
        if self.game is None:
            raise RuntimeError("Call reset() before step()")
        done, _ = self.game.step(action=str(action))
        observation, ended = ("", True) if done else self._play_opponents()
        if not ended:
            return observation, 0.0, False, False, {"game": self.game_id}
        rewards, game_info = self.game.close()
        self.game = None
        reward = float(rewards.get(self.seat, 0.0)) if rewards else 0.0
        mine = (game_info or {}).get(self.seat, {})
        info = {
            "game": self.game_id,
            "is_success": reward >= 1.0,  # a win; some games pay partial credit below 1
            "invalid_move": bool(mine.get("invalid_move", False)),
            "reason": str(mine.get("reason", "")),
        }
        return observation, reward, True, False, info

    def _play_opponents(self) -> tuple[str, bool]:
        """Let the other seats move until it is this seat's turn: (its view, game over)."""
        while True:
            player, pieces = self.game.get_observation()
            text = self._text(pieces)
            if player == self.seat:
                return text, False
            done, _ = self.game.step(action=str(self.opponents[player](text)))
            if done:
                return "", True

    def _text(self, pieces: list[Any]) -> str:
        """The rules (kept from the first view) and the game's messages, without our echo."""
        said = []
        for sender, message, kind in pieces:
            name = getattr(kind, "name", str(kind))
            if name == _PROMPT:
                self.rules = f"{self.rules}\n{message}".strip()
            elif not (sender == self.seat and name == _PLAYER_ACTION):
                said.append(str(message).strip())
        return "\n\n".join(part for part in [self.rules, *said] if part)


def make_textarena_text_env(
    game: str = "GuessTheNumber-v0",
    *,
    num_players: int = 1,
    seat: int = 0,
    opponents: dict[int, Callable[[str], str]] | None = None,
    **wrapper_kwargs: Any,
) -> TextEnvWrapper:
    """Build ``textgym/ta-<Game>``: :class:`TextArenaSeatEnv` behind a ``TextEnvWrapper``.

    Replies go to the game as they are (:class:`RawReplyParser`); the game's rules and messages
    are the user messages under :data:`SYSTEM_PROMPT`, with the last two exchanges kept.

    Args:
        game: The TextArena env id.
        num_players: Seats in the game.
        seat: The seat this env plays.
        opponents: The other seats' players (observation text -> move).
        **wrapper_kwargs: Passed to :class:`~textgym.wrappers.TextEnvWrapper`.
    """
    env = TextArenaSeatEnv(game, num_players=num_players, seat=seat, opponents=opponents)
    wrapper_kwargs.setdefault("formatter", observation_text)
    wrapper_kwargs.setdefault("parser", RawReplyParser())
    wrapper_kwargs.setdefault("system_prompt", SYSTEM_PROMPT)
    wrapper_kwargs.setdefault("history", 2)
    return TextEnvWrapper(env, **wrapper_kwargs)
