"""One seat of a PettingZoo AEC game as a single-agent Gymnasium env; opponents play the others.

:class:`AECSeatEnv` needs no ``pettingzoo`` import of its own (it drives any object with the
AEC API); the opponents are random legal, scripted (a callable) or text (a chat policy).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from textgym.action_masks import ActionMasking
from textgym.conversation import Conversation, invalid_reply_note

__all__ = [
    "SEAT_MODES",
    "AECSeatEnv",
    "Opponent",
    "RandomOpponent",
    "ScriptedOpponent",
    "TextOpponent",
    "as_opponent",
    "play_games",
]

SEAT_MODES = ("alternate", "random")


class Opponent:
    """Plays the seats that are not the agent's: ``act(observation, info) -> action``.

    ``observation`` and ``info`` are what :class:`AECSeatEnv` would return if that seat were
    the agent's (``info["action_mask"]`` names the legal moves, ``info["seat"]`` the seat).
    :attr:`name` is reported in the last step's ``info["opponent"]``, so metrics can be split
    by opponent: ``"kind"`` or ``"kind:id"`` (the per-opponent metrics group by the kind).
    """

    name: str = "opponent"

    def reset(self, seed: int | None = None) -> None:
        """Called on every ``AECSeatEnv.reset`` with a seed drawn from the env's generator."""

    def bind(self, env: gym.Env[Any, Any]) -> None:
        """Called once with the outermost env built around the seat (a text env, say)."""

    def act(self, observation: Any, info: Mapping[str, Any]) -> Any:
        """Return the move of the seat ``info["seat"]``."""
        raise NotImplementedError


class RandomOpponent(Opponent):
    """A uniformly random legal move, seeded by the env's reset.

    Example:
        >>> opponent = RandomOpponent()
        >>> opponent.reset(seed=0)
        >>> int(opponent.act(None, {"action_mask": np.array([0, 1, 0], dtype=np.int8)}))
        1
    """

    name = "random"

    def __init__(self) -> None:
        self._rng = np.random.default_rng()

    def reset(self, seed: int | None = None) -> None:
        """Reseed the move generator."""
        self._rng = np.random.default_rng(seed)

    def act(self, observation: Any, info: Mapping[str, Any]) -> Any:
        """A legal move drawn uniformly."""
        legal = np.flatnonzero(np.asarray(info["action_mask"]))
        return np.int64(self._rng.choice(legal))


class ScriptedOpponent(Opponent):
    """A callable ``(observation, info) -> action`` plays the other seats.

    Example:
        >>> first_legal = ScriptedOpponent(lambda obs, info: int(np.argmax(info["action_mask"])))
        >>> first_legal.act(None, {"action_mask": [0, 0, 1]})
        2
    """

    def __init__(
        self, policy: Callable[[Any, Mapping[str, Any]], Any], *, name: str = "scripted"
    ) -> None:
        if not callable(policy):
            raise TypeError(f"Expected a callable (observation, info) -> action, got {policy!r}")
        self.policy = policy
        self.name = name

    def act(self, observation: Any, info: Mapping[str, Any]) -> Any:
        """The callable's move."""
        return self.policy(observation, info)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.policy == other.policy  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]


