"""Tiny, offline stand-ins for the real model, for tests and benchmarks that must run in seconds.

`load_tokenizer` gives the embedded SmolLM2 tokenizer; `tiny_model` a random Llama that uses it
(`logits_of` reads its logits on a text; `perturb_adapter` makes a fresh policy's adapter and
value head matter);
`PayingChoice` a one-step env where one of two actions always pays (`paying_choice_env` as text,
`paying_choice_policy` a tiny model that can learn it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import torch

from textgym_agents.model.loading import (
    EMBEDDED_MODEL,
    cache_dir,
    embedded_gguf_path,
    load_or_build_cache,
    prepare_tokenizer,
)

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase


def load_tokenizer() -> PreTrainedTokenizerBase:
    """Return the embedded model's tokenizer, left-padded, with a pad token.

    The first call reads the GGUF file (~5 s) and caches the tokenizer under
    ``cache_dir()/tokenizers``; later calls load that copy in ~0.1 s.

    Example:
        >>> tokenizer = load_tokenizer()
        >>> tokenizer.pad_token, tokenizer.padding_side
        ('<|im_end|>', 'left')
    """
    from transformers import AutoTokenizer

    gguf = embedded_gguf_path()

    def build(tmp: Path) -> PreTrainedTokenizerBase:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer.save_pretrained(tmp)
        return tokenizer

    path = cache_dir() / "tokenizers" / EMBEDDED_MODEL
    required = ["tokenizer_config.json", "tokenizer.json"]
    return prepare_tokenizer(
        load_or_build_cache(path, gguf, required, AutoTokenizer.from_pretrained, build)
    )


def tiny_model(
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    tie_word_embeddings: bool = True,
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """Build a small random Llama over ``tokenizer``'s vocabulary (the embedded one by default).

    The weights are seeded without touching the global RNG; embeddings are tied like SmolLM2's
    unless ``tie_word_embeddings=False``, and the tokenizer's bos/eos/pad ids are set in the
    config and generation config. ``num_kv_heads`` below ``num_heads`` gives grouped-query
    attention like SmolLM2's (default: one key/value head per query head).

    Example:
        >>> model, tokenizer = tiny_model()
        >>> model.config.vocab_size == len(tokenizer), model.training
        (True, False)
    """
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    for name, value in [("hidden_size", hidden_size), ("num_layers", num_layers)]:
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"Expected {name} to be a positive int, got {value!r}")
    if not isinstance(num_heads, int) or num_heads < 1 or hidden_size % num_heads:
        raise ValueError(
            f"Expected num_heads to be a positive int dividing hidden_size={hidden_size}, "
            f"got {num_heads!r}"
        )
    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if not isinstance(kv_heads, int) or kv_heads < 1 or num_heads % kv_heads:
        raise ValueError(
            f"Expected num_kv_heads to be a positive int dividing num_heads={num_heads}, "
            f"got {num_kv_heads!r}"
        )
    tokenizer = prepare_tokenizer(load_tokenizer() if tokenizer is None else tokenizer)
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=tie_word_embeddings,
        # With tied embeddings and the usual 0.02 init, the residual stream is dominated by
        # the input embedding, so greedy decoding just repeats the last prompt token; a wider
        # init makes the random model's outputs vary, which tests of generation need.
        initializer_range=0.2,
        **ids,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(**ids)
    return model.to(dtype).eval(), tokenizer


def perturb_adapter(policy: Any, *, scale: float = 0.1, seed: int = 0) -> Any:
    """Move LoRA B and the value head away from their zero init (so both change outputs).

    A fresh adapter is a no-op and a fresh value head returns 0, which hides mistakes in
    whatever reads them; returns ``policy``.

    Example:
        >>> from textgym_agents import PPOPolicy
        >>> policy = perturb_adapter(PPOPolicy(*tiny_model()))
        >>> bool(policy.value_head.summary.weight.abs().sum() > 0)
        True
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
        for param in policy.value_head.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * scale)
    return policy


