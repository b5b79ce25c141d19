"""Self-play on one copy of the weights: frozen snapshots of the learner as extra LoRA adapters.

:class:`SelfPlayPool` keeps up to ``size`` snapshots on the learner's own base model (peft
multi-adapter), refreshed every ``every`` updates; its opponents play PettingZoo seats.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from peft import get_peft_model_state_dict, set_peft_model_state_dict

from textgym.envs.pettingzoo_seat import TextOpponent
from textgym_agents.tracking.elo import DEFAULT_K, INITIAL_RATING, elo_update

__all__ = ["SelfPlayOpponent", "SelfPlayPool", "Snapshot", "adapter_active"]

KIND = "selfplay"
"""The opponent kind of pool snapshots: their names are ``"selfplay:<update>"``."""


@contextlib.contextmanager
def adapter_active(model: Any, name: str) -> Iterator[None]:
    """Run the block under LoRA adapter ``name`` of a ``PeftModel``, without gradients.

    On exit (an exception too) the adapter that was active is active again and every
    parameter has the ``requires_grad`` it had on entry: peft's ``set_adapter`` makes the
    adapter it activates trainable, and the learner's must stay the only trainable one.

    Example:
        >>> from textgym_agents import PPOPolicy
        >>> from textgym_agents.testing import tiny_model
        >>> pool = SelfPlayPool(PPOPolicy(*tiny_model()), size=2, every=1)
        >>> with adapter_active(pool.policy.model, pool.snapshots[0].adapter):
        ...     inside = pool.policy.model.active_adapter
        >>> inside, pool.policy.model.active_adapter, torch.is_grad_enabled()
        ('selfplay_0', 'default', True)
    """
    previous = model.active_adapter
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        with torch.no_grad():
            model.set_adapter(name, inference_mode=True)
            yield
    finally:
        model.set_adapter(previous)
        for parameter, flag in flags:
            parameter.requires_grad_(flag)


@dataclasses.dataclass
class Snapshot:
    """One frozen copy of the learner in the pool.

    Attributes:
        adapter: Its peft adapter name (``"selfplay_<update>"``).
        update: The update after which it was taken (0: the starting weights).
        rating: Its Elo rating (it starts at the learner's rating when taken).
    """

    adapter: str
    update: int
    rating: float

    @property
    def name(self) -> str:
        """The opponent name games against it report: ``"selfplay:<update>"``."""
        return f"{KIND}:{self.update}"


class SelfPlayPool:
    """A bounded pool of frozen learner snapshots, kept as extra LoRA adapters of one model.

    - **Snapshots**: one of the starting weights at creation, then one after every ``every``-th
      update (:meth:`on_update`: pass the pool to ``policy.learn(..., callback=pool)``,
      ``trainer.train(callback=pool)`` or ``trainer.add_callback(pool)``); the oldest is
      dropped beyond ``size``. A snapshot is a copy of the learner's adapter weights into a
      new, frozen adapter (``requires_grad=False``, never in the optimizer): memory grows by
      one adapter per snapshot, never by a model.
    - **Opponents**: the pool is an opponent factory (``opponent=pool`` for ``AECSeatEnv`` and
      ``textgym/TicTacToe-v0``): each env gets a :class:`SelfPlayOpponent`, which draws a
      snapshot uniformly for each game (seeded by the env's reset) and replies with the
      learner's decoding under that adapter, inside :func:`adapter_active`.
    - **Ratings**: standard Elo (:func:`~textgym_agents.tracking.elo.elo_update`, ``k``) from
      every finished game against a snapshot; metrics ``selfplay/elo`` (the learner),
      ``selfplay/pool_elo_mean``, ``selfplay/pool_size``, ``selfplay/games``.
    - **Checkpoints**: added to a trainer (``add_callback``, or as ``train``'s callback), the
      pool is saved in every checkpoint (each snapshot's adapter weights, its update and rating,
      the learner's rating) and restored on resume, so a resumed run plays the same pool.

    The model lives in this process: use a ``SyncVectorEnv`` (``gym.make_vec``'s default);
    the pool refuses to be pickled, and a deep copy of an env shares it.

    Example:
        >>> from textgym_agents import PPOPolicy
        >>> from textgym_agents.testing import tiny_model
        >>> pool = SelfPlayPool(PPOPolicy(*tiny_model()), size=2, every=1)
        >>> for update in (1, 2, 3):
        ...     _ = pool.snapshot(update)
        >>> [s.name for s in pool.snapshots]
        ['selfplay:2', 'selfplay:3']
    """

    def __init__(
        self,
        policy: Any,
        size: int = 4,
        every: int = 10,
        *,
        greedy: bool = False,
        k: float = DEFAULT_K,
        rating: float = INITIAL_RATING,
    ) -> None:
        """Create the pool with a snapshot of the policy's current weights.

        Args:
            policy: The learner (a :class:`~textgym_agents.PPOPolicy`; its model a PeftModel).
            size: Most snapshots kept.
            every: Take a snapshot after every ``every``-th update.
            greedy: Opponents pick their most likely reply instead of sampling.
            k: The Elo K-factor.
            rating: The learner's starting rating (and the first snapshot's).
        """
        for label, value in [("size", size), ("every", every)]:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Expected {label} to be an int >= 1, got {value!r}")
        if not hasattr(policy.model, "peft_config"):
            raise TypeError(f"Expected a policy whose model is a PeftModel, got {policy!r:.100}")
        self.policy = policy
        self.learner = policy.model.active_adapter
        self.size = size
        self.every = every
        self.greedy = greedy
        self.k = k
        self.rating = float(rating)
        self.snapshots: list[Snapshot] = []  # oldest first
        self.games = 0  # games against the pool in the last update
        self._retired: dict[str, float] = {}  # ratings of snapshots dropped since last update
        self.snapshot(0)

    # --- snapshots ---------------------------------------------------------------------------

    def snapshot(self, update: int) -> Snapshot:
        """Copy the learner's adapter into a new frozen adapter; drop the oldest beyond size."""
        model = self.policy.model
        adapter = f"{KIND}_{update}"
        if any(s.adapter == adapter for s in self.snapshots):
            raise ValueError(f"The pool already holds a snapshot of update {update}")
        self.check_learner_active()
        while len(self.snapshots) >= self.size:  # drop first: at most `size` snapshots exist
            old = self.snapshots.pop(0)
            self._retired[old.name] = old.rating
            model.delete_adapter(old.adapter)
        with torch.no_grad():
            self._add_frozen(adapter, get_peft_model_state_dict(model, adapter_name=self.learner))
        snapshot = Snapshot(adapter, update, self.rating)
        self.snapshots.append(snapshot)
        return snapshot

    def _add_frozen(self, adapter: str, weights: Mapping[str, torch.Tensor]) -> None:
        """Add adapter ``adapter`` (the learner's config) holding ``weights``, frozen."""
        model = self.policy.model
        config = copy.deepcopy(model.peft_config[self.learner])
        config.inference_mode = True
        flags = [(p, p.requires_grad) for p in model.parameters()]
        with torch.random.fork_rng(devices=[]):  # its random init must not move the run's RNG
            model.add_adapter(adapter, config)
        with torch.no_grad():
            set_peft_model_state_dict(model, dict(weights), adapter_name=adapter)
        for parameter, flag in flags:
            parameter.requires_grad_(flag)
        for parameter in self.adapter_parameters(adapter):
            parameter.requires_grad_(False)

    # --- checkpoints -------------------------------------------------------------------------

    checkpoint_key = KIND
    """The name of the pool's files in a trainer checkpoint (``selfplay.safetensors``/``.json``)."""

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The pool as checkpoint files: snapshot weights (``"<adapter>/<name>"``) and JSON."""
        tensors = {}
        for snapshot in self.snapshots:
            weights = get_peft_model_state_dict(self.policy.model, adapter_name=snapshot.adapter)
            for name, value in weights.items():
                tensors[f"{snapshot.adapter}/{name}"] = value.detach().clone().contiguous()
        meta = {
            "rating": self.rating,
            "snapshots": [dataclasses.asdict(s) for s in self.snapshots],
        }
        return tensors, meta

    def load_checkpoint_state(
        self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]
    ) -> None:
        """Replace the pool by a checkpoint's (the newest ``size`` of its snapshots)."""
        self.check_learner_active()
        saved = list(meta["snapshots"])[-self.size :]
        for snapshot in self.snapshots:
            self.policy.model.delete_adapter(snapshot.adapter)
        self.snapshots, self._retired = [], {}
        for entry in saved:
            prefix = f"{entry['adapter']}/"
            weights = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            if not weights:
                raise ValueError(f"The checkpoint holds no weights of snapshot {entry['adapter']}")
            self._add_frozen(entry["adapter"], weights)
            self.snapshots.append(
                Snapshot(str(entry["adapter"]), int(entry["update"]), float(entry["rating"]))
            )
        self.rating = float(meta["rating"])

    def adapter_parameters(self, adapter: str) -> list[torch.nn.Parameter]:
        """The parameters of adapter ``adapter`` (the learner's or a snapshot's)."""
        return [p for n, p in self.policy.model.named_parameters() if f".{adapter}." in n]

    def check_learner_active(self) -> None:
        """Raise if the learner's adapter is not the active one (it must be, outside a move)."""
        active = self.policy.model.active_adapter
        if active != self.learner:
            raise RuntimeError(f"Expected the learner's adapter {self.learner!r}, got {active!r}")

    def pick(self, rng: np.random.Generator) -> Snapshot:
        """A snapshot drawn uniformly."""
        return self.snapshots[int(rng.integers(len(self.snapshots)))]

    # --- opponents ---------------------------------------------------------------------------

    def new_opponent(self) -> SelfPlayOpponent:
        """An opponent for one env (the factory hook of ``AECSeatEnv``)."""
        return SelfPlayOpponent(self)

    def act_batch(
        self,
        adapter: str,
        batch: Sequence[Sequence[Mapping[str, str]]],
        *,
        choices: Sequence[Sequence[str] | None] | None = None,
        schemas: Sequence[dict[str, Any] | None] | None = None,
        greedy: bool = False,
    ) -> list[str]:
        """Replies of snapshot ``adapter`` (the learner's decoding, no gradients)."""
        with adapter_active(self.policy.model, adapter):
            generation = self.policy.generate(
                batch, greedy=greedy, choices=choices, schemas=schemas
            )
        return list(generation.texts)

    # --- ratings and refresh -----------------------------------------------------------------

    def record(self, opponent: str, outcome: str) -> None:
        """Update the learner's and the snapshot's Elo from one game (``outcome``: learner's).

        Games against a snapshot dropped before the last update still count; others are
        ignored.
        """
        snapshot = next((s for s in self.snapshots if s.name == opponent), None)
        if snapshot is not None:
            self.rating, snapshot.rating = elo_update(self.rating, snapshot.rating, outcome, self.k)
        elif opponent in self._retired:
            self.rating, self._retired[opponent] = elo_update(
                self.rating, self._retired[opponent], outcome, self.k
            )
        else:
            return
        self.games += 1

    def on_update(
        self,
        trainer: Any,
        metrics: dict[str, float],
        *,
        episodes: Sequence[Any] = (),
        games: Sequence[tuple[str | None, str]] = (),
    ) -> None:
        """Trainer hook: rate the update's games, snapshot every ``every``-th update, add metrics.

        ``games`` are every process's ``(opponent, outcome)`` pairs, so each process's pool
        keeps the same ratings.
        """
        self.check_learner_active()
        self.games = 0
        for opponent, outcome in games:
            if opponent is not None and opponent.startswith(f"{KIND}:"):
                self.record(opponent, outcome)
        self._retired.clear()
        if trainer.update_step % self.every == 0:
            self.snapshot(trainer.update_step)
        metrics.update(self.metrics())

    def metrics(self) -> dict[str, float]:
        """The pool's metrics: ``selfplay/elo``, ``pool_elo_mean``, ``pool_size``, ``games``."""
        return {
            "selfplay/elo": self.rating,
            "selfplay/pool_elo_mean": float(np.mean([s.rating for s in self.snapshots])),
            "selfplay/pool_size": float(len(self.snapshots)),
            "selfplay/games": float(self.games),
        }

    def __deepcopy__(self, memo: dict[int, Any]) -> SelfPlayPool:
        return self  # a copied env plays the same pool: never a second model

    def __reduce__(self) -> Any:
        raise TypeError(
            "A SelfPlayPool holds the learner's model and cannot be pickled; play it in this "
            "process (gym.make_vec's default SyncVectorEnv, not AsyncVectorEnv)"
        )


class SelfPlayOpponent(TextOpponent):
    """A :class:`~textgym.envs.pettingzoo_seat.TextOpponent` replying with a pool snapshot.

    Each game (``reset``) draws a snapshot from the pool with the reset's seed; if the pool
    drops it mid-game, the game goes on against another one (and reports that one). Its
    :attr:`name` is the snapshot's, ``"selfplay:<update>"``.
    """

    def __init__(self, pool: SelfPlayPool) -> None:
        self.pool = pool
        self.snapshot: Snapshot | None = None
        self._games = np.random.default_rng()
        super().__init__(_SnapshotPolicy(self), greedy=pool.greedy, name=KIND)

    @property  # type: ignore[override]
    def name(self) -> str:
        """``"selfplay:<update>"`` of the current game's snapshot."""
        return self.snapshot.name if self.snapshot is not None else KIND

    @name.setter
    def name(self, value: str) -> None:
        pass  # the name follows the snapshot

    def reset(self, seed: int | None = None) -> None:
        """Reseed, and draw this game's snapshot."""
        super().reset(seed)
        self._games = np.random.default_rng(seed)
        self.snapshot = self.pool.pick(self._games)

    def act(self, observation: Any, info: Mapping[str, Any]) -> Any:
        """The snapshot's move (parsed; a random legal move if its reply is invalid)."""
        if self.snapshot is None or self.snapshot not in self.pool.snapshots:
            self.snapshot = self.pool.pick(self._games)
        return super().act(observation, info)

    def __deepcopy__(self, memo: dict[int, Any]) -> SelfPlayOpponent:
        copied = copy.copy(self)  # the same pool, its own game state
        copied.__dict__.update(
            {k: copy.deepcopy(v, memo) for k, v in self.__dict__.items() if k != "pool"}
        )
        copied.policy = _SnapshotPolicy(copied)
        return copied


class _SnapshotPolicy:
    """The :class:`textgym.Policy` a :class:`SelfPlayOpponent` asks: its snapshot's replies."""

    def __init__(self, opponent: SelfPlayOpponent) -> None:
        self.opponent = opponent

    @property
    def wants_choices(self) -> bool:
        return bool(self.opponent.pool.policy.wants_choices)

    @property
    def wants_schemas(self) -> bool:
        return bool(self.opponent.pool.policy.wants_schemas)

    def act_batch(
        self,
        batch: Sequence[Sequence[Mapping[str, str]]],
        *,
        choices: Sequence[Sequence[str] | None] | None = None,
        schemas: Sequence[dict[str, Any] | None] | None = None,
        greedy: bool = False,
    ) -> list[str]:
        snapshot = self.opponent.snapshot
        if snapshot is None:
            raise RuntimeError("The self-play opponent has no snapshot: reset the env first")
        pool = self.opponent.pool
        return pool.act_batch(
            snapshot.adapter, batch, choices=choices, schemas=schemas, greedy=greedy
        )
