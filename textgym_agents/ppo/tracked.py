"""Where each env of a training run is (episode, step), faults that name it, and exact resume.

:class:`TrackedVectorEnv` wraps the trainer's vector env. It counts episodes and steps per env,
turns an exception raised inside an env into an :class:`EnvFault` that says which env, episode
and step, and records how each env's current episode began (its seed, or its RNG state before an
autoreset) and the replies it received since. Env objects cannot be saved without pickle, but a
Gymnasium env is deterministic given its RNG and its actions, so a checkpoint holds that record
and a resumed run replays it to stand where the interrupted one stood.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper

from textgym_agents.exceptions import EnvFault

__all__ = ["TrackedVectorEnv", "fingerprint", "restore_rollout", "rollout_state"]

logger = logging.getLogger(__name__)

STATE_VERSION = 1


def fingerprint(observation: Any) -> str:
    """A short hash of an observation (chat messages), to check that a replay arrived.

    Example:
        >>> fingerprint([{"role": "user", "content": "hi"}]) == fingerprint(
        ...     ({"content": "hi", "role": "user"},))
        True
    """
    text = json.dumps(observation, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class TrackedVectorEnv(VectorWrapper):
    """A vector env that knows each env's episode and step, names faulty envs, and can replay.

    Replay needs Gymnasium's default ``NEXT_STEP`` autoreset, text (str) actions and, to restore,
    a :class:`~gymnasium.vector.SyncVectorEnv` directly underneath (a single env is one); other
    set-ups still track and name faults, and :meth:`restore` returns None for them.

    Example:
        >>> import gymnasium as gym, textgym
        >>> envs = TrackedVectorEnv(gym.make_vec("textgym/Blackjack-v1", num_envs=2))
        >>> _ = envs.reset(seed=0)
        >>> _ = envs.step(['{"action": "stick"}', "hmm"])
        >>> envs.episodes.tolist(), envs.steps.tolist()
        ([1, 1], [1, 1])
        >>> again = TrackedVectorEnv(gym.make_vec("textgym/Blackjack-v1", num_envs=2))
        >>> restored = again.restore(envs.state())
        >>> [m[-1]["content"] for m in restored] == [m[-1]["content"] for m in envs.last_obs]
        True
    """

    def __init__(self, env: VectorEnv, max_replay_steps: int = 10_000) -> None:
        """Wrap ``env``.

        Args:
            env: The vector env to track.
            max_replay_steps: An episode longer than this is not recorded further (memory stays
                bounded); a checkpoint taken during it resumes with fresh episodes instead.
        """
        super().__init__(env)
        n = env.num_envs
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self.mode = AutoresetMode(mode) if isinstance(mode, str) else mode
        self.max_replay_steps = max_replay_steps
        self.episodes = np.zeros(n, dtype=np.int64)  # episodes begun, per env
        self.steps = np.zeros(n, dtype=np.int64)  # actions taken in the current episode
        self.resetting = np.zeros(n, dtype=bool)  # NEXT_STEP: the next step resets this env
        # How each env's current episode began and the replies since; None: cannot be replayed.
        self.records: list[dict[str, Any] | None] = [None] * n
        self.last_obs: tuple[Any, ...] | None = None

    # --- the vector env API ------------------------------------------------------------------

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every env, recording the seeds (or RNG states) the episodes start from."""
        n = self.num_envs
        seeds = [seed + i for i in range(n)] if isinstance(seed, int) else seed
        starts: list[dict[str, Any] | None]
        if options is not None:
            starts = [None] * n  # options are not recorded: such episodes are not replayed
        elif seeds is None:
            starts = [{"rng": s} for s in self._rng_states(range(n))]
        else:
            starts = [{"seed": s} if s is not None else None for s in seeds]
            missing = [i for i, s in enumerate(seeds) if s is None]
            for i, state in zip(missing, self._rng_states(missing), strict=True):
                starts[i] = {"rng": state}
        self.episodes += 1
        try:
            observations, infos = self.env.reset(seed=seed, options=options)
        except Exception as error:
            raise self._fault(error, "reset") from error
        self.steps[:] = 0
        self.resetting[:] = False
        self.records = [None if s is None else {**s, "actions": []} for s in starts]
        self.last_obs = tuple(observations)
        return observations, infos

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Step every env, keeping count and recording the replies each episode received."""
        actions = list(actions)
        autoreset = np.flatnonzero(self.resetting).tolist()
        if self.mode == AutoresetMode.NEXT_STEP and autoreset:
            # The episode starting now draws from the RNG as it stands before this step.
            for i, state in zip(autoreset, self._rng_states(autoreset), strict=True):
                self.records[i] = {"rng": state, "actions": []}
        for i in range(self.num_envs):
            if self.resetting[i]:
                self.episodes[i] += 1
                self.steps[i] = 0
            else:
                self.steps[i] += 1
                self._record(i, actions[i])
        try:
            observations, rewards, terminations, truncations, infos = self.env.step(actions)
        except Exception as error:
            raise self._fault(error, "step") from error
        done = np.logical_or(terminations, truncations)
        if self.mode == AutoresetMode.NEXT_STEP:
            self.resetting = done
        elif self.mode == AutoresetMode.SAME_STEP:  # already reset: the next step starts anew
            self.records = [None if d else r for r, d in zip(self.records, done, strict=True)]
            self.episodes[done] += 1
            self.steps[done] = 0
        self.last_obs = tuple(observations)
        return observations, rewards, terminations, truncations, infos

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call a method of every env (forwarded)."""
        return self.env.call(name, *args, **kwargs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Get an attribute of every env (forwarded)."""
        return self.env.get_attr(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set an attribute of every env (forwarded)."""
        self.env.set_attr(name, values)

    # --- state and replay --------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """JSON-ready state: counters, and the record of each episode if all can be replayed."""
        replayable = (
            self.mode == AutoresetMode.NEXT_STEP
            and self.last_obs is not None
            and all(r is not None for r in self.records)
        )
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "episodes": self.episodes.tolist(),
            "steps": self.steps.tolist(),
            "replay": None,
        }
        if replayable:
            state["replay"] = {
                "records": [{**r, "actions": list(r["actions"])} for r in self.records],  # type: ignore[index]
                "resetting": self.resetting.tolist(),
                "fingerprints": [fingerprint(o) for o in self.last_obs],  # type: ignore[union-attr]
            }
        return state

    def restore(self, state: dict[str, Any]) -> tuple[Any, ...] | None:
        """Replay a :meth:`state` into these (fresh) envs; return the observations, or None.

        None means the envs could not be brought to that state (no record, another number of
        envs or vector env type, or a replay that did not arrive at the recorded observations);
        the caller then starts fresh episodes. Counters are restored unless the sizes differ.
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"Expected an env state of version {STATE_VERSION}, got {state.get('version')!r}"
            )
        if len(state["episodes"]) != self.num_envs:
            logger.warning(
                "%d envs cannot restore the state of %d; starting fresh episodes",
                self.num_envs,
                len(state["episodes"]),
            )
            return None
        replay, vec = state["replay"], self.env
        observations = None
        if replay is None:
            logger.warning("The checkpoint holds no replayable env state; starting fresh episodes")
        elif not (isinstance(vec, SyncVectorEnv) and self.mode == AutoresetMode.NEXT_STEP):
            logger.warning(
                "Env states are replayed into a SyncVectorEnv (NEXT_STEP autoreset) only, not %s; "
                "starting fresh episodes",
                type(vec).__name__,
            )
        else:
            observations = self._replay(vec, replay)
        self.episodes[:] = state["episodes"]
        self.steps[:] = state["steps"]
        if observations is not None:
            self.records = [{**r, "actions": list(r["actions"])} for r in replay["records"]]
            self.resetting[:] = replay["resetting"]
            self.last_obs = observations
        return observations

    def _replay(self, vec: SyncVectorEnv, replay: dict[str, Any]) -> tuple[Any, ...] | None:
        observations = []
        for sub, record in zip(vec.envs, replay["records"], strict=True):
            if "seed" in record:
                obs, _ = sub.reset(seed=record["seed"])
            else:
                sub.np_random = _generator(record["rng"])
                obs, _ = sub.reset()
            for action in record["actions"]:
                obs, *_ = sub.step(action)
            observations.append(obs)
        if [fingerprint(o) for o in observations] != replay["fingerprints"]:
            logger.warning(
                "Replaying the envs did not reproduce their recorded observations (an env that "
                "is not deterministic given its seed and actions?); starting fresh episodes"
            )
            return None
        # SyncVectorEnv resets an env on the step after its episode ended (gymnasium 1.x keeps
        # that flag in `_autoreset_envs`); an env whose episode ended last must do so again.
        vec._autoreset_envs = np.array(replay["resetting"], dtype=np.bool_)
        return tuple(observations)

    # --- helpers -----------------------------------------------------------------------------

    def _record(self, i: int, action: Any) -> None:
        record = self.records[i]
        if record is None:
            return
        if not isinstance(action, str) or len(record["actions"]) >= self.max_replay_steps:
            self.records[i] = None  # stays unrecorded until the env's next episode
        else:
            record["actions"].append(action)

    def _rng_states(self, indices: Any) -> list[dict[str, Any]]:
        indices = list(indices)
        if not indices:
            return []
        generators = self.env.get_attr("np_random")
        return [generators[i].bit_generator.state for i in indices]

    def _fault(self, error: Exception, phase: str) -> EnvFault:
        index = _failed_env(self.env, error)
        if index is None and self.num_envs == 1:
            index = 0
        episode = int(self.episodes[index]) if index is not None else 0
        step = int(self.steps[index]) if index is not None and phase == "step" else 0
        if index is not None and phase == "step" and self.resetting[index]:
            phase = "reset"  # NEXT_STEP: this env was being reset within the step
        return EnvFault(index, phase, episode, step, error)


def rollout_state(envs: TrackedVectorEnv, collector: Any) -> dict[str, Any]:
    """JSON-ready state of a run's envs (:meth:`TrackedVectorEnv.state`) and its collector."""
    state = envs.state()
    state["collector"] = {
        "started": collector.observations is not None,
        "resetting": collector.resetting.tolist(),
        "returns": collector.tally.returns.tolist(),
        "lengths": collector.tally.lengths.tolist(),
        "invalid": collector.tally.invalid.tolist(),
        "reports_success": collector.tally.reports_success,
    }
    if hasattr(collector, "rounds"):  # seed-shared groups: the rounds played so far
        state["collector"]["group"] = collector.state()
    return state