class TextOpponent(Opponent):
    """A text policy plays the other seats: it reads the prompt the agent would read there.

    ``policy`` is a callable ``messages -> reply`` or a :class:`textgym.Policy` (given the legal
    replies when it wants choices or schemas). Its prompt is built as the agent's is, by the
    text env's :class:`~textgym.conversation.Conversation`: the system prompt, the seat's last
    ``history`` turns and its current observation. A reply that is invalid or names an illegal
    move is replaced by a random legal move, counted in :attr:`invalid_replies` and noted in
    the next prompt, as the agent's invalid replies are.

    Needs the text env built around the seat (:func:`~textgym.envs.pettingzoo_text.
    pettingzoo_text_env` binds it).
    """

    def __init__(self, policy: Any, *, greedy: bool = False, name: str = "text") -> None:
        from textgym.policy import as_policy  # here: textgym.policy imports the episode runner

        self.policy = as_policy(policy)
        self.greedy = greedy
        self.name = name
        self.invalid_replies = 0
        self._text_env: Any = None
        self._chat: Conversation | None = None
        self._note = ""
        self._fallback = RandomOpponent()

    def reset(self, seed: int | None = None) -> None:
        """Start a new game: forget the seat's turns, reseed the fallback move generator."""
        self._fallback.reset(seed)
        self._note = ""
        if self._chat is not None:
            self._chat.reset()

    def bind(self, env: gym.Env[Any, Any]) -> None:
        """Find the text env whose prompts and parser the opponent uses."""
        from textgym.checker import find_text_wrapper

        self._text_env = text_env = find_text_wrapper(env)
        self._chat = Conversation(text_env.system_prompt, text_env.history)

    def act(self, observation: Any, info: Mapping[str, Any]) -> Any:
        """The policy's reply, parsed; a random legal move if it is invalid or illegal."""
        text_env = self._text_env
        if text_env is None:
            raise RuntimeError(
                "TextOpponent needs the text env around its seat: build it with "
                "pettingzoo_text_env(...) or call opponent.bind(text_env)"
            )
        masking = ActionMasking(text_env.env.action_space, text_env.parser)
        masking.update(observation, info, required=True)
        chat = self._chat
        assert chat is not None  # set with _text_env
        chat.observe(self._note + text_env.format_observation(observation, info))
        messages = chat.messages()
        kwargs: dict[str, Any] = {}
        if self.policy.wants_choices:
            kwargs["choices"] = [masking.choices()]
        if self.policy.wants_schemas:
            kwargs["schemas"] = [masking.schema()]
        reply = self.policy.act_batch([messages], greedy=self.greedy, **kwargs)[0]
        chat.answer(reply[: text_env.max_reply_chars])
        self._note = ""
        action, error = text_env.parse_reply(reply, masking=masking)  # this seat's legal moves
        if error is None:
            return action
        self.invalid_replies += 1
        self._note = invalid_reply_note(error, "A random legal move was played.") + "\n\n"
        return self._fallback.act(observation, info)


def as_opponent(opponent: Any) -> Opponent:
    """An :class:`Opponent` from ``"random"``, an Opponent, a callable (scripted) or a factory.

    A factory is an object with a ``new_opponent()`` method (such as
    ``textgym_agents.selfplay.SelfPlayPool``): each env built with it gets its own opponent, so
    the envs of a vector env made with one ``opponent=`` keyword do not share a game's state.

    Example:
        >>> type(as_opponent("random")).__name__, type(as_opponent(lambda o, i: 0)).__name__
        ('RandomOpponent', 'ScriptedOpponent')
    """
    if isinstance(opponent, Opponent):
        return opponent
    if callable(getattr(opponent, "new_opponent", None)):
        return as_opponent(opponent.new_opponent())
    if isinstance(opponent, str) and opponent == "random":
        return RandomOpponent()
    if callable(opponent):
        return ScriptedOpponent(opponent)
    raise TypeError(
        "Expected opponent to be 'random', an Opponent (TextOpponent(policy) for a text "
        "policy), a callable (observation, info) -> action or a factory with new_opponent(), "
        f"got {opponent!r}"
    )


# Openings drawn per reset before giving up on one the agent can move in (a random opening
# rarely ends a game: tic-tac-toe needs 5 moves to finish, and the draw includes fewer).
_OPENING_TRIES = 100


