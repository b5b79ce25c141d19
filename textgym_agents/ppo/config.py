"""``PPOConfig``: every setting of generation, rollout, the PPO update and run outputs.

Each field carries help text (``field(metadata={"help": ...})``) so a CLI or a config file can
set and explain it; ``__post_init__`` rejects bad values with a message that names the field.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ESTIMATORS", "GROUP_ESTIMATORS", "SECTIONS", "PPOConfig", "config_reference"]

ESTIMATORS = ("gae", "grpo", "rloo", "gigpo", "reinforce")
"""Values of ``PPOConfig.advantage_estimator``."""
GROUP_ESTIMATORS = ("grpo", "rloo", "gigpo")
"""Estimators that compare the episodes of a seed-shared group (``group_size >= 2``)."""


SECTIONS = (
    ("Generation and decoding", "max_new_tokens"),
    ("Speed switches", "reuse_rollout_scores"),
    ("Rollout engine", "rollout_engine"),
    ("Rollout", "num_steps"),
    ("Advantage estimator", "advantage_estimator"),
    ("PPO update", "learning_rate"),
    ("KL penalty", "kl_coef"),
    ("Run", "seed"),
)
"""``PPOConfig``'s fields in groups: each group's title and its first field (in field order)."""


def _help(default: Any, text: str) -> Any:
    if isinstance(default, list | dict):
        # A copy per instance: one config's list must not be every config's default.
        return field(default_factory=lambda: copy.copy(default), metadata={"help": text})
    return field(default=default, metadata={"help": text})


@dataclass
class PPOConfig:
    """Settings of :class:`~textgym_agents.PPOPolicy` training.

    Example:
        >>> config = PPOConfig(num_steps=4, learning_rate=5e-5)
        >>> config.clip_range
        0.2
        >>> PPOConfig(clip_range=-1.0)
        Traceback (most recent call last):
        ...
        ValueError: clip_range must be > 0, got -1.0
    """

    # --- generation -------------------------------------------------------------------------
    max_new_tokens: int = _help(24, "Longest reply in tokens; generation also stops at EOS.")
    temperature: float = _help(
        1.0,
        "Sampling temperature; log-probs use the same scaling. With choices it divides the "
        "choices' scores (flattening the distribution over valid replies), not each token's.",
    )
    top_k: int = _help(0, "Sample from the k most likely tokens (0 = no limit).")
    top_p: float = _help(1.0, "Nucleus sampling threshold (1.0 = no limit).")
    reply_prefix: str = _help(
        "", "Text every reply starts with (assistant prefill); the env receives prefix + reply."
    )
    stop_strings: list[str] = _help(
        [],
        "Generation stops after any of these (kept in the reply); with constrained decoding, "
        "only where the reply is complete.",
    )
    decoding: str = _help(
        "free",
        "How replies are produced: 'free' samples text that the env parses; 'choices' scores "
        "every valid reply the env lists (reply_choices()) and samples one, so none is invalid; "
        "'constrained' samples only text that satisfies the env's reply JSON schema "
        "(llguidance); 'auto' uses choices where the env lists them, else constrained where it "
        "has a schema, else free text.",
    )
    choice_length_norm: bool = _help(
        False, "Choices: rank replies by mean token log-prob instead of the sum (TWOSOME)."
    )
    choice_batch_size: int = _help(
        64,
        "Choices: replies scored per forward pass. A prompt with more valid replies runs once "
        "and its replies are scored in pieces of this many (checkpointed in the update), so "
        "memory follows this number, not the number of replies.",
    )
    # --- speed (each switch restores the earlier, slower behaviour for comparison) ----------
    reuse_rollout_scores: bool = _help(
        True,
        "Choices: keep the log-probs and values the rollout computed (same weights, same "
        "computation) instead of scoring the batch again before the update; with a KL "
        "penalty the batch is scored again (beside the reference) either way.",
    )
    share_repeated_prompts: bool = _help(
        True,
        "Choices: score each distinct prompt (with its replies) once per forward pass and let "
        "every turn that shows it share the result, its gradient summed over them: worlds "
        "whose states repeat within a batch (FrozenLake, CliffWalking, Blackjack) run far "
        "fewer rows; the same values up to rounding. False runs a row per turn.",
    )
    gqa_attention: bool = _help(
        True,
        "On CPU, run grouped-query attention without copying key/value heads (sdpa_gqa; same "
        "results, faster); False keeps transformers' sdpa.",
    )
    lean_activations: bool = _help(
        True,
        "Training passes keep only the inputs of each RMSNorm and of the MLP's silu(gate) * up "
        "for the backward pass and recompute the element-wise steps there (same values and "
        "gradients to the bit, less memory: the norms' float32 copies of bf16 activations "
        "and one of the MLP's three wide tensors); False keeps transformers' modules.",
    )
    pack_turns: bool = _help(
        True,
        "Score and train a turn whose prompt and reply begin another turn's prompt inside "
        "that turn's row (an episode whose prompts keep the conversation: one row per "
        "episode instead of one per turn; the same log-probs up to rounding), and keep such "
        "turns together in minibatches. False gives every turn its own row.",
    )
    carry_caches: bool = _help(
        True,
        "Rollouts: keep each row's key/value cache after a generation call and prefill the "
        "next call's prompt only past the longest prefix it shares with a kept row (an "
        "episode whose prompts keep the conversation then runs each turn's new tokens only). "
        "Memory: one batch of caches. False prefills every prompt from its shared prefix.",
    )
    lean_decoding: bool = _help(
        True,
        "Free and constrained text on Llama-style models: run the decoding steps after the "
        "prompt's pass in textgym's own loop (the layers' products with the adapters stacked "
        "and cast once per weight change, keys and values written in place, sampling as "
        "transformers does) instead of transformers' generate(); the same replies up to "
        "rounding. Other models always use generate().",
    )
    score_in_update: bool = _help(
        True,
        "Skip scoring before the update where the update computes the same numbers: turns of "
        "the first minibatch take their old log-probs from the first epoch's own forward pass "
        "(the rollout's weights, the same rows: the first ratio is exactly 1), and the "
        "critic's values come from the rollout's generation pass (the hidden state of each "
        "prompt's last token). Later minibatches, a KL penalty's reference and vLLM rollouts "
        "are scored before the update as with False.",
    )
    mixed_precision: bool = _help(
        True,
        "With a bf16 base model (dtype 'auto' on a machine with fast bf16), run the LoRA "
        "products in bf16 too (torch.autocast); LoRA and value-head weights, the optimizer, "
        "log-softmax and losses stay fp32. False computes LoRA in fp32 (slower). No effect "
        "on a float32 model.",
    )
    # --- rollout engine (docs/vllm.md) -----------------------------------------------------
    rollout_engine: str = _help(
        "hf",
        "Who samples rollout replies: 'hf' (transformers generate in this process) or 'vllm' "
        "(a vLLM server: vllm_url, else one started from vllm_python; the adapter is reloaded "
        "under a fresh name after every update). Scoring and training stay here either way.",
    )
    vllm_url: str | None = _help(
        None, "vLLM: URL of a running server (e.g. http://10.0.0.2:8000); None starts one."
    )
    vllm_python: str | None = _help(
        None,
        "vLLM: interpreter of the server's environment when one is started (default "
        "$TEXTGYM_VLLM_PYTHON, else .venv-vllm/bin/python from scripts/setup.sh --vllm).",
    )
    vllm_port: int = _help(0, "vLLM: port of a started server on 127.0.0.1 (0: a free one).")
    vllm_start_timeout: float = _help(600.0, "vLLM: seconds a started server may take to be up.")
    vllm_request_timeout: float = _help(
        300.0, "vLLM: seconds one request may take before it fails (no hang on a dead server)."
    )
    vllm_adapter_dir: str | None = _help(
        None,
        "vLLM: where adapters are written for the server to load (for a server on another "
        "machine, a shared path mounted at the same place there); None: a temporary directory.",
    )
    vllm_server_args: list[str] = _help(
        [], "vLLM: extra `vllm serve` arguments for a started server."
    )
    # --- rollout ----------------------------------------------------------------------------
    num_steps: int = _help(
        4, "Env steps per env per update; a batch is num_envs * num_steps turns."
    )
    max_episode_turns: int = _help(
        1000,
        "Longest episode training plays: an episode still running after this many turns is "
        "cut there, recorded as truncated (its last turn's value bootstrapped, as after a "
        "TimeLimit), so an env whose episodes never end cannot stall training. Applied to a "
        "single env and to every env of a SyncVectorEnv (not an AsyncVectorEnv's: a warning "
        "says so); an env's own shorter limit ends its episodes first. The default is above "
        "the built-in envs' time limits (100 to 500 turns).",
    )
    explore_eps: float = _help(
        0.0,
        "Choices: training rollouts draw each reply from (1 - eps) * policy + eps * uniform "
        "over the valid replies, and the update weights each turn by policy / mixture (exact, "
        "at most 1 / (1 - eps)), so the gradient stays the on-policy one in expectation; "
        "evaluation and act() are unaffected. Needs decoding 'choices' or 'auto' and the 'hf' "
        "rollout engine; turns decoded as text are not explored.",
    )
    novelty_bonus: float = _help(
        0.0,
        "c of a count-based novelty bonus: a turn that leads to an observation the run has "
        "seen n times (its anchor key, as GiGPO's) earns c / sqrt(n) on top of the env reward "
        "in the advantage estimate only; the last turn of an episode earns none. For worlds "
        "whose successes are too rare to learn from. 0 disables it.",
    )
    all_choices: bool = _help(
        False,
        "Choices: credit every valid reply of a turn, not only the sampled one. A reply's "
        "advantage is Q(s, a) - V(s): the mean return-to-go (discount gamma) after it from "
        "the turn's observation (its anchor key, as GiGPO's), over the run's last "
        "all_choices_window turns, minus the mean from that observation (0 for replies not "
        "played from it there); the update takes PPO's clipped surrogate in expectation over "
        "the replies (Mean Actor-Critic). With normalize_by_std, divided by the rollout's "
        "std of those advantages. Turns decoded as text keep the estimator's advantage.",
    )
    all_choices_window: int = _help(
        4096,
        "all_choices, and self_imitation without a critic: the most recent turns whose "
        "returns-to-go estimate Q and V.",
    )
    choice_update: str = _help(
        "clipped",
        "all_choices: how a credited turn's replies are trained. 'clipped': PPO's clipped "
        "surrogate in expectation over the replies (its gradient sum_a A(a) grad pi(a) "
        "vanishes for replies the policy has all but ruled out). 'mirror': the replies' "
        "log-probs are fitted to a policy mirror-descent step, pi_old(a) * exp(mirror_step * "
        "A(a)) renormalised, so an unlikely reply moves as fast as a likely one.",
    )
    mirror_step: float = _help(
        1.0,
        "choice_update 'mirror': change of a reply's log-prob, relative to the turn's mean, "
        "per unit of advantage in one update.",
    )
    gamma: float = _help(1.0, "Discount between turns (GAE, and REINFORCE's returns-to-go).")
    lam: float = _help(0.95, "GAE lambda.")
    # --- advantage estimator (docs/estimators.md) ---------------------------------------------
    advantage_estimator: str = _help(
        "gae",
        "How turns get their advantage: 'gae' (turn-level GAE with the learned value head); "
        "critic-free, no value head run or trained: 'grpo' (episode return minus its group's "
        "mean, over the group's std), 'rloo' (minus the mean of the other G-1 members), "
        "'gigpo' (GRPO's episode advantage plus step_advantage_weight times a step advantage "
        "among the group's turns from the same observation) and 'reinforce' (returns-to-go "
        "normalised over the batch).",
    )
    group_size: int = _help(
        1,
        "G: envs per group. The G envs of a group start every episode from one reset seed and "
        "a rollout is whole rounds of episodes; grpo, rloo and gigpo need G >= 2, and the "
        "number of envs (per process) must be a multiple of G.",
    )
    normalize_by_std: bool = _help(
        True,
        "Divide group-relative advantages by the group's standard deviation (grpo, and both "
        "levels of gigpo) and REINFORCE's returns by the batch's; rloo never does.",
    )
    step_advantage_weight: float = _help(
        1.0, "GiGPO's omega: A = A_episode + omega * A_step (1.0 as in the paper's scripts)."
    )
    step_gamma: float = _help(
        0.95, "GiGPO: discount of the returns-to-go compared within a step group."
    )
    drop_zero_advantage: bool = _help(
        True,
        "Critic-free estimators: leave turns whose advantage is exactly 0 (every turn of a "
        "group whose returns are all equal, of an episode cut by the rollout) out of the "
        "update (choice_update 'mirror' keeps credited ones beside turns that move, fitted to "
        "stay put); an update with none left takes no optimizer step, so the entropy bonus "
        "never acts alone. False trains on them too (their only gradient is the entropy's).",
    )
    self_imitation: int = _help(
        0,
        "Turns of past episodes drawn for replay per update (self-imitation; 0: off). Every "
        "turn of a finished episode whose return-to-go R beat the value V expected when played "
        "is kept (the last self_imitation_capacity; a poor outcome too, where less was "
        "expected), and each update draws this many at random and trains on those whose R "
        "still beats the value expected now, beside the rollout's turns, with advantage R - V "
        "(scaled as the batch's advantages are) and, under GAE, a value target of R. V: the "
        "critic's value (GAE); without a critic, the mean return-to-go (discount gamma) from "
        "the turn's observation (its anchor key, as GiGPO's) over the run's last "
        "all_choices_window turns. For rare successes a run would otherwise lose.",
    )
    self_imitation_capacity: int = _help(
        512, "self_imitation: the most recent better-than-expected turns kept for replay."
    )
    # --- PPO update -------------------------------------------------------------------------
    learning_rate: float = _help(2e-4, "AdamW learning rate of the LoRA weights.")
    value_learning_rate: float = _help(1e-3, "AdamW learning rate of the value head.")
    anneal_lr: bool = _help(
        False,
        "Decay both learning rates linearly towards 0 over the run, as cleanrl's anneal_lr: "
        "each update uses lr * (1 - episodes done / the run's total_episodes).",
    )
    weight_decay: float = _help(0.0, "AdamW weight decay.")
    num_epochs: int = _help(2, "Passes over each batch.")
    minibatch_size: int = _help(32, "Turns per optimizer step.")
    micro_batch_size: int = _help(
        16,
        "Rows per forward pass (gradient accumulation; a row is a turn, or the turns "
        "pack_turns puts in one); at most minibatch_size (a larger value is taken as "
        "minibatch_size).",
    )
    micro_batch_tokens: int | None = _help(
        1024,
        "Most tokens per forward pass of the update (rows times the longest row, the start "
        "shared by the minibatch not counted): long turns then share a forward pass with fewer "
        "others, which bounds activation memory where prompts carry a long history. None: "
        "micro_batch_size turns per pass whatever their length.",
    )
    clip_range: float = _help(0.2, "PPO ratio clipping epsilon.")
    clip_range_value: float | None = _help(
        0.2,
        "Value clipping around old values, in the returns' units (None: off): the value loss "
        "stops pulling a prediction further than this from the rollout's, so with returns far "
        "beyond +-1 (CliffWalking: -1 a move, -100 a fall) the critic needs many updates to "
        "reach them.",
    )
    vf_coef: float = _help(0.5, "Weight of the value loss.")
    ent_coef: float = _help(
        0.0, "Weight of the entropy bonus (with entropy_target: its starting weight)."
    )
    entropy_target: float | None = _help(
        None,
        "Steer the entropy bonus toward this mean policy entropy (nats per scored token; with "
        "choices, of the distribution over the valid replies, at most ln of their number): "
        "after each update ent_coef is multiplied by 2 ** clip((target - entropy) / target, "
        "-1, 1), within [1e-4, 10]. Needs ent_coef > 0. None: ent_coef stays fixed.",
    )
    max_grad_norm: float = _help(1.0, "Gradient clipping norm.")
    whiten_advantages: bool = _help(
        True, "GAE: normalise advantages over the batch (group estimators normalise per group)."
    )
    target_kl: float | None = _help(None, "Stop the epochs of an update past this approx. KL.")
    gradient_checkpointing: bool = _help(
        False,
        "Recompute each decoder layer in the backward pass instead of keeping its activations "
        "(~10x less activation memory, ~40% more update time, same gradients).",
    )
    # --- KL penalty to the reference (the base model with the adapter disabled) --------------
    kl_coef: float = _help(0.0, "Initial beta of the per-turn KL penalty (0 disables it).")
    adaptive_kl: bool = _help(False, "Adapt beta toward kl_target (Ziegler et al. 2019).")
    kl_target: float = _help(1.0, "Target KL per turn for the adaptive controller.")
    kl_horizon: int = _help(10000, "Horizon (turns) of the adaptive KL controller.")
    kl_estimator: str = _help("k1", "Per-token KL estimator: k1, k3, abs or mse.")
    # --- run ----------------------------------------------------------------------------------
    seed: int = _help(0, "Seed of torch, numpy and the envs.")
    save_every: int = _help(10, "Write a checkpoint every N updates (0: only at the end).")
    keep_checkpoints: int = _help(3, "Checkpoints kept on disk.")
    report_to: list[str] = _help(["jsonl"], "Metric sinks: jsonl, tensorboard, wandb.")
    sample_episodes: int = _help(
        2, "Episodes per update written turn by turn to episodes.jsonl (0: none)."
    )
    progress: bool = _help(True, "Show a progress bar.")

    @property
    def uses_critic(self) -> bool:
        """Whether the value head is run and trained (only the ``"gae"`` estimator needs it)."""
        return self.advantage_estimator == "gae"

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):  # a string such as "false" would read as True
            if spec.type == "bool":
                _check(self, spec.name, isinstance(getattr(self, spec.name), bool), "a bool")
        positive_ints = ["max_new_tokens", "num_steps", "num_epochs", "minibatch_size"]
        positive_ints += ["group_size", "max_episode_turns", "all_choices_window"]
        positive_ints.append("self_imitation_capacity")
        positive_ints += ["micro_batch_size", "kl_horizon", "keep_checkpoints", "choice_batch_size"]
        for name in positive_ints:
            value = getattr(self, name)
            _check(self, name, _integer(value) and value >= 1, "an int >= 1")
        positive = ["temperature", "learning_rate", "clip_range", "max_grad_norm", "kl_target"]
        for name in [*positive, "mirror_step"]:
            value = getattr(self, name)
            _check(self, name, _number(value) and value > 0, "> 0")
        nonnegative = ["value_learning_rate", "weight_decay", "vf_coef", "ent_coef", "kl_coef"]
        nonnegative.append("novelty_bonus")
        ok = _integer(self.self_imitation) and self.self_imitation >= 0
        _check(self, "self_imitation", ok, "an int >= 0")
        for name in [*nonnegative, "step_advantage_weight"]:
            value = getattr(self, name)
            _check(self, name, _number(value) and value >= 0, ">= 0")
        for name in ["gamma", "lam", "step_gamma"]:
            value = getattr(self, name)
            _check(self, name, _number(value) and 0 <= value <= 1, "in [0, 1]")
        eps = self.explore_eps
        _check(self, "explore_eps", _number(eps) and 0 <= eps < 1, "in [0, 1)")
        if eps > 0 and (self.decoding not in ("choices", "auto") or self.rollout_engine != "hf"):
            raise ValueError(
                f"explore_eps={eps} mixes uniform choices into the rollout, so it needs "
                "decoding='choices' or 'auto' and rollout_engine='hf', got "
                f"decoding={self.decoding!r}, rollout_engine={self.rollout_engine!r}"
            )
        if self.all_choices and (
            self.decoding not in ("choices", "auto") or self.rollout_engine != "hf"
        ):
            raise ValueError(
                "all_choices credits every valid reply, so it needs decoding='choices' or "
                f"'auto' and rollout_engine='hf', got decoding={self.decoding!r}, "
                f"rollout_engine={self.rollout_engine!r}"
            )
        updates = ("clipped", "mirror")
        _check(self, "choice_update", self.choice_update in updates, f"one of {updates}")
        if self.choice_update == "mirror" and not self.all_choices:
            raise ValueError(
                "choice_update='mirror' fits the log-probs of every reply of a credited turn, "
                "so it needs all_choices=True"
            )
        _check(self, "top_p", _number(self.top_p) and 0 < self.top_p <= 1, "in (0, 1]")
        _check(self, "top_k", _integer(self.top_k) and self.top_k >= 0, "an int >= 0")
        _check(self, "save_every", _integer(self.save_every) and self.save_every >= 0, ">= 0")
        ok = _integer(self.sample_episodes) and self.sample_episodes >= 0
        _check(self, "sample_episodes", ok, "an int >= 0")
        if self.entropy_target is not None and not self.ent_coef > 0:
            raise ValueError(
                f"entropy_target={self.entropy_target} steers ent_coef multiplicatively, so it "
                f"needs a starting ent_coef > 0, got ent_coef={self.ent_coef}"
            )
        for name in ["clip_range_value", "target_kl", "entropy_target"]:
            value = getattr(self, name)
            _check(self, name, value is None or (_number(value) and value > 0), "> 0 or None")
        tokens = self.micro_batch_tokens
        ok = tokens is None or (_integer(tokens) and tokens >= 1)
        _check(self, "micro_batch_tokens", ok, "an int >= 1 or None")
        _check(
            self,
            "advantage_estimator",
            self.advantage_estimator in ESTIMATORS,
            f"one of {ESTIMATORS}",
        )
        if self.advantage_estimator in GROUP_ESTIMATORS and self.group_size < 2:
            raise ValueError(
                f"advantage_estimator={self.advantage_estimator!r} compares the episodes of a "
                f"group, so group_size must be >= 2, got {self.group_size}; set group_size "
                "(e.g. 8, with a number of envs that is a multiple of it)"
            )
        modes = ("free", "choices", "constrained", "auto")
        _check(self, "decoding", self.decoding in modes, f"one of {modes}")
        engines = ("hf", "vllm")
        _check(self, "rollout_engine", self.rollout_engine in engines, f"one of {engines}")
        for name in ["vllm_url", "vllm_python", "vllm_adapter_dir"]:
            value = getattr(self, name)
            _check(self, name, value is None or (isinstance(value, str) and value), "a str or None")
        port = self.vllm_port
        _check(self, "vllm_port", _integer(port) and 0 <= port < 65536, "an int in [0, 65535]")
        for name in ["vllm_start_timeout", "vllm_request_timeout"]:
            value = getattr(self, name)
            _check(self, name, _number(value) and value > 0, "> 0")
        ok = all(isinstance(x, str) for x in self.vllm_server_args)
        _check(self, "vllm_server_args", ok, "a list of str")
        estimators = ("k1", "k3", "abs", "mse")
        _check(self, "kl_estimator", self.kl_estimator in estimators, f"one of {estimators}")
        _check(self, "reply_prefix", isinstance(self.reply_prefix, str), "a str")
        if isinstance(self.stop_strings, str):
            self.stop_strings = [self.stop_strings]
        ok = all(isinstance(x, str) and x for x in self.stop_strings)
        _check(self, "stop_strings", ok, "a list of non-empty str")
        sinks = ("jsonl", "tensorboard", "wandb")
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]
        _check(self, "report_to", all(s in sinks for s in self.report_to), f"a list of {sinks}")
        # A forward pass never holds more than a minibatch: with the default 16 a smaller
        # minibatch_size alone is a valid config.
        self.micro_batch_size = min(self.micro_batch_size, self.minibatch_size)

    @classmethod
    def for_env(cls, env: Any, *, num_envs: int | None = None, **settings: Any) -> PPOConfig:
        """The settings that suit ``env`` (what ``textgym train`` uses), then ``settings``.

        The one source of per-env defaults, on top of the field defaults (a quick CPU run):
        where the env lists its valid replies, choice decoding with their common start as
        ``reply_prefix`` and exploration settings; where its replies are flat JSON objects, free
        text from ``{"`` to ``}`` (:func:`~textgym_agents.ppo.defaults.env_defaults`); then, for
        a registered env with a measured recipe, its settings
        (:data:`~textgym_agents.ppo.defaults.ENV_RECIPES`: Blackjack's GiGPO, the
        calculator's learning rate and self-imitation). Every key of ``settings`` wins over
        them. A recipe whose groups do not fit the envs is left out, with a warning.

        Args:
            env: A text env, a text vector env, or a registered env id.
            num_envs: The envs training will run, where ``env`` is not that vector env.
            **settings: ``PPOConfig`` fields to set (unknown names are rejected).

        Example:
            >>> import gymnasium as gym, textgym
            >>> config = PPOConfig.for_env(gym.make("textgym/Blackjack-v1"), seed=1)
            >>> config.decoding, config.reply_prefix, config.seed, config.advantage_estimator
            ('choices', '{"action": "', 1, 'gigpo')
            >>> calculator = PPOConfig.for_env("textgym/Calculator-v0")  # JSON tool calls
            >>> calculator.decoding, calculator.reply_prefix, calculator.stop_strings
            ('free', '{"', ['}'])
        """
        from textgym_agents.ppo.defaults import env_defaults, recipe_of, reply_hints

        choices, schema = reply_hints(env)
        defaults = env_defaults(choices, settings, schema=schema)
        recipe = recipe_of(env, settings, num_envs)
        return cls.from_dict({**defaults, **recipe, **settings})

    def to_dict(self) -> dict[str, Any]:
        """Return the settings as a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PPOConfig:
        """Build a config from a dict, rejecting unknown keys with the close matches.

        Example:
            >>> PPOConfig.from_dict({"learning_rte": 1e-4})
            Traceback (most recent call last):
            ...
            ValueError: Unknown PPOConfig field 'learning_rte'; did you mean 'learning_rate'?
        """
        import difflib

        names = {f.name for f in dataclasses.fields(cls)}
        for key in values:
            if key not in names:
                close = difflib.get_close_matches(key, sorted(names), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"Unknown PPOConfig field {key!r}{hint}")
        return cls(**dict(values))

    def to_json(self) -> str:
        """Serialise to JSON."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @staticmethod
    def help() -> dict[str, str]:
        """Return the help text of every field."""
        return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(PPOConfig)}

    @staticmethod
    def sections() -> dict[str, list[str]]:
        """The field names of each group of :data:`SECTIONS`, in field order.

        Example:
            >>> PPOConfig.sections()["KL penalty"][:2]
            ['kl_coef', 'adaptive_kl']
        """
        starts = {first: title for title, first in SECTIONS}
        groups: dict[str, list[str]] = {}
        title = SECTIONS[0][0]
        for f in dataclasses.fields(PPOConfig):
            title = starts.get(f.name, title)
            groups.setdefault(title, []).append(f.name)
        return groups


def config_reference(default_text: Any = None) -> str:
    """Markdown tables of every ``PPOConfig`` field by group: name, default and help.

    ``default_text(field)`` words a field's default as ``textgym train`` and
    :meth:`PPOConfig.for_env` set it; where that differs from ``PPOConfig()``'s, both are
    shown. docs/training.md holds this text (tested).
    """
    fields = {f.name: f for f in dataclasses.fields(PPOConfig)}
    plain = PPOConfig().to_dict()

    def default_of(f: dataclasses.Field[Any]) -> str:
        bare = repr(plain[f.name])
        given = default_text(f) if default_text is not None else bare
        return given if given == bare else f"{given} (`PPOConfig()`: {bare})"

    lines: list[str] = []
    for title, names in PPOConfig.sections().items():
        lines += [f"**{title}**", "", "| setting | default | what it does |", "|---|---|---|"]
        for name in names:
            text = fields[name].metadata.get("help", "").replace("|", "\\|")
            default = default_of(fields[name]).replace("|", "\\|")
            lines.append(f"| `{name}` | {default} | {text} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def _check(config: PPOConfig, name: str, ok: bool, expected: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {expected}, got {getattr(config, name)!r}")
