"""``PPOTrainer``, the algorithm: one update reads top to bottom, like cleanrl's ``ppo.py``.

1. :meth:`~PPOTrainer.collect` plays ``config.num_steps`` steps of every env into a buffer;
2. :meth:`~PPOTrainer.score` adds log-probs (policy, reference) and values;
3. :meth:`~PPOTrainer.compute_advantages` runs turn-level GAE (new estimators plug in here);
4. :meth:`~PPOTrainer.optimise` runs epochs × minibatches of clipped PPO steps.

:meth:`~PPOTrainer.update` is 2-4 on any buffer, a hand-filled one too; the driver
(:class:`~textgym_agents.ppo.run.TrainingRun`) loops them and writes the run directory.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from textgym.episodes import Episode
from textgym_agents import distributed
from textgym_agents.exceptions import NonFiniteUpdateError
from textgym_agents.model.gradient_checkpointing import enable_gradient_checkpointing
from textgym_agents.model.memory import release_memory
from textgym_agents.ppo import core
from textgym_agents.ppo.assembly import (
    make_collector,
    make_kl_controller,
    make_optimizer,
    scale_learning_rates,
)
from textgym_agents.ppo.buffer import RolloutBuffer, Turn
from textgym_agents.ppo.choice_credit import ChoiceReturns
from textgym_agents.ppo.estimators import assign_critic_free
from textgym_agents.ppo.novelty import VisitCounts
from textgym_agents.ppo.rollout import as_vector_env, cap_episode_turns
from textgym_agents.ppo.run import TrainingRun
from textgym_agents.ppo.self_imitation import SCALE_FLOOR, SelfImitationReplay
from textgym_agents.ppo.steps import (
    STEP_STATS,
    VALUE_STATS,
    bootstrap_values,
    chained_order,
    keep_old_scores,
    minibatch_loss,
    minibatches,
    score_inputs,
    skip_nonfinite_step,
)
from textgym_agents.ppo.tracked import TrackedVectorEnv
from textgym_agents.tracking import rollout_stats
from textgym_agents.tracking.episode_samples import sample_episodes

__all__ = ["NonFiniteUpdateError", "PPOTrainer"]

logger = logging.getLogger(__name__)


class PPOTrainer:
    """Trains a :class:`~textgym_agents.PPOPolicy` by PPO on a text env.

    An optimizer step whose loss or gradient is not finite (NaN or inf) is skipped with a
    warning and counted (``train/nonfinite_steps``, ``train/nonfinite_total``); after
    ``max_nonfinite_updates`` updates in a row with such a step, :meth:`update` raises
    :class:`NonFiniteUpdateError`. An exception inside an env becomes an
    :class:`~textgym_agents.ppo.tracked.EnvFault` naming the env, episode and step.

    Training always ends: every env gets a turn cap (``config.max_episode_turns``, see
    :func:`~textgym_agents.ppo.rollout.cap_episode_turns`) that cuts an episode the env never
    ends, and a warning says when ``stall_warning_updates`` updates (then twice, four times
    as many...) have passed without a finished episode.

    Under ``accelerate launch`` with N processes (:func:`~textgym_agents.distributed.current`),
    each process plays its own envs (seeds shifted by rank), the gradient is the mean over all
    processes' minibatches, and the metrics, episode counts and stopping decisions are global;
    see docs/scaling.md.

    Example:
        >>> import gymnasium as gym, textgym
        >>> from textgym_agents import PPOConfig, PPOPolicy
        >>> from textgym_agents.testing import tiny_model
        >>> policy = PPOPolicy(*tiny_model(), config=PPOConfig(num_steps=2, max_new_tokens=4))
        >>> trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=2))
        >>> buffer = trainer.collect()
        >>> metrics = trainer.update(buffer)
        >>> math.isfinite(metrics["loss/policy"])
        True
    """

    def __init__(
        self,
        policy: Any,
        envs: Any = None,
        *,
        output_dir: str | Path | None = None,
        max_nonfinite_updates: int = 3,
        anchor_key: Callable[[Any], Hashable] | None = None,
        stall_warning_updates: int = 10,
    ) -> None:
        """Create the trainer.

        Args:
            policy: The :class:`~textgym_agents.PPOPolicy` to train (its config is used).
            envs: A text env or vector env; None when every buffer is filled by hand. It is
                wrapped in a :class:`~textgym_agents.ppo.tracked.TrackedVectorEnv`
                (``trainer.envs``), which counts episodes and records what resuming replays;
                the envs of a single env or ``SyncVectorEnv`` are wrapped in place in an
                :class:`~textgym_agents.ppo.rollout.EpisodeTurnCap` of
                ``config.max_episode_turns``.
            output_dir: Run directory for metrics, checkpoints and plots (None: no files).
            max_nonfinite_updates: Stop (raise :class:`NonFiniteUpdateError`) after this many
                updates in a row that each had an optimizer step with a non-finite loss or
                gradient (those steps are skipped either way).
            anchor_key: GiGPO: maps an observation to its anchor key (default:
                :func:`~textgym_agents.ppo.groups.default_anchor`, the current observation's
                text); pass one for envs whose text hides part of the state.
            stall_warning_updates: Warn after this many updates in a row without a finished
                episode (again after twice, four times... as many).
        """
        for name, value in [
            ("max_nonfinite_updates", max_nonfinite_updates),
            ("stall_warning_updates", stall_warning_updates),
        ]:
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.process = process = distributed.current()
        distributed.share_policy(process, policy)  # same device layout and starting weights
        self.policy = policy
        self.config = config = policy.config
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(policy.model)
        self.envs = None
        self.turn_capped = False  # whether config.max_episode_turns applies to the envs
        if envs is not None:
            vector = as_vector_env(envs)
            self.turn_capped = cap_episode_turns(vector, config.max_episode_turns)
            self.envs = TrackedVectorEnv(vector)
        self.collector = None
        if self.envs is not None:
            self.collector = make_collector(self.envs, config, process, anchor_key)
        self.optimizer = make_optimizer(policy, config)
        self.kl_ctl = make_kl_controller(config)
        # The entropy bonus's weight (fixed, or steered to config.entropy_target), checkpointed.
        self.ent_ctl = core.EntropyController(config.ent_coef, config.entropy_target)
        # The novelty bonus's visit counts (config.novelty_bonus), kept by checkpoints.
        self.novelty = VisitCounts(config.novelty_bonus) if config.novelty_bonus > 0 else None
        # The all-choices returns table (config.all_choices), kept by checkpoints too.
        self.choice_returns = (
            ChoiceReturns(config.all_choices_window) if config.all_choices else None
        )
        # Self-imitation's kept turns (config.self_imitation), kept by checkpoints too.
        self.replay = (
            SelfImitationReplay(config.self_imitation_capacity) if config.self_imitation else None
        )
        # Without a critic, self-imitation's values: mean returns-to-go per observation, from
        # the all-choices table where there is one, else from this one (kept by checkpoints).
        self.state_returns = None
        if self.replay is not None and not config.uses_critic and self.choice_returns is None:
            self.state_returns = ChoiceReturns(config.all_choices_window)
        # What the last batch's advantages were scaled by: whitening's (GAE), else the spread
        # of self-imitation's R - V (critic-free replay).
        self.advantage_scale = 1.0
        self.rng = np.random.default_rng(process.seed(config.seed))
        # Sampling draws from torch's global generator: seeded here, as TRL's and SB3's
        # trainers do, so collect()/update() loops with one seed sample the same replies.
        torch.manual_seed(process.seed(config.seed))
        # The main process's choice (a default name holds the time), so all agree on files.
        output_dir = process.broadcast_text(None if output_dir is None else str(output_dir))
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.update_step = 0
        self.episodes = 0
        self.turns = 0
        self.max_nonfinite_updates = max_nonfinite_updates
        self.nonfinite_streak = 0  # updates in a row with a skipped (non-finite) step
        self.nonfinite_total = 0  # optimizer steps skipped over the run
        self.stall_warning_updates = stall_warning_updates
        self.updates_without_episode = 0  # step() calls in a row that finished no episode
        self.turns_without_episode = 0  # turns those updates played
        self.callbacks: list[Any] = []  # objects with on_update(...), see add_callback
        self.games: list[tuple[str | None, str]] = []  # (opponent, outcome) of the last update
        # A few of the last update's episodes, turn by turn, for the run's episodes.jsonl.
        self.episode_samples: list[dict[str, Any]] = []

    def add_callback(self, callback: Any) -> None:
        """Call ``callback.on_update(trainer, metrics, episodes=..., games=...)`` after each update.

        It runs once the update's metrics are computed and before they are logged, so it may
        add metrics; ``episodes`` are this process's finished episodes, ``games`` every
        process's ``(opponent, outcome)`` pairs. A :class:`~textgym_agents.selfplay.
        SelfPlayPool` refreshes its snapshots and ratings this way.
        """
        if not callable(getattr(callback, "on_update", None)):
            raise TypeError(f"Expected an object with an on_update method, got {callback!r}")
        self.callbacks.append(callback)

    # --- rollout -----------------------------------------------------------------------------

    def collect(self, buffer: RolloutBuffer | None = None) -> RolloutBuffer:
        """Run ``config.num_steps`` steps of every env and return the filled buffer."""
        if self.collector is None:
            raise ValueError("This trainer has no envs; fill a RolloutBuffer and call update()")
        buffer = buffer if buffer is not None else RolloutBuffer()
        with self.policy.carrying_caches():  # the weights stay put during a rollout
            self.collector.collect(self.policy, self.config.num_steps, buffer)
            if self.config.uses_critic and self.config.score_in_update:
                # Unfinished episodes' next prompts continue the rows generation just ran.
                cut = [t for t in buffer.turns() if t.bootstrap_ids and t.bootstrap_value is None]
                values = self.policy.carried_values([t.bootstrap_ids for t in cut])
                if values is not None:
                    for turn, value in zip(cut, values, strict=True):
                        turn.bootstrap_value = value
        return buffer

    # --- update: score → compute_advantages → optimise ----------------------------------------

    def update(
        self, buffer: RolloutBuffer, episodes: list[Episode] | None = None
    ) -> dict[str, float]:
        """Score the buffer, compute advantages and run the PPO epochs; return metrics.

        Args:
            buffer: A filled buffer (from :meth:`collect` or by hand); cleared afterwards.
            episodes: Episodes that finished during the rollout, for the ``env/`` metrics.

        Raises:
            NonFiniteUpdateError: This update and the ``max_nonfinite_updates - 1`` before it
                each skipped an optimizer step with a non-finite loss or gradient.
        """
        turns = buffer.turns()
        if not turns:
            raise ValueError("The rollout buffer is empty")
        start = time.perf_counter()
        # One order for scoring and the first epoch: both then run the same forward passes.
        order = self._order(turns)
        leave_first = self.config.score_in_update
        if self._advantages_need_scores:
            self.score(turns, order, leave_first=leave_first)
            self.compute_advantages(buffer)
            trained, order = self._informative(turns, order)
            played = len(trained)
            if self.replay is not None:
                trained, order = self._with_replay(buffer, trained, order)
        else:  # critic-free without a KL penalty: advantages from rewards alone, then score
            self.compute_advantages(buffer)
            trained, order = self._informative(turns, order)
            self.score(trained, order, leave_first=leave_first)
            played = len(trained)
            if self.replay is not None:
                trained, order = self._with_replay(buffer, trained, order)
        score_s = time.perf_counter() - start
        start = time.perf_counter()
        stats = self.optimise(trained, order)
        release_memory()  # the update's activations, freed between live blocks (memory.py)
        update_s = time.perf_counter() - start
        stats["train/trained_turns"] = self.process.sum([len(trained)])[0]
        if self.replay is not None:
            stats["train/replayed_turns"] = self.process.sum([len(trained) - played])[0]
        if self.novelty is not None:
            stats["train/novelty_bonus"] = float(np.mean([t.bonus for t in turns]))
        metrics = self._update_metrics(turns, episodes or [], stats, score_s, update_s)
        self.episode_samples = self._sample_episodes(buffer)
        buffer.clear()
        for callback in self.callbacks:  # before the driver logs: they may add metrics
            callback.on_update(self, metrics, episodes=episodes or [], games=self.games)
        if self.nonfinite_streak >= self.max_nonfinite_updates:
            first = self.update_step - self.nonfinite_streak + 1
            raise NonFiniteUpdateError(
                f"Updates {first}-{self.update_step} each had a non-finite loss or gradient "
                f"({self.nonfinite_streak} in a row, max_nonfinite_updates="
                f"{self.max_nonfinite_updates}; {self.nonfinite_total} optimizer steps skipped "
                "in all), so training stopped. Look for NaN/inf rewards from the env, a "
                "learning rate that is too high, or weights that are already non-finite.",
                metrics,
            )
        return metrics

    @torch.no_grad()
    def score(self, turns: list[Turn], order: np.ndarray, *, leave_first: bool = False) -> None:
        """Fill in what the update needs from the rollout policy, the reference and the critic.

        Sets, per turn, ``old_logps`` (shape ``(scored_tokens,)``, CPU: log-probs under the
        current weights), ``value`` (the critic's value of the prompt) and ``ref_logps``
        (``(scored_tokens,)``: under the base model without the adapter); and
        ``bootstrap_value`` for turns with ``bootstrap_ids``. Turns the rollout already scored
        (choice decoding) keep their ``old_logps`` and ``value`` unless
        ``config.reuse_rollout_scores`` is False or a KL penalty is on. Without a KL penalty
        the reference is never used, so ``ref_logps is old_logps``.

        Args:
            turns: The buffer's turns (``buffer.turns()``).
            order: A permutation of ``range(len(turns))``, shape ``(N,)``: the minibatch order
                of the first epoch, so scoring runs the same forward passes.
            leave_first: Leave the turns of the first minibatch that the rollout did not score
                to :meth:`optimise` with this ``order``: its first pass runs at these weights
                and reads their old log-probs (their values, if the critic needs them, came
                from the rollout, else they are scored here). No effect with a KL penalty.
                :meth:`update` sets it from ``config.score_in_update``.
        """
        policy = self.policy
        # Turns the rollout scored (choices, same weights) keep their log-probs and values,
        # unless a KL penalty needs the reference pass: then both come from one layout, so the
        # KL before any update is exactly 0.
        rescore = not self.config.reuse_rollout_scores or self._uses_kl
        critic = self.config.uses_critic  # critic-free: the value head is never run
        minibatches = list(self._minibatches(order, turns))
        first = set()
        if leave_first and not self._uses_kl and minibatches:
            first = {i for micro in minibatches[0] for i in micro}

        def needs_pass(turn: Turn, i: int) -> bool:
            if critic and turn.value is None:
                return True
            if turn.old_logps is None:
                return i not in first
            return rescore

        for minibatch in minibatches:
            # As in the update: the minibatch's shared prefix runs once (the same layout).
            with policy.sharing_prefix([turns[i].prompt_ids for m in minibatch for i in m]):
                self._score_minibatch(turns, minibatch, needs_pass, critic)
        if critic:
            bootstrap_values(policy, turns, self.config.micro_batch_size)

    def _score_minibatch(
        self,
        turns: list[Turn],
        minibatch: list[list[int]],
        needs_pass: Callable[[Turn, int], bool],
        critic: bool,
    ) -> None:
        """:meth:`score` of one minibatch's micro-batches (the turns ``needs_pass`` names)."""
        policy = self.policy
        for micro in minibatch:
            todo = [i for i in micro if needs_pass(turns[i], i)]
            if todo:
                scores = policy.score(**score_inputs(turns, todo), values=critic)
                for row, i in enumerate(todo):
                    keep_old_scores(turns[i], scores, row)
                    if critic:
                        turns[i].value = float(scores.values[row])
            # Without a KL penalty the reference is never used: skip its forward pass.
            if not self._uses_kl:
                for i in micro:
                    turns[i].ref_logps = turns[i].old_logps
                continue
            ref = policy.score(**score_inputs(turns, micro), adapter=False)
            for row, i in enumerate(micro):
                turns[i].ref_logps = ref.logps[row, : turns[i].scored_tokens].cpu()

    def compute_advantages(self, buffer: RolloutBuffer) -> None:
        """Advantages of the scored buffer; sets each turn's ``kl``, ``advantage``, ``returns``.

        The reward of a turn is the env reward minus ``beta`` (the KL controller's value) times
        its KL to the reference. ``config.advantage_estimator="gae"``: turn-level GAE,
        ``returns = advantages + values``, and with ``config.whiten_advantages`` the advantages
        are whitened over every process's turns. The critic-free estimators
        (:func:`~textgym_agents.ppo.estimators.assign_critic_free`) work on the buffer's whole
        episodes; ``returns`` is then each turn's return-to-go.
        """
        config = self.config
        beta = float(self.kl_ctl.value)
        if self.novelty is not None:
            self.novelty.assign(buffer.episodes())
        if self.choice_returns is not None:
            self.choice_returns.assign(buffer.episodes(), config.gamma, config.normalize_by_std)
        if self.state_returns is not None:
            self.state_returns.record_episodes(buffer.episodes(), config.gamma)
        if not config.uses_critic:
            if self._uses_kl:  # else every turn's KL is 0 (its reference is itself)
                buffer.compute_kl(config.kl_estimator)
            assign_critic_free(buffer.episodes(), config, beta, gather=self._gather_array)
            return
        kl_estimator = config.kl_estimator if self._uses_kl else None
        buffer.compute_advantages(beta, config.gamma, config.lam, kl_estimator)
        all_turns = buffer.turns()
        self.advantage_scale = 1.0
        if not config.whiten_advantages:
            return
        # Whitened over every process's turns, as one process would over the whole batch.
        advantages, start = self.process.gather(torch.tensor([t.advantage for t in all_turns]))
        if len(advantages) > 1:
            ones = torch.ones_like(advantages)
            self.advantage_scale = float(torch.sqrt(core.masked_var(advantages, ones) + 1e-8))
            whitened = core.masked_whiten(advantages, ones)
            mine = whitened[start : start + len(all_turns)]
            for turn, advantage in zip(all_turns, mine.tolist(), strict=True):
                turn.advantage = advantage

    def optimise(self, turns: list[Turn], order: np.ndarray) -> dict[str, float]:
        """``config.num_epochs`` epochs × minibatches of clipped PPO steps; return step means.

        Args:
            turns: Turns with advantages (after :meth:`score` and :meth:`compute_advantages`).
            order: The first epoch's minibatch order, the one :meth:`score` used; later epochs
                draw a fresh permutation from ``self.rng``.

        Returns:
            The :data:`~textgym_agents.ppo.steps.STEP_STATS` and ``policy/grad_norm`` averaged
            over the optimizer steps taken, ``train/epochs_done``, ``train/early_stop`` (1.0 if
            ``approx_kl`` passed ``config.target_kl``) and ``train/nonfinite_steps``.
        """
        config = self.config
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        sums: dict[str, float] = {}
        count = skipped = 0
        stop = False
        # Every process takes as many optimizer steps as the one with the most minibatches;
        # one that has run out joins each remaining step with zero gradients.
        (steps,) = self.process.max([math.ceil(len(turns) / config.minibatch_size)])
        if steps == 0:  # nothing to train on (drop_zero_advantage): the weights stay put
            return {"train/epochs_done": 0, "train/early_stop": 0.0, "train/nonfinite_steps": 0}
        for epoch in range(config.num_epochs):
            epoch_order = order if epoch == 0 else self._order(turns)
            minibatches = list(self._minibatches(epoch_order, turns))
            for k, minibatch in enumerate(minibatches + [[]] * (steps - len(minibatches))):
                # Still at the rollout's weights: turns not scored yet read their own old
                # log-probs from this pass (config.score_in_update).
                step_stats = self._gradient(turns, minibatch, params, first_pass=epoch == k == 0)
                if skip_nonfinite_step(step_stats, self.optimizer, self.update_step + 1, epoch + 1):
                    skipped += 1
                    continue
                self.optimizer.step()
                for key, value in step_stats.items():
                    sums[key] = sums.get(key, 0.0) + value
                count += 1
                if (
                    config.target_kl is not None
                    and step_stats["policy/approx_kl"] > config.target_kl
                ):
                    stop = True
                    break
            if stop:
                break
        metrics = {key: value / max(count, 1) for key, value in sums.items()}
        metrics["train/epochs_done"] = epoch + 1
        metrics["train/early_stop"] = float(stop)
        metrics["train/nonfinite_steps"] = skipped
        return metrics

    # --- helpers of the update -----------------------------------------------------------------

    def _gather_array(self, values: np.ndarray) -> tuple[np.ndarray, int]:
        every, start = self.process.gather(torch.tensor(values, dtype=torch.float64))
        return every.numpy(), start

    @property
    def _uses_kl(self) -> bool:
        return self.config.adaptive_kl or self.config.kl_coef > 0

    @property
    def _advantages_need_scores(self) -> bool:
        """GAE needs values, a KL penalty log-probs; critic-free advantages need only rewards."""
        return self.config.uses_critic or self._uses_kl

    def _informative(self, turns: list[Turn], order: np.ndarray) -> tuple[list[Turn], np.ndarray]:
        """The turns the update trains on, and ``order`` restricted to them (renumbered).

        With ``config.drop_zero_advantage`` and a critic-free estimator, turns whose advantage
        is exactly 0 carry no policy gradient: they are left out (their entropy term would
        otherwise act alone); else every turn is kept. A turn credited over all its choices
        (``config.all_choices``) is kept while any choice's advantage is nonzero, and always
        under ``choice_update="mirror"`` while any turn of any process has one: there the fit
        holds its log-probs where they were, so weights shared with the turns that move do not
        drag the choice of an observation the run has no comparison for yet.
        """
        if self.config.uses_critic or not self.config.drop_zero_advantage:
            return turns, order
        credited = [_credited(turn) for turn in turns]
        moving = self.config.choice_update == "mirror" and self.process.max([int(any(credited))])[0]
        if moving:
            held = [turn.choice_advantages is not None for turn in turns]
            credited = [c or h for c, h in zip(credited, held, strict=True)]
        keep = [i for i, c in enumerate(credited) if c]
        if len(keep) == len(turns):
            return turns, order
        renumber = {old: new for new, old in enumerate(keep)}
        kept_order = np.array([renumber[i] for i in order.tolist() if i in renumber], dtype=int)
        return [turns[i] for i in keep], kept_order

    def _with_replay(
        self, buffer: RolloutBuffer, trained: list[Turn], order: np.ndarray
    ) -> tuple[list[Turn], np.ndarray]:
        """``trained`` and ``order`` with self-imitation's replayed turns after them.

        Draws ``config.self_imitation`` kept turns (kept before this rollout's: those train
        on-policy now), scores them at the current weights and keeps those whose return R
        beats the value V expected now, with advantage ``(R - V) / scale`` and ``returns = R``;
        then keeps this rollout's better-than-expected turns for later updates. V is the
        critic's value (GAE), else the mean return-to-go from the turn's observation over the
        run's recent turns (the all-choices table or ``state_returns``, which already hold
        this rollout's). ``scale`` is what whitening divided the batch's advantages by (GAE),
        else the spread of this rollout's ``R - V``, at least
        :data:`~textgym_agents.ppo.self_imitation.SCALE_FLOOR`, so a batch whose advantages
        hardly differ does not blow the replayed ones up.
        The replayed turns come last in the first epoch's order: turns :meth:`score` left to the
        first pass (``score_in_update``) still get their old log-probs there, at the rollout's
        weights.
        """
        config = self.config
        table = None if config.uses_critic else self.state_returns or self.choice_returns

        def value_of(turn: Turn) -> float | None:
            if table is None:
                return turn.value
            return None if turn.anchor is None else table.value(turn.anchor)

        replayed = self.replay.sample(config.self_imitation, self.rng)
        gaps = self.replay.add(buffer.episodes(), config.gamma, value_of)
        if table is not None:
            spread = np.asarray(self.process.gather(torch.tensor(gaps))[0])
            self.advantage_scale = float(spread.std()) if len(spread) > 1 else 1.0
        scale = max(self.advantage_scale, SCALE_FLOOR)
        if replayed:
            self.score(replayed, np.arange(len(replayed)))
            for turn in replayed:
                turn.value = value_of(turn)
            replayed = [t for t in replayed if t.value is not None and t.returns > t.value]
        for turn in replayed:
            turn.advantage = (turn.returns - turn.value) / scale
        if not replayed:
            return trained, order
        extra = np.arange(len(trained), len(trained) + len(replayed))
        return trained + replayed, np.concatenate([order, extra])

    def _sample_episodes(self, buffer: RolloutBuffer) -> list[dict[str, Any]]:
        """``config.sample_episodes`` of the buffer's episodes, where a run directory is written.

        Drawn from a generator of their own (seeded by the update), so training's draws and a
        resumed run's samples are those of an uninterrupted run.
        """
        k = self.config.sample_episodes
        if not k or self.output_dir is None or not self.process.is_main:
            return []
        rng = np.random.default_rng([self.config.seed, self.update_step])
        return sample_episodes(
            buffer.streams, k, rng, update=self.update_step, episodes_done=self.episodes
        )

    def _minibatches(self, order: np.ndarray, turns: list[Turn]) -> Iterator[list[list[int]]]:
        config = self.config
        sizes = (config.minibatch_size, config.micro_batch_size, config.micro_batch_tokens)
        return minibatches(order, turns, *sizes, pack=config.pack_turns)

    def _order(self, turns: list[Turn]) -> np.ndarray:
        """A random order of the turns; with ``pack_turns``, chained turns stay together."""
        if not self.config.pack_turns:
            return self.rng.permutation(len(turns))
        return chained_order(self.rng, turns)

    def _gradient(
        self,
        turns: list[Turn],
        minibatch: list[list[int]],
        params: list[torch.Tensor],
        *,
        first_pass: bool = False,
    ) -> dict[str, float]:
        """The clipped gradient of one minibatch (mean over every process's) and its stats."""
        self.optimizer.zero_grad(set_to_none=True)
        # Token- and turn-level means over every process's minibatch of this step.
        tokens = sum(turns[i].scored_tokens for micro in minibatch for i in micro)
        tokens, size = self.process.sum([tokens, sum(len(micro) for micro in minibatch)])
        step_stats = minibatch_loss(
            self.policy,
            self.config,
            turns,
            minibatch,
            tokens,
            size,
            self.ent_ctl.value,
            first_pass=first_pass,
        )
        keys = [k for k in STEP_STATS if self.config.uses_critic or not k.startswith(VALUE_STATS)]
        step_stats = self.process.sync_gradients(params, step_stats, keys)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        step_stats["policy/grad_norm"] = float(grad_norm)
        return step_stats

    def _update_metrics(
        self,
        turns: list[Turn],
        episodes: list[Episode],
        stats: dict[str, float],
        score_s: float,
        update_s: float,
    ) -> dict[str, float]:
        """Advance the counters and the KL controller; the update's metrics (global)."""
        table, _ = self.process.gather(rollout_stats.turn_table(turns))  # every process's turns
        mean_kl = float(np.mean(table[:, -1].numpy()))
        self.kl_ctl.update(mean_kl, len(table))  # a non-finite KL leaves beta unchanged
        # An update without an optimizer step has no entropy: the weight stays.
        self.ent_ctl.update(stats.get("policy/entropy", math.nan))
        self.update_step += 1
        skipped = int(stats.pop("train/nonfinite_steps"))
        self.nonfinite_total += skipped
        self.nonfinite_streak = self.nonfinite_streak + 1 if skipped else 0
        self.turns += len(table)
        metrics = {
            "train/update": self.update_step,
            "env/turns": self.turns,
            **rollout_stats.turn_metrics(table, values=self.config.uses_critic),
            "objective/kl_coef": float(self.kl_ctl.value),
            "objective/ent_coef": float(self.ent_ctl.value),
            "time/score_s": score_s,
            "time/update_s": update_s,
            "train/nonfinite_steps": skipped,
            "train/nonfinite_total": self.nonfinite_total,
            **stats,
        }
        if self._uses_kl:  # else the reference was not scored
            metrics["objective/kl"] = mean_kl
        rows, _ = self.process.gather(rollout_stats.episode_table(episodes))  # every process's
        self.episodes += len(rows)
        metrics["env/episodes"] = self.episodes
        metrics.update(rollout_stats.episode_metrics(rows))
        self.games = rollout_stats.gathered_games(self.process, episodes)  # every process's
        metrics.update(rollout_stats.game_metrics(self.games))
        return metrics

    # --- the loop ------------------------------------------------------------------------------

    def anneal_learning_rates(self, total_episodes: int, done: int | None = None) -> float:
        """Scale the learning rates by ``1 - done / total_episodes`` (``anneal_lr``).

        ``done`` is the episodes played before the coming update (default: the trainer's
        count). Recomputed from the config each update, so a resumed run anneals as an
        uninterrupted one does. Returns the LoRA learning rate now in use.
        """
        done = self.episodes if done is None else done
        fraction = max(0.0, 1.0 - done / total_episodes)
        return scale_learning_rates(self.optimizer, self.config, fraction)

    def step(self) -> dict[str, float]:
        """One iteration: collect a rollout and update on it."""
        turns_before = self.turns
        start = time.perf_counter()
        try:
            buffer = self.collect()
        except Exception:
            self.process.stop_check(failed=True)  # the other processes stop with this one
            raise
        self.process.stop_check()  # all stop here if one failed or holds Ctrl-C/SIGTERM
        rollout_s = time.perf_counter() - start
        episodes_before = self.episodes
        metrics = self.update(buffer, self.collector.drain())
        self._check_progress(self.episodes > episodes_before, self.turns - turns_before)
        metrics["time/rollout_s"] = rollout_s
        total = rollout_s + metrics["time/score_s"] + metrics["time/update_s"]
        metrics["throughput/turns_per_s"] = (self.turns - turns_before) / max(total, 1e-9)
        return metrics

    def _check_progress(self, finished: bool, turns: int) -> None:
        """Count updates without a finished episode; warn after N of them, 2N, 4N, ..."""
        if finished:
            self.updates_without_episode = self.turns_without_episode = 0
            return
        self.updates_without_episode += 1
        self.turns_without_episode += turns
        stalled = self.updates_without_episode
        times, rest = divmod(stalled, self.stall_warning_updates)
        if times == 0 or rest or times & (times - 1):
            return  # warn at N, 2N, 4N, 8N, ... updates
        if not self.process.is_main:  # the counts are global: one process says it
            return
        if self.turn_capped:
            how = f"cuts an episode after max_episode_turns={self.config.max_episode_turns} turns"
        else:
            how = "cannot cut these envs' episodes (not a single env or SyncVectorEnv)"
        logger.warning(
            "No episode has finished in the last %d updates (%d turns). Training runs until "
            "total_episodes episodes have finished; the trainer %s. Check that the env ends "
            "its episodes (a goal, a time limit), or lower max_episode_turns.",
            stalled,
            self.turns_without_episode,
            how,
        )

    def train(
        self,
        total_episodes: int,
        *,
        resume_from: str | Path | None = None,
        callback: Callable[[dict[str, float]], Any] | None = None,
    ) -> dict[str, float]:
        """Run updates until ``total_episodes`` episodes have finished; return the last metrics.

        A convenience over the driver, :class:`~textgym_agents.ppo.run.TrainingRun`, which
        writes the run directory (metrics, checkpoints, resume) and handles stop signals.
        ``callback`` is called with each update's logged metrics (returning False stops), or,
        if it has an ``on_update`` method (a self-play pool), added with :meth:`add_callback`.
        """
        if callable(getattr(callback, "on_update", None)):
            if callback not in self.callbacks:
                self.add_callback(callback)
            callback = None
        return TrainingRun(self).run(total_episodes, resume_from=resume_from, callback=callback)


def _credited(turn: Turn) -> bool:
    """Whether a turn carries a policy gradient (a nonzero advantage, for any of its choices)."""
    if turn.choice_advantages is not None:
        return any(a != 0.0 for a in turn.choice_advantages)
    return turn.advantage != 0.0