def logits_of(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    text: str = "The quick brown fox jumps over the lazy dog.",
) -> torch.Tensor:
    """Next-token logits ``(1, T, vocab)`` of ``model`` on ``text``, without gradients.

    Example:
        >>> model, tokenizer = tiny_model(word_tokenizer(["a", "b"]))
        >>> logits_of(model, tokenizer, "a b").shape[:2]
        torch.Size([1, 2])
    """
    input_ids = tokenizer(text, return_tensors="pt").input_ids.to(model.device)
    with torch.no_grad():
        return model(input_ids).logits


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerBase:
    """A word-level tokenizer over ``words`` plus chat markers, with a chat template.

    With a vocabulary this small, a random model already writes the words often, so a test
    can check that PPO makes it prefer the paying one within a few updates.

    Example:
        >>> tokenizer = word_tokenizer(["yes", "no"])
        >>> tokenizer.decode(tokenizer.encode("yes no"))
        'yes no'
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = ["<unk>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant"]
    vocab = {word: i for i, word in enumerate(dict.fromkeys(special + list(words)))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
    )
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
        "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    return prepare_tokenizer(tokenizer)


class PayingChoice(gym.Env[int, int]):
    """One-step bandit over four observations: action 1 ("yes") pays 1, action 0 ("no") pays 0.

    Learning tests check that PPO makes a tiny model prefer the paying reply.

    Example:
        >>> env = PayingChoice()
        >>> obs, _ = env.reset(seed=0)
        >>> env.step(1)[1:3], env.step(0)[1]
        ((1.0, True), 0.0)
    """

    observation_space = gym.spaces.Discrete(4)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[int, dict]:
        """Draw one of the four observations."""
        super().reset(seed=seed)
        self.obs = int(self.np_random.integers(4))
        return self.obs, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict]:
        """End the episode, paying 1 for action 1."""
        return self.obs, float(action == 1), True, False, {"is_success": bool(action == 1)}


PAYING_WORDS = ["yes", "no", "maybe", "ok", "red", "green", "blue", "gray"]
"""Vocabulary of :func:`paying_choice_policy`: the replies, and a word per observation."""


def paying_choice_env() -> gym.Env:
    """:class:`PayingChoice` as a text env: "red choose" ... "gray choose", replies no / yes."""
    from textgym import TextEnvWrapper

    return TextEnvWrapper(
        PayingChoice(),
        formatter=lambda obs, info: f"{PAYING_WORDS[4 + obs]} choose",
        action_names=["no", "yes"],
        system_prompt="answer",
        invalid_penalty=0.1,
        max_invalid=1,
    )


PAYING_CHOICE_SETTINGS = {
    "num_steps": 1,
    "max_new_tokens": 1,
    "minibatch_size": 16,
    "micro_batch_size": 16,
    "num_epochs": 4,
    "learning_rate": 1e-2,
    "kl_coef": 0.0,
    "seed": 0,
}
"""PPO settings under which :func:`paying_choice_policy` learns within a few updates (16 envs)."""


def paying_choice_policy(**settings: Any) -> Any:
    """A tiny word-level model that starts near uniform, LoRA on every linear layer.

    It samples every word from the first update, so a learning test sees within a few updates
    whether training makes it prefer "yes" in :func:`paying_choice_env`. ``settings`` override
    :data:`PAYING_CHOICE_SETTINGS`.
    """
    from textgym_agents.policy import PPOPolicy
    from textgym_agents.ppo.config import PPOConfig

    config = PPOConfig(**{**PAYING_CHOICE_SETTINGS, **settings})

    torch.manual_seed(0)  # LoRA init and sampling: not whatever earlier tests left
    model, tokenizer = tiny_model(word_tokenizer(PAYING_WORDS), tie_word_embeddings=False)
    with torch.no_grad():  # a near-uniform start
        model.lm_head.weight.mul_(0.1)
    linear = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return PPOPolicy(model, tokenizer, config=config, lora={"target_modules": [*linear, "lm_head"]})
