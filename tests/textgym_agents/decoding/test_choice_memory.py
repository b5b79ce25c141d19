"""Choice decoding over large action sets: bounded memory, one prompt pass, same numbers.

A prompt with more than ``choice_batch_size`` valid replies runs once and its replies are
scored on top of it in pieces; with gradients (the PPO update, whose loss takes the softmax
over every reply) each piece is checkpointed, so memory holds one piece's activations however
many replies there are.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from textgym import TextEnvWrapper
from textgym.parsers import ActionParseError, ActionParser
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.decoding import scoring
from textgym_agents.testing import tiny_model


class NamedActions(ActionParser):
    """Replies ``a0000``, ``a0001``, ...: one per action, with a short instruction."""

    def __init__(self, n: int) -> None:
        self.names = [f"a{i:04d}" for i in range(n)]

    def parse(self, text: str) -> int:
        if text.strip() not in self.names:
            raise ActionParseError("unknown action")
        return self.names.index(text.strip())

    def instructions(self) -> str:
        return "Reply with an action name."

    def choices(self) -> list[str]:
        return list(self.names)


class OneTurn(gym.Env):
    """One step over ``Discrete(n)``: action ``k`` pays ``k % 2``."""

    observation_space = gym.spaces.Discrete(2)

    def __init__(self, n: int) -> None:
        self.action_space = gym.spaces.Discrete(n)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action):
        return 1, float(action % 2), True, False, {}


def named_env(n: int) -> TextEnvWrapper:
    return TextEnvWrapper(
        OneTurn(n), formatter="State {obs}.", parser=NamedActions(n), system_prompt="Pick."
    )


def choice_policy(dtype: torch.dtype = torch.float32, **overrides) -> PPOPolicy:
    values = dict(decoding="choices", num_steps=1, minibatch_size=2, micro_batch_size=2)
    values.update(num_epochs=1, progress=False, kl_coef=0.0, seed=0)
    values.update(overrides)
    return PPOPolicy(*tiny_model(dtype=dtype), config=PPOConfig(**values))


def prompts_and_choices(policy: PPOPolicy, sizes: list[int]):
    prompts = [
        policy.encode([{"role": "user", "content": f"state {i}, pick one"}])
        for i in range(len(sizes))
    ]
    choices = [policy.choice_ids(NamedActions(n).names) for n in sizes]
    return prompts, choices


def lora_grads(policy: PPOPolicy, scores) -> list[torch.Tensor]:
    policy.model.zero_grad(set_to_none=True)
    loss = sum((row.exp() * torch.arange(len(row))).sum() for row in scores.logps)
    (loss + scores.values.sum()).backward()
    return [p.grad.clone() for p in policy.model.parameters() if p.requires_grad]


def test_many_choices_in_checkpointed_pieces_match_one_pass():
    """Pieces of 16 (prompt once, checkpointed) give the values and gradients of one pass."""
    policy = choice_policy()
    with torch.no_grad():  # LoRA B away from zero, so the adapter's gradients are non-trivial
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
    prompts, choices = prompts_and_choices(policy, [40, 3, 70])
    runs = []
    original = scoring.run_rows

    def counting(*args, **kwargs):
        runs.append(len(args[1]))
        return original(*args, **kwargs)

    policy.config.choice_batch_size = 16
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scoring, "run_rows", counting)
        pieces = policy.score_choices(prompts, choices, values=True)
    # the two large prompts ran once each (no re-run per piece); the small one in a group
    assert sorted(runs) == [1, 1, 1]
    piece_grads = lora_grads(policy, pieces)
    policy.config.choice_batch_size = 200
    whole = policy.score_choices(prompts, choices, values=True)
    whole_grads = lora_grads(policy, whole)
    for a, b in zip(pieces.logps, whole.logps, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pieces.values, whole.values, atol=1e-5, rtol=1e-5)
    for a, b in zip(piece_grads, whole_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert any(g.abs().sum() > 0 for g in piece_grads)


def test_checkpointed_calls_compute_what_unchecked_ones_do():
    """With gradients a large set's pieces and the groups beside them are checkpointed; the
    values stay those of the same calls without gradients, bit for bit."""
    policy = choice_policy(choice_batch_size=4)
    prompts, choices = prompts_and_choices(policy, [3, 3, 9])  # two groups, three pieces
    with torch.no_grad():
        plain = policy.score_choices(prompts, choices, values=True)
    checkpointed = policy.score_choices(prompts, choices, values=True)
    for a, b in zip(checkpointed.logps, plain.logps, strict=True):
        assert torch.equal(a.detach(), b)
    assert torch.equal(checkpointed.values.detach(), plain.values)
    assert all(g.isfinite().all() for g in lora_grads(policy, checkpointed))


@pytest.mark.slow
def test_bf16_checkpointed_pieces_give_the_gradient_of_kept_ones():
    """Mixed precision: the backward pass recomputes a piece under the forward's autocast."""
    policy = choice_policy(torch.bfloat16, choice_batch_size=8)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
    prompts, choices = prompts_and_choices(policy, [20])
    checkpointed = lora_grads(policy, policy.score_choices(prompts, choices, values=True))
    with pytest.MonkeyPatch.context() as patch:  # the same calls, all kept for the backward
        patch.setattr("textgym_agents.decoding.choices._Runner.__call__", lambda self, f, *a: f(*a))
        kept = lora_grads(policy, policy.score_choices(prompts, choices, values=True))
    for a, b in zip(checkpointed, kept, strict=True):
        assert torch.equal(a, b)