def restore_rollout(
    envs: TrackedVectorEnv, collector: Any, saved: dict[str, Any] | None, fresh_seed: int
) -> None:
    """Replay the envs to a :func:`rollout_state`, else start fresh episodes from ``fresh_seed``.

    A state saved before the first rollout leaves the envs alone: that rollout resets them.
    A :class:`~textgym_agents.ppo.groups.GroupRolloutCollector` is never mid-round at a
    checkpoint, so it needs no replay: it goes on with the next round's seeds.
    """
    if hasattr(collector, "rounds"):
        group = saved["collector"].get("group") if saved is not None else None
        if group is not None:
            collector.load_state(group)
            collector.tally.reports_success = bool(saved["collector"]["reports_success"])  # type: ignore[index]
        else:
            collector.seed = fresh_seed
        return
    if saved is not None and not saved["collector"]["started"]:
        return
    observations = envs.restore(saved) if saved is not None else None
    if observations is None:
        collector.reset(seed=fresh_seed)
        return
    counters = saved["collector"]  # type: ignore[index]
    collector.observations = observations
    collector.resetting[:] = counters["resetting"]
    collector.tally.returns[:] = counters["returns"]
    collector.tally.lengths[:] = counters["lengths"]
    collector.tally.invalid[:] = counters["invalid"]
    collector.tally.reports_success = bool(counters["reports_success"])


def _generator(state: dict[str, Any]) -> np.random.Generator:
    bit_generator = getattr(np.random, state["bit_generator"])()
    bit_generator.state = state
    return np.random.Generator(bit_generator)


def _failed_env(vec: VectorEnv, error: BaseException) -> int | None:
    """The index of the env whose exception ``error`` is, if the vector env lets us tell."""
    vec = vec.unwrapped
    if isinstance(vec, SyncVectorEnv):
        # SyncVectorEnv loops over its envs with `i`: the frame that raised holds the index.
        codes = {SyncVectorEnv.step.__code__, SyncVectorEnv.reset.__code__}
        tb = error.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code in codes and isinstance(tb.tb_frame.f_locals.get("i"), int):
                return int(tb.tb_frame.f_locals["i"])
            tb = tb.tb_next
        return None
    pipes = getattr(vec, "parent_pipes", None)
    if isinstance(vec, gym.vector.AsyncVectorEnv) and pipes is not None:
        # AsyncVectorEnv closes the pipe of each worker that reported an error.
        closed = [i for i, pipe in enumerate(pipes) if pipe is None]
        return closed[0] if closed else None
    return None
