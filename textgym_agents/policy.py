"""``PPOPolicy``: chat messages in, reply text out — an LLM with a LoRA adapter and a value head.

The policy only sees text, so it works with every textgym env. Generation is batched (left padding,
KV cache; :mod:`textgym_agents.decoding.generation`), optionally restricted to the env's reply
grammar (constrained decoding), or, with choice decoding, picks one of the env's valid replies by
scoring them all; scoring for training lives in :mod:`textgym_agents.decoding.scoring`, the saved
files in :mod:`textgym_agents.runfiles.policy_files`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from torch import nn

from textgym_agents.decoding.choices import check_choice_set, choice_token_ids
from textgym_agents.decoding.constrained import GrammarCompiler, decoding_mode
from textgym_agents.decoding.generation import Generation, generate_text
from textgym_agents.decoding.scoring import PolicyScoring, Scores
from textgym_agents.decoding.shared_prefix import CarriedCaches, continued_states
from textgym_agents.model.activation_memory import use_lean_activations
from textgym_agents.model.adapters import ValueHead, attach_lora, hidden_size_of
from textgym_agents.model.attention import use_gqa_attention
from textgym_agents.model.loading import load_model, resolve_precision
from textgym_agents.model.precision import in_decode_dtype, pass_dtype_of
from textgym_agents.ppo.config import PPOConfig
from textgym_agents.runfiles.checkpoint import default_run_dir
from textgym_agents.runfiles.policy_files import load_policy_parts, save_policy, save_policy_files

__all__ = ["Generation", "PPOPolicy", "Scores"]

logger = logging.getLogger(__name__)

Messages = Sequence[dict[str, str]]


class PPOPolicy(PolicyScoring):
    """A causal LM with a LoRA adapter and a value head that maps chat messages to replies.

    Example:
        >>> from textgym_agents.testing import tiny_model
        >>> model, tokenizer = tiny_model()
        >>> policy = PPOPolicy(model, tokenizer, config=PPOConfig(max_new_tokens=4))
        >>> reply = policy.act([{"role": "user", "content": "Hit or stick?"}])
        >>> isinstance(reply, str)
        True
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        value_head: ValueHead | None = None,
        *,
        config: PPOConfig | None = None,
        lora: Any = None,
        base_info: dict[str, Any] | None = None,
    ) -> None:
        """Wrap a model.

        Args:
            model: A causal LM; a LoRA adapter is attached unless it is already a PeftModel.
            tokenizer: Its tokenizer (needs a chat template).
            value_head: The value head; a new one is created when None.
            config: Generation and training settings.
            lora: LoRA settings for :func:`~textgym_agents.model.adapters.attach_lora`.
            base_info: How to reload the base model (name, gguf file, dtype), kept by save().
        """
        self.config = config or PPOConfig()
        # Without a config, learn() trains with the settings that suit its env (for_env).
        self.config_given = config is not None
        if isinstance(model, PeftModel):
            self.model = model
        else:
            with torch.random.fork_rng(devices=[]):  # the adapter's init follows config.seed
                torch.manual_seed(self.config.seed)
                self.model = attach_lora(model, lora)
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        parameter = next(self.model.parameters())
        # fp32 whatever the model's dtype (it casts hidden states): a trainable master weight.
        self.value_head = value_head or ValueHead(hidden_size_of(self.model))
        self.value_head.to(parameter.device)
        # How save() records the base model: given by from_pretrained/load, else the path the
        # model was loaded from (transformers keeps it in config._name_or_path).
        name = getattr(getattr(self.model, "config", None), "_name_or_path", None) or None
        self.base_info = dict(base_info or {"name_or_path": name})
        # The forward passes' dtype where it is not the weights' ("bfloat16-passes").
        self.pass_dtype: torch.dtype | None = pass_dtype_of(self.base_info.get("dtype"))
        # The env it was trained on (textgym.env_records.env_record), set by training and
        # kept by save(): evaluation rebuilds it and warns when another env prompts otherwise.
        self.trained_env: dict[str, Any] | None = None
        self.eos_ids = _eos_ids(tokenizer, self.model)
        self._prefix_cache: tuple[str | None, list[int]] = (None, [])
        self._choice_cache: dict[tuple[str, str], list[int]] = {}  # (prefix, reply) -> ids
        self._grammars: GrammarCompiler | None = None  # built on first constrained generation
        self._engine: Any = None  # config.rollout_engine="vllm": started on first generation
        self._warned_decoding = False  # _decoding's fallback is said once
        self._carried: CarriedCaches | None = None  # set inside carrying_caches()
        self._learner = self.model.active_adapter  # the adapter a vLLM engine serves
        self.model.eval()  # no dropout: PPO's old and new log-probs must match
        if self.config.gqa_attention:
            use_gqa_attention(self.model.get_base_model())
        if self.config.lean_activations:
            use_lean_activations(self.model.get_base_model())

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | None = None,
        *,
        gguf_file: str | None = None,
        dtype: str | torch.dtype | None = None,
        device: str | torch.device | None = None,
        lora: Any = None,
        config: PPOConfig | None = None,
    ) -> PPOPolicy:
        """Load a base model (the embedded SmolLM2 by default) and attach a fresh adapter.

        Args:
            name_or_path: None for the embedded model (shipped with the package: nothing is
                downloaded), a local directory, a ``.gguf`` path, or a Hugging Face id, which
                transformers loads from the local HF cache or downloads (set
                ``HF_HUB_OFFLINE=1`` to forbid downloads).
            gguf_file: GGUF file inside ``name_or_path``.
            dtype: Compute dtype of the frozen base model; None or ``"auto"`` picks bf16
                where this machine runs it fast, else float32, per phase
                (``"bfloat16-passes"``: fp32 weights and generation, bf16 forward passes);
                recorded in ``base_info``.
            device: Device (default CUDA when present, else CPU).
            lora: LoRA settings (a ``peft.LoraConfig`` or a dict of overrides).
            config: Generation and training settings.
        """
        precision = resolve_precision(dtype, device)
        model, tokenizer = load_model(
            name_or_path, gguf_file=gguf_file, dtype=precision.dtype, device=device
        )
        info = {
            "name_or_path": name_or_path or "embedded",
            "gguf_file": gguf_file,
            "dtype": precision.name,
            "precision": precision.to_dict(),
        }
        return cls(model, tokenizer, config=config, lora=lora, base_info=info)

    # --- text in, text out -------------------------------------------------------------------

    def encode(self, messages: Messages) -> list[int]:
        """Token ids of the chat prompt for ``messages``, then of the reply prefix (if any)."""
        encoded = self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return list(encoded["input_ids"]) + self._prefix_ids()

    def _prefix_ids(self) -> list[int]:
        prefix = self.config.reply_prefix
        if not prefix:
            return []
        if self._prefix_cache[0] != prefix:
            ids = self.tokenizer.encode(prefix, add_special_tokens=False)
            self._prefix_cache = (prefix, list(ids))
        return self._prefix_cache[1]

    @torch.no_grad()
    @in_decode_dtype
    def generate(
        self,
        batch: Sequence[Messages],
        *,
        greedy: bool = False,
        max_new_tokens: int | None = None,
        choices: Sequence[Sequence[str] | None] | None = None,
        schemas: Sequence[dict[str, Any] | None] | None = None,
        explore: float = 0.0,
    ) -> Generation:
        """Generate one reply per conversation in a single batched call.

        Args:
            batch: Conversations (lists of chat messages).
            greedy: Pick the most likely reply instead of sampling.
            max_new_tokens: Override of ``config.max_new_tokens`` (free and constrained text).
            choices: Each conversation's valid replies (``env.reply_choices()``), used when
                ``config.decoding`` is ``"choices"`` or ``"auto"``: the reply is then one of
                them, drawn from the model's distribution over them.
            schemas: Each conversation's reply JSON schema (``reply_schemas(envs)``), used when
                ``config.decoding`` is ``"constrained"`` or ``"auto"``: the reply then satisfies
                it, sampled from the model's distribution renormalised over allowed tokens.
            explore: With choice decoding and sampling, draw each reply from
                ``(1 - explore) * π + explore * uniform`` over its valid replies and record its
                log-prob under that mixture (``behaviour_logps``); training's rollouts use
                ``config.explore_eps``. Ignored by free and constrained text.
        """
        prompts = [self.encode(messages) for messages in batch]
        if not prompts:
            return Generation([], [], [])
        config = self.config
        mode = decoding_mode(self._decoding(choices, schemas), len(prompts), choices, schemas)
        if config.rollout_engine == "vllm" and self.model.active_adapter == self._learner:
            # Self-play snapshots (other adapters) keep generating here, on HF.
            budget = max_new_tokens or config.max_new_tokens
            engine = self.rollout_engine()
            return engine.rollout(
                prompts, mode, choices, schemas, greedy=greedy, max_new_tokens=budget
            )
        if mode == "choices":
            return self._choose(prompts, choices, greedy, explore)  # type: ignore[arg-type]
        budget = max_new_tokens or config.max_new_tokens
        grammar = None
        if mode == "constrained":
            compiler = self._grammar_compiler()
            grammar = compiler.mask(schemas, self._prefix_ids(), config.stop_strings, budget)  # type: ignore[arg-type]
        # The critic's values from this pass, so training need not score them again.
        critic = config.uses_critic and config.score_in_update
        carried = self._carried
        if carried is not None and carried.owner != self.model.active_adapter:
            carried.clear()  # kept under another adapter (self-play snapshots)
            carried.owner = self.model.active_adapter
        return generate_text(
            self.model,
            self.tokenizer,
            prompts,
            config,
            eos_ids=self.eos_ids,
            max_new_tokens=budget,
            greedy=greedy,
            grammar=grammar,
            critic=(self._decoder(), self.value_head) if critic else None,
            carried=carried,
        )

    @torch.no_grad()
    @in_decode_dtype
    def carried_values(self, prompts: Sequence[list[int]]) -> list[float] | None:
        """The critic's value of each prompt (token ids), run on the rows generation carries.

        A prompt that continues a row of the last :meth:`generate` call (the next observation
        of an unfinished episode) runs only its new tokens. Returns None outside
        :meth:`carrying_caches` (:meth:`prompt_values` scores prompts anywhere).
        """
        carried = self._carried
        if carried is None or carried.owner != self.model.active_adapter:
            return None
        if not prompts:
            return []
        states = continued_states(self._decoder(), prompts, carried)
        return self.value_head(states).float().tolist()

    @contextmanager
    def carrying_caches(self) -> Iterator[None]:
        """Inside, generation carries each row's key/value cache to the next call.

        With ``config.carry_caches``, a prompt that continues a row of the previous
        :meth:`generate` call (a conversation-keeping episode's next turn) is prefilled only
        past the prefix that row already computed
        (:class:`~textgym_agents.decoding.shared_prefix.CarriedCaches`). The weights must not
        change inside: training's rollouts and evaluations use it; the caches are dropped on
        exit. Without the setting it does nothing.
        """
        if not self.config.carry_caches or self._carried is not None:
            yield
            return
        self._carried = CarriedCaches()
        try:
            yield
        finally:
            self._carried = None

    def _decoding(
        self,
        choices: Sequence[Sequence[str] | None] | None,
        schemas: Sequence[dict[str, Any] | None] | None,
    ) -> str:
        """``config.decoding``, or ``"auto"`` (warned once) where a call lacks what it needs.

        A policy trained with choices (or a grammar) still answers a bare observation:
        ``act(obs)`` then decodes what the call allows (free text after the reply prefix)
        instead of failing; pass ``choices=env.reply_choices()`` to pick a valid reply.
        """
        mode = self.config.decoding
        hints = {"choices": choices, "constrained": schemas}.get(mode, ())
        if hints is None or any(h is None for h in hints):
            if not self._warned_decoding:
                self._warned_decoding = True
                what = "valid replies" if mode == "choices" else "reply schemas"
                keyword = "choices=env.reply_choices()" if mode == "choices" else "schemas=..."
                logger.warning(
                    "config.decoding=%r but this call has no %s for some conversations: "
                    "decoding them as decoding='auto' does (free text unless a choice list or "
                    "schema is there). Pass %s to decode as in training. (Said once.)",
                    mode,
                    what,
                    keyword,
                )
            return "auto"
        return mode

    def rollout_engine(self) -> Any:
        """The :class:`~textgym_agents.engines.VLLMEngine` of ``rollout_engine="vllm"``.

        Created on first use: it connects to ``config.vllm_url`` or starts a server; stop it
        with :meth:`close_rollout_engine` (a started server also stops at exit).
        """
        if self._engine is None:
            from textgym_agents.engines import VLLMEngine

            config = self.config
            self._engine = VLLMEngine(
                self, url=config.vllm_url, adapter_dir=config.vllm_adapter_dir
            )
        return self._engine

    def close_rollout_engine(self) -> None:
        """Stop the vLLM engine (and a server it started), if there is one."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    def _grammar_compiler(self) -> GrammarCompiler:
        if self._grammars is None:
            vocab_size = self._lm_head().weight.shape[0]
            self._grammars = GrammarCompiler(self.tokenizer, vocab_size, self.eos_ids)
        return self._grammars

    def act(
        self,
        observations: Messages | Sequence[Messages],
        *,
        greedy: bool = False,
        choices: Sequence[str] | Sequence[Sequence[str] | None] | None = None,
        schemas: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
    ) -> str | list[str]:
        """Reply to one conversation (returns a str) or to a batch (returns a list of str).

        ``observations`` is what a text env returns: one list of ``{"role", "content"}``
        messages, or a sequence of them (a vector env's batch). ``choices`` are the valid
        replies for choice decoding (``env.reply_choices()``), ``schemas`` the reply JSON
        schema for constrained decoding: one for one conversation, one per conversation for
        a batch.
        """
        single = _is_conversation(observations)
        batch = [observations] if single else list(observations)  # type: ignore[list-item]
        if single:
            choices = None if choices is None else [choices]  # type: ignore[list-item]
            schemas = None if schemas is None else [schemas]  # type: ignore[list-item]
        texts = self.generate(batch, greedy=greedy, choices=choices, schemas=schemas).texts  # type: ignore[arg-type]
        return texts[0] if single else texts

    def act_batch(
        self,
        batch: Sequence[Messages],
        *,
        choices: Sequence[Sequence[str] | None] | None = None,
        schemas: Sequence[dict[str, Any] | None] | None = None,
        greedy: bool = False,
    ) -> list[str]:
        """One reply per conversation (the :class:`textgym.Policy` protocol; see generate)."""
        return self.generate(batch, greedy=greedy, choices=choices, schemas=schemas).texts

    @property
    def wants_choices(self) -> bool:
        """Whether :meth:`generate` uses the envs' valid replies (``config.decoding``)."""
        return self.config.decoding in ("choices", "auto")

    @property
    def wants_schemas(self) -> bool:
        """Whether :meth:`generate` uses the envs' reply schemas (``config.decoding``)."""
        return self.config.decoding in ("constrained", "auto")

    def choice_ids(self, replies: Sequence[str]) -> list[list[int]]:
        """Token ids the policy scores for each valid reply.

        Cached per reply, not per set: with an action mask each state lists another subset
        of the same replies, and a cache of sets could grow with the number of subsets.
        """
        prefix = self.config.reply_prefix
        missing = [r for r in dict.fromkeys(replies) if (prefix, r) not in self._choice_cache]
        if missing:
            eos = self.tokenizer.eos_token_id
            ids = choice_token_ids(self.tokenizer, missing, prefix, eos)
            self._choice_cache.update(((prefix, r), i) for r, i in zip(missing, ids, strict=True))
        return check_choice_set([self._choice_cache[prefix, r] for r in replies], replies)

    def _choose(
        self,
        prompts: list[list[int]],
        choices: Sequence[Sequence[str]],
        greedy: bool,
        explore: float = 0.0,
    ) -> Generation:
        ids = [self.choice_ids(replies) for replies in choices]
        critic = self.config.uses_critic  # critic-free estimators never run the value head
        scores = self.score_choices(prompts, ids, values=critic)
        behaviour = None
        if explore > 0 and not greedy:
            picks, behaviour = scores.explore(explore)
        else:
            picks = scores.sample(greedy)
        return Generation(
            prompts,
            [ids[b][k] for b, k in enumerate(picks)],
            [choices[b][k] for b, k in enumerate(picks)],
            choice_ids=ids,
            logps=scores.chosen(picks).float().tolist(),
            choice_logps=[row.float().cpu() for row in scores.logps],
            values=scores.values.float().tolist() if critic else None,  # type: ignore[union-attr]
            behaviour_logps=behaviour,
        )

    # --- training ----------------------------------------------------------------------------

    def learn(
        self,
        envs: Any,
        total_episodes: int,
        *,
        output_dir: str | Path | None = "auto",
        resume_from: str | Path | None = None,
        callback: Any = None,
    ) -> dict[str, float]:
        """Train by PPO on a text env (vector or single) until ``total_episodes`` episodes end.

        Args:
            envs: A text env or text vector env.
            total_episodes: Episodes to finish (counting those of a resumed run).
            output_dir: Run directory for metrics, checkpoints, the final policy and the
                learning curve; ``"auto"`` picks ``runs/<env>-<time>``, None writes nothing.
            resume_from: A run directory or checkpoint to continue from.
            callback: Called with each update's metrics; returning False stops training. An
                object with ``on_update`` (a :class:`~textgym_agents.selfplay.SelfPlayPool`)
                is added as a trainer callback instead (see ``PPOTrainer.add_callback``).

        Returns:
            The last update's metrics.

        A policy created without a config trains with :meth:`PPOConfig.for_env(envs)
        <textgym_agents.PPOConfig.for_env>`, the settings ``textgym train`` uses for the env
        of each call (its seed kept): they are logged, saved in the run directory's
        ``config.json`` and stay the policy's ``config`` afterwards, so it decodes as it was
        trained. A policy given a config trains with exactly that config, never changed.
        """
        from textgym_agents.ppo.trainer import PPOTrainer

        if not self.config_given:
            settings = PPOConfig.for_env(envs, seed=self.config.seed)
            before = self.config.to_dict()
            changed = {k: v for k, v in settings.to_dict().items() if before[k] != v}
            if changed:
                logger.info(
                    "learn(): the policy has no config of its own, so it trains with the "
                    "settings that suit this env (PPOConfig.for_env): %s",
                    ", ".join(f"{k}={v!r}" for k, v in sorted(changed.items())),
                )
            self.config = settings

        if output_dir == "auto":
            output_dir = _default_run_dir(envs)
        trainer = PPOTrainer(self, envs, output_dir=output_dir)
        return trainer.train(total_episodes, resume_from=resume_from, callback=callback)

    # --- persistence (files: textgym_agents.runfiles.policy_files) --------------------------------

    def save(self, path: str | Path) -> Path:
        """Write the adapter (peft format), the value head and the config, atomically."""
        return save_policy(self, path)

    def save_files(self, directory: Path) -> None:
        """Write the policy files into an existing directory (used inside checkpoints)."""
        save_policy_files(self, directory)

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        trust_code: bool = False,
    ) -> PPOPolicy:
        """Load a policy written by :meth:`save` (or a checkpoint directory).

        Args:
            path: The policy or checkpoint directory.
            device: Device of the base model (default CUDA when present, else CPU).
            dtype: Compute dtype of the base model; None: the one it was saved with.
            trust_code: Accept a recorded training env that names code textgym does not know
                (a custom entry point, formatter or parser, :mod:`textgym.trust`), as
                ``trust_remote_code`` does for models: only for policies you trust.

        Raises:
            CheckpointError: A file of the policy is missing, truncated or changed.
            textgym.trust.UntrustedCodeError: See ``trust_code``; nothing was loaded.
        """
        parts = load_policy_parts(path, device=device, dtype=dtype, trust_code=trust_code)
        policy = cls(
            parts.model,
            parts.tokenizer,
            parts.value_head,
            config=parts.config,
            base_info=parts.base_info,
        )
        policy.trained_env = parts.trained_env
        return policy


def _default_run_dir(envs: Any) -> Path:
    spec = getattr(envs, "spec", None)
    return default_run_dir(spec.id if spec is not None else None)


def _is_conversation(value: Any) -> bool:
    return isinstance(value, Sequence) and len(value) > 0 and isinstance(value[0], dict)


def _eos_ids(tokenizer: Any, model: nn.Module) -> set[int]:
    ids = {tokenizer.eos_token_id}
    generation_config = getattr(model, "generation_config", None)
    extra = getattr(generation_config, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, list):
        ids.update(extra)
    return {i for i in ids if i is not None}