def test_small_choice_sets_are_not_checkpointed(monkeypatch):
    """At most choice_batch_size choices per prompt: each group runs once in the update too."""
    policy = choice_policy(choice_batch_size=4)
    prompts, choices = prompts_and_choices(policy, [3, 3, 2])  # three groups, none split
    calls = []
    original = scoring.PolicyScoring._choice_scorer

    def counting(self, *args):
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(scoring.PolicyScoring, "_choice_scorer", counting)
    lora_grads(policy, policy.score_choices(prompts, choices, values=True))
    assert len(calls) == 3  # no recomputation in the backward pass


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize(
    ("dtype", "gradient_checkpointing"),
    [
        (torch.float32, False),
        (torch.float32, True),
        pytest.param(torch.bfloat16, False, marks=pytest.mark.slow),  # ~20 s: bf16 on a CPU
    ],
    ids=["fp32", "fp32-gradient-checkpointing", "bf16-mixed-precision"],
)
@pytest.mark.slow
def test_first_ratio_is_exactly_one_with_many_choices(
    reuse, dtype, gradient_checkpointing, policy_loss_calls
):
    """Rollout, scoring pass and the first epoch score a large choice set the same way."""
    policy = choice_policy(
        dtype,
        choice_batch_size=16,
        reuse_rollout_scores=reuse,
        gradient_checkpointing=gradient_checkpointing,
    )
    envs = gym.vector.SyncVectorEnv([lambda: named_env(50), lambda: named_env(50)])
    trainer = PPOTrainer(policy, envs)
    metrics = trainer.update(trainer.collect())
    new, old, mask = policy_loss_calls[0]
    assert mask.sum() == 2
    assert torch.equal(new * mask, old * mask)
    assert metrics["policy/ratio_mean"] == 1.0


PEAK_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    import torch
    from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
    from textgym_agents.testing import tiny_model
    sys.path.insert(0, sys.argv[2])
    from test_choice_memory import named_env

    torch.manual_seed(0)
    config = PPOConfig(
        decoding="choices", num_steps=1, minibatch_size=1, micro_batch_size=1, num_epochs=1,
        kl_coef=0.0, progress=False,
    )
    policy = PPOPolicy(*tiny_model(), config=config)
    trainer = PPOTrainer(policy, named_env(int(sys.argv[1])))
    start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    buffer = trainer.collect()
    rollout = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    trainer.update(buffer)
    update = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    growth = {"rollout_mb": (rollout - start) / 1024, "update_mb": (update - start) / 1024}
    print(json.dumps(growth))
    """
)


def peak_growth_mb(num_actions: int) -> dict[str, float]:
    """Peak RSS growth (MiB, Linux ru_maxrss) of one 1-turn episode and its update."""
    here = str(Path(__file__).parent)
    result = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, str(num_actions), here],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in KiB on Linux")
def test_peak_memory_does_not_grow_with_the_number_of_choices():
    """Discrete(1024) named actions: memory of 16 pieces of 64, not of 1,024 scored at once.

    Before pieces were checkpointed, the update of this one turn held the activations of every
    piece for the backward pass, growing linearly with the number of replies: peak RSS grew
    by 245 MB with 64 replies, 516 MB with 256 and 1,448 MB with 1,024 (4.8 GB with
    TextEnvWrapper's default instructions, which list every action name). Now: 267, 307 and
    367 MB (445 MB with 4,096): one piece's logits (64 replies x 6 tokens x 49,152 vocabulary)
    and their gradients, plus the prompt's pass. Measured on a 2-core AMD EPYC, tiny model.
    """
    small, large = peak_growth_mb(64), peak_growth_mb(1024)
    assert large["update_mb"] < 800, (small, large)
    assert large["update_mb"] - small["update_mb"] < 300, (small, large)
    assert large["rollout_mb"] < 400, (small, large)