class AECSeatEnv(gym.Env[Any, Any]):
    """A PettingZoo AEC game seen from one seat: the opponent moves between the agent's turns.

    Observations are the seat's ``observation`` (PettingZoo's dict minus the mask); ``info``
    holds ``action_mask`` (int8, PettingZoo's), ``seat`` (the agent name), ``seat_index`` and,
    once someone else has moved, ``opponent_action`` (their last move). A step's reward is
    the sum of PettingZoo's rewards for the seat over its move and the opponents' replies, so
    an episode's return is the seat's game reward. The last step's info also has ``outcome``
    (``"win"``, ``"draw"`` or ``"loss"``, from that return), ``is_success`` (a win) and
    ``opponent`` (the opponent's :attr:`~Opponent.name`).

    Example:
        >>> import pettingzoo
        >>> env = AECSeatEnv(pettingzoo.make("aec", "classic/tictactoe_v3"), "random", seat=1)
        >>> obs, info = env.reset(seed=0)
        >>> info["seat"], int(info["action_mask"].sum())  # the opponent has moved
        ('player_2', 8)
    """

    def __init__(
        self,
        game: Any,
        opponent: Any = "random",
        *,
        seat: str | int = "alternate",
        opening_moves: int = 0,
    ) -> None:
        """Wrap a PettingZoo AEC env.

        Args:
            game: A PettingZoo AEC env (with ``OrderEnforcingWrapper`` and, for illegal moves
                to end the game as PettingZoo's classic games do, ``TerminateIllegalWrapper``:
                ``pettingzoo.make("aec", ...)`` adds both).
            opponent: Who plays the other seats: ``"random"`` (a random legal move), a callable
                ``(observation, info) -> action`` (scripted), an :class:`Opponent`
                (:class:`TextOpponent` for a text policy) or a factory with ``new_opponent()``
                (see :func:`as_opponent`).
            seat: The agent's seat: ``"alternate"`` (a reset with seed ``s`` takes seat
                ``s mod n``, one without a seed the seat after the last one, so the agent plays
                first and second and a seeded reset is reproducible), ``"random"`` (drawn from
                the reset's seed), a seat index or an agent name.
                ``reset(options={"seat": ...})`` overrides it for one episode.
            opening_moves: Exploring starts for games: each reset first plays a number of
                random legal moves drawn uniformly from 0 to ``opening_moves`` (for whichever
                seat is to move; an opening that ends the game, or after which the opponent
                ends it, is drawn again), so training games also start in the middle, where
                a move can win or must block. For training envs only; 0 (the default) plays
                every game from the start.
        """
        if not (isinstance(opening_moves, int) and opening_moves >= 0):
            raise ValueError(f"opening_moves must be an int >= 0, got {opening_moves!r}")
        self.opening_moves = opening_moves
        self.game = game
        self.agents = list(game.possible_agents)
        self.opponent = as_opponent(opponent)
        self._check_seat(seat)
        self.seat_mode = seat
        space = game.observation_space(self.agents[0])
        if isinstance(space, gym.spaces.Dict) and "observation" in space.spaces:
            space = space["observation"]
        self.observation_space = space
        self.action_space = game.action_space(self.agents[0])
        if not isinstance(self.action_space, gym.spaces.Discrete):
            raise ValueError(
                f"Expected a Discrete action space, got {type(self.action_space).__name__}"
            )
        self.render_mode = getattr(game, "render_mode", None)
        self.metadata = {
            "render_modes": list(game.metadata.get("render_modes", [])),
            "render_fps": game.metadata.get("render_fps", 1),
        }
        self.agent = self.agents[0]
        self._seat_index = -1  # the first unseeded "alternate" reset takes seat 0
        self.episodes = 0
        self._moves: list[tuple[str, int]] = []
        self._return = 0.0
        self._game_seed: int | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle (and deep-copy): replay the game's moves since its seeded reset.

        PettingZoo's games pickle as their constructor arguments (``EzPickle``), so a copy
        starts unreset; replaying the moves restores the position (exactly so for games whose
        randomness comes from their seed, as tic-tac-toe and Connect Four have none).
        """
        self.__dict__.update(state)
        if self.episodes:
            self.game.reset(seed=self._game_seed)
            for _, action in self._moves:
                self.game.step(action)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Start a game; the opponents move until it is the agent's turn."""
        super().reset(seed=seed)
        seat = (options or {}).get("seat", self.seat_mode)
        self._check_seat(seat)
        self.game.reset(seed=seed)
        self._game_seed = seed
        self.opponent.reset(seed=int(self.np_random.integers(2**31)))
        if seat == "alternate":  # as a function of the seed, so a seeded reset is reproducible
            seat = (seed if seed is not None else self._seat_index + 1) % len(self.agents)
        elif seat == "random":
            seat = int(self.np_random.integers(len(self.agents)))
        self.agent = seat if isinstance(seat, str) else self.agents[seat]
        self._seat_index = self.agents.index(self.agent)
        self.episodes += 1
        for attempt in range(_OPENING_TRIES):
            if attempt:  # the last opening ended the game: start again from the same deal
                self.game.reset(seed=seed)
            self._moves, self._return = [], 0.0
            self._play_opening()
            if not self._over():
                self._return += self._play_opponents()
            if not self._over() or not self.opening_moves:
                break
        if self._over():
            raise RuntimeError(f"The game ended before {self.agent} could move")
        return self._view(self.agent)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Play the agent's move, then the opponents' until it is the agent's turn again."""
        if self._over():
            raise RuntimeError("The game is over: call reset()")
        self.game.step(action)
        self._moves.append((self.agent, int(action)))
        reward = float(self.game.rewards.get(self.agent, 0.0))
        reward += self._play_opponents()
        self._return += reward
        terminated = bool(self.game.terminations.get(self.agent, False))
        truncated = bool(self.game.truncations.get(self.agent, False)) and not terminated
        obs, info = self._view(self.agent)
        if terminated or truncated:
            info["outcome"] = "win" if self._return > 0 else "loss" if self._return < 0 else "draw"
            info["is_success"] = self._return > 0
            info["opponent"] = self.opponent.name
        return obs, reward, terminated, truncated, info

    def render(self) -> Any:
        """The game's own rendering (its ``render_mode``)."""
        return self.game.render()

    def close(self) -> None:
        """Close the game."""
        self.game.close()

    def _play_opening(self) -> None:
        """Random legal moves for whoever is to move, as many as :attr:`opening_moves` draws."""
        for _ in range(int(self.np_random.integers(self.opening_moves + 1))):
            if self._over():
                return
            mover = self.game.agent_selection
            legal = np.flatnonzero(self._view(mover)[1]["action_mask"])
            action = int(self.np_random.choice(legal))
            self.game.step(action)
            self._moves.append((mover, action))

    def _play_opponents(self) -> float:
        """Opponent moves until the agent's turn or the end; the agent's rewards from them."""
        reward = 0.0
        while not self._over() and self.game.agent_selection != self.agent:
            mover = self.game.agent_selection
            action = self.opponent.act(*self._view(mover))
            self.game.step(action)
            self._moves.append((mover, int(action)))
            reward += float(self.game.rewards.get(self.agent, 0.0))
        return reward

    def _over(self) -> bool:
        game = self.game
        return bool(game.terminations.get(self.agent, True) or game.truncations.get(self.agent))

    def _view(self, agent: str) -> tuple[Any, dict[str, Any]]:
        raw = self.game.observe(agent)
        obs, mask = raw, self.game.infos.get(agent, {}).get("action_mask")
        if isinstance(raw, Mapping) and "observation" in raw:
            obs, mask = raw["observation"], raw.get("action_mask", mask)
        if mask is None:
            raise ValueError(f"{agent} has no action mask in its observation or info")
        info: dict[str, Any] = {
            "action_mask": np.asarray(mask, dtype=np.int8),
            "seat": agent,
            "seat_index": self.agents.index(agent),
        }
        others = [a for who, a in self._moves if who != agent]
        if others:
            info["opponent_action"] = others[-1]
        return obs, info

    def _check_seat(self, seat: Any) -> None:
        n = len(self.agents)
        valid = (
            seat in SEAT_MODES
            or seat in self.agents
            or (isinstance(seat, int) and not isinstance(seat, bool) and 0 <= seat < n)
        )
        if not valid:
            raise ValueError(
                f"Expected seat to be one of {SEAT_MODES}, a seat index 0..{n - 1} or one of "
                f"{self.agents}, got {seat!r}"
            )


def play_games(env: AECSeatEnv, player: Opponent, games: int, *, seed: int = 0) -> list[str]:
    """``player`` takes the agent's seat of ``env`` for ``games`` games; their outcomes.

    Game ``g`` resets the env with seed ``seed + g`` and the player with ``seed + games + g``;
    with ``seat="alternate"`` the player moves first in every other game. No text involved:
    this is how scripted players' reference results are computed.

    Example:
        >>> import pettingzoo
        >>> env = AECSeatEnv(pettingzoo.make("aec", "classic/tictactoe_v3"), "random")
        >>> outcomes = play_games(env, RandomOpponent(), 50)
        >>> len(outcomes), set(outcomes) <= {"win", "draw", "loss"}
        (50, True)
    """
    outcomes = []
    for game in range(games):
        obs, info = env.reset(seed=seed + game)
        player.reset(seed=seed + games + game)
        done = False
        while not done:
            obs, _, terminated, truncated, info = env.step(player.act(obs, info))
            done = terminated or truncated
        outcomes.append(info["outcome"])
    return outcomes
