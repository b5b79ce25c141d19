"""LlamaGym's ``Agent`` API on textgym's PPO: subclass, write three methods, play, train.

``act`` / ``assign_reward`` / ``terminate_episode`` record turns into the same
:class:`~textgym_agents.ppo.buffer.RolloutBuffer` that :class:`PPOTrainer` updates on, so there
is one PPO implementation. A subclass that names its replies (:meth:`Agent.action_replies`)
gets choice decoding: every reply is one of them, valid from the first hand, and
``extract_action`` is not needed; otherwise the model writes free text that ``extract_action``
parses. :meth:`Agent.text_env` turns the same three methods into a
formatter and parser for :class:`~textgym.TextEnvWrapper`, to train with ``PPOPolicy`` on
vector envs.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import torch

from textgym import FunctionParser, TextEnvWrapper
from textgym.conversation import Conversation, Messages
from textgym_agents.policy import PPOPolicy
from textgym_agents.ppo.buffer import RolloutBuffer, Turn
from textgym_agents.ppo.config import GROUP_ESTIMATORS, PPOConfig
from textgym_agents.ppo.defaults import env_defaults
from textgym_agents.ppo.rollout import read_generation
from textgym_agents.ppo.trainer import PPOTrainer

__all__ = ["Agent"]

logger = logging.getLogger(__name__)


class Agent(ABC):
    """An LLM agent that keeps its episode's conversation and learns by PPO.

    Example:
        >>> import gymnasium as gym
        >>> from textgym_agents.testing import tiny_model
        >>> class BlackjackAgent(Agent):
        ...     def get_system_prompt(self):
        ...         return "You are an expert blackjack player."
        ...     def format_observation(self, observation):
        ...         return f"Your current total is {observation[0]}"
        ...     def extract_action(self, response):
        ...         return 0 if "stay" in response else 1
        >>> model, tokenizer = tiny_model()
        >>> agent = BlackjackAgent(model, tokenizer, "cpu", batch_size=2, max_new_tokens=4)
        >>> env = gym.make("Blackjack-v1")
        >>> for episode in range(2):
        ...     observation, info = env.reset(seed=episode)
        ...     done = False
        ...     while not done:
        ...         action = agent.act(observation)
        ...         observation, reward, terminated, truncated, info = env.step(action)
        ...         agent.assign_reward(reward)
        ...         done = terminated or truncated
        ...     stats = agent.terminate_episode()
        >>> "loss/policy" in stats
        True
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str | torch.device | None = None,
        *,
        batch_size: int = 8,
        action_space: gym.Space[Any] | None = None,
        default_action: Any = 0,
        invalid_penalty: float = 1.0,
        lora: Any = None,
        total_episodes: int | None = None,
        history: int | None = None,
        **config: Any,
    ) -> None:
        """Wrap a causal LM.

        Args:
            model: A transformers causal LM (a LoRA adapter is attached, the value head is ours).
            tokenizer: Its tokenizer (needs a chat template).
            device: Where to run the model (default: where it already is).
            batch_size: Episodes per PPO update.
            action_space: If given, actions outside it count as invalid.
            default_action: Sent to the env when ``extract_action`` fails or is invalid.
            invalid_penalty: Subtracted from the reward of an invalid turn.
            lora: LoRA settings (a ``peft.LoraConfig`` or a dict of overrides).
            total_episodes: The episodes the loop will play; needed with ``anneal_lr=True``,
                which decays the learning rates linearly to 0 over them, as ``textgym train``
                does over its run.
            history: Past turns of the episode kept in each prompt: None (LlamaGym's) keeps
                them all; 0 shows the current observation alone, which is all a decision
                needs where the observation is the env's whole state (Blackjack).
            **config: :class:`~textgym_agents.PPOConfig` fields (generation and PPO settings);
                those not given come from the same per-env defaults as ``textgym train``
                (:meth:`PPOConfig.for_env <textgym_agents.PPOConfig.for_env>`), with choice
                decoding when :meth:`action_replies` names the replies.
        """
        if device is not None:
            model = model.to(device)
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        replies = self.action_replies()
        if replies is not None and (not isinstance(replies, Mapping) or not replies):
            raise ValueError(
                "action_replies() must return None or a non-empty dict {reply text: env action}, "
                f"got {replies!r}"
            )
        self.replies: dict[str, Any] | None = dict(replies) if replies else None
        if self.replies is None and type(self).extract_action is Agent.extract_action:
            raise TypeError(
                f"{type(self).__name__} must define extract_action() (free text) or "
                "action_replies() (choice decoding)"
            )
        names = list(self.replies) if self.replies else None
        settings = {**env_defaults(names, config), **config}
        ppo_config = PPOConfig(**settings)
        if ppo_config.anneal_lr and not (isinstance(total_episodes, int) and total_episodes >= 1):
            raise ValueError(
                "anneal_lr=True decays the learning rates over the run: give total_episodes "
                f"(an int >= 1, the episodes your loop will play), got {total_episodes!r}"
            )
        self.total_episodes = total_episodes
        if not (history is None or (isinstance(history, int) and history >= 0)):
            raise ValueError(f"history must be None or an int >= 0, got {history!r}")
        self.history = history
        group = ppo_config.advantage_estimator in GROUP_ESTIMATORS
        self.group_size = ppo_config.group_size if group else 1
        if batch_size % self.group_size:
            raise ValueError(
                f"advantage_estimator={ppo_config.advantage_estimator!r} compares consecutive "
                f"episodes in groups of group_size={self.group_size}: batch_size must be a "
                f"multiple of it, got {batch_size}"
            )
        self.policy = PPOPolicy(model, tokenizer, config=ppo_config, lora=lora)
        self.trainer = PPOTrainer(self.policy)
        self.batch_size = batch_size
        self.action_space = action_space
        self.default_action = default_action
        self.invalid_penalty = float(invalid_penalty)
        self.buffer = RolloutBuffer()
        self.episodes_in_buffer = 0
        self._reset_conversation()

    @abstractmethod
    def get_system_prompt(self) -> str:
        """The system prompt of every episode."""

    @abstractmethod
    def format_observation(self, observation: Any) -> str:
        """The user message for an env observation."""

    def action_replies(self) -> Mapping[str, Any] | None:
        """The replies the agent may give, each with its env action; None: free text.

        Override it to train with choice decoding: the model's reply is always one of these
        texts (sampled from its distribution over them), so no turn is invalid and
        :meth:`extract_action` is not called.

        Example:
            >>> class Named(Agent):
            ...     def get_system_prompt(self):
            ...         return "Blackjack. Reply stay or hit."
            ...     def format_observation(self, observation):
            ...         return f"Your total is {observation[0]}."
            ...     def action_replies(self):
            ...         return {"stay": 0, "hit": 1}
            >>> from textgym_agents.testing import tiny_model
            >>> agent = Named(*tiny_model(), batch_size=1)
            >>> agent.act((15, 10, 0)) in (0, 1), agent.policy.config.decoding
            (True, 'choices')
        """
        return None

    def extract_action(self, response: str) -> Any:
        """The env action in the model's reply (raising marks the turn invalid).

        Free-text agents override it; with :meth:`action_replies` the reply's action is looked
        up there (an unknown text raises, so it is recorded invalid). An agent with neither is
        refused at construction.
        """
        return self.replies[response]  # type: ignore[index]

    def act(self, observation: Any) -> Any:
        """Show the observation to the model, record its reply and return the env action.

        The turn's GiGPO anchor (``advantage_estimator="gigpo"``) is the formatted
        observation: turns that saw the same text form a step group across the batch.
        """
        text = self.format_observation(observation)
        self._chat.observe(text)
        choices = [list(self.replies)] if self.replies else None
        generation = self.policy.generate([self._chat.messages()], choices=choices)
        response = generation.texts[0]
        self._chat.answer(response)
        action, invalid = self._extract(response)
        turn = read_generation(
            Turn(generation.prompt_ids[0], generation.response_ids[0], 0.0, invalid=invalid),
            generation,
            0,
        )
        turn.anchor = text
        self.current_turns.append(turn)
        if invalid:
            turn.reward -= self.invalid_penalty
        return action

    def _extract(self, response: str) -> tuple[Any, bool]:
        try:
            action = self.extract_action(response)
        except Exception as e:  # untrusted model text must not end the episode
            logger.debug("extract_action failed on %r: %s", response, e)
            return self.default_action, True
        if self.action_space is not None and not self.action_space.contains(action):
            return self.default_action, True
        return action, False

    def assign_reward(self, reward: float) -> None:
        """Add the env's reward to the last turn."""
        if not self.current_turns:
            raise RuntimeError("assign_reward() needs a turn: call act() first")
        self.current_turns[-1].reward += float(reward)

    def terminate_episode(
        self, truncated: bool = False, observation: Any = None
    ) -> dict[str, float] | None:
        """End the episode; run a PPO update once ``batch_size`` episodes are recorded.

        Args:
            truncated: The episode was cut short (a time limit) rather than finished: its last
                turn is then bootstrapped from the critic's value of the state after it.
            observation: The env's last observation (from the ``env.step`` that truncated),
                which the bootstrap shows the model as :meth:`act` would. Without it the
                bootstrap reads the last prompt and the reply to it: the model has not seen
                the state after its last reply.

        Returns:
            The update's metrics, or None when the batch is not full yet.
        """
        if self.current_turns:
            last = self.current_turns[-1]
            last.truncated, last.terminated = truncated, not truncated
            if truncated and observation is not None:
                self._chat.observe(self.format_observation(observation))
                last.bootstrap_ids = self.policy.encode(self._chat.messages())
            elif truncated:
                last.bootstrap_ids = [*last.prompt_ids, *last.response_ids]
            for turn in self.current_turns:
                if self.group_size > 1:
                    turn.group = self.episodes_in_buffer // self.group_size
                self.buffer.add(self.episodes_in_buffer, turn)
            self.episodes_in_buffer += 1
            self.trainer.episodes += 1
        self._reset_conversation()
        if self.episodes_in_buffer < self.batch_size:
            return None
        lr = None
        if self.policy.config.anneal_lr:  # as textgym train: from the episodes before the batch
            done = self.trainer.episodes - self.episodes_in_buffer
            total: int = self.total_episodes  # type: ignore[assignment]  # checked in __init__
            lr = self.trainer.anneal_learning_rates(total, done)
        stats = self.trainer.update(self.buffer)
        if lr is not None:
            stats["train/learning_rate"] = lr
        self.episodes_in_buffer = 0
        return stats

    @property
    def current_episode_messages(self) -> Messages:
        """The episode's conversation so far: the system prompt, then every turn."""
        return self._chat.messages()

    def _reset_conversation(self) -> None:
        self._chat = Conversation(self.get_system_prompt(), history=self.history)
        self.current_turns: list[Turn] = []

    # --- the agent's model as a textgym Policy (evaluate, record_trajectories) ----------------

    @property
    def wants_choices(self) -> bool:
        """Whether :meth:`act_batch` uses the envs' valid replies (its policy's decoding)."""
        return self.policy.wants_choices

    @property
    def wants_schemas(self) -> bool:
        """Whether :meth:`act_batch` uses the envs' reply schemas (its policy's decoding)."""
        return self.policy.wants_schemas

    def act_batch(
        self,
        batch: Sequence[Messages],
        *,
        choices: Sequence[Sequence[str] | None] | None = None,
        schemas: Sequence[dict[str, Any] | None] | None = None,
        greedy: bool = False,
    ) -> list[str]:
        """Reply to each conversation without recording a turn: :class:`textgym.Policy`.

        With :meth:`text_env`, ``textgym_agents.evaluate(agent, agent.text_env(env))`` and
        ``textgym.record_trajectories(agent.text_env(env), agent, ...)`` play the agent's model
        on the prompts it trains on; :meth:`act` stays the training loop's step.
        """
        return self.policy.act_batch(batch, choices=choices, schemas=schemas, greedy=greedy)

    def text_env(self, env: gym.Env[Any, Any] | str, **wrapper_kwargs: Any) -> TextEnvWrapper:
        """Wrap ``env`` as a text env that prompts and parses exactly like this agent.

        The formatter is :meth:`format_observation`, the parser :meth:`extract_action` and the
        system prompt :meth:`get_system_prompt`; the conversation keeps ``history`` past turns
        (default: the agent's own ``history``, or 16 where it keeps the whole episode). Train
        it with ``PPOPolicy``. With :meth:`action_replies` the env lists those replies
        (``reply_choices()``), so ``evaluate(agent, agent.text_env(env))`` plays them with
        choice decoding too.
        """
        wrapper_kwargs.setdefault("history", 16 if self.history is None else self.history)
        parser = (
            _NamedReplies(self.replies) if self.replies else FunctionParser(self.extract_action)
        )
        return TextEnvWrapper(
            env,
            formatter=lambda obs, info: self.format_observation(obs),
            parser=parser,
            system_prompt=self.get_system_prompt(),
            **wrapper_kwargs,
        )


class _NamedReplies(FunctionParser):
    """Parses exactly the named replies (:meth:`Agent.action_replies`) and lists them."""

    def __init__(self, replies: Mapping[str, Any]) -> None:
        super().__init__(replies.__getitem__)
        self.replies = list(replies)

    def choices(self) -> list[str] | None:
        """Every valid reply."""
        return list(self.replies)
