"""The GPU tier: training, decoding and checkpoints on CUDA (skipped without an NVIDIA GPU).

Run it with ``pytest -m cuda`` on a machine with a GPU; everything needed is the tiny model
built here, so nothing is downloaded.
"""

import math

import gymnasium as gym
import pytest
import torch

import textgym  # noqa: F401
from textgym.episodes import reply_choices, reply_schemas
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.runfiles.checkpoint import latest_checkpoint
from textgym_agents.testing import tiny_model

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


DEVICE = "cuda"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """The tiny model on disk: a policy loaded from it can be saved and loaded elsewhere."""
    path = tmp_path_factory.mktemp("tiny")
    model, tokenizer = tiny_model(num_kv_heads=2)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def cuda_policy(path, **settings):
    values = dict(num_steps=2, max_new_tokens=6, minibatch_size=8, micro_batch_size=4, seed=0)
    values.update(kl_coef=0.0, progress=False)
    config = PPOConfig(**{**values, **settings})
    return PPOPolicy.from_pretrained(path, dtype="bfloat16", device=DEVICE, config=config)


@pytest.mark.parametrize(
    "settings",
    [
        {"decoding": "free"},
        # every turn trained, so the first update's first step is the first policy_loss call
        {
            "decoding": "choices",
            "advantage_estimator": "grpo",
            "group_size": 2,
            "drop_zero_advantage": False,
        },  # fmt: skip
    ],
    ids=["ppo-free", "grpo-choices"],
)
def test_updates_train_on_cuda_in_bf16_with_a_first_ratio_of_one(
    tiny_path, settings, policy_loss_calls
):
    policy = cuda_policy(tiny_path, reuse_rollout_scores=False, **settings)
    assert policy.device.type == DEVICE
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    for _ in range(3):
        metrics = trainer.step()
        assert math.isfinite(metrics["loss/total"])
    new, old, mask = policy_loss_calls[0]
    assert new.device.type == DEVICE and mask.sum() > 0
    torch.testing.assert_close(new * mask, old * mask, atol=0.0, rtol=0)  # one layout


def test_choice_and_constrained_decoding_run_on_cuda(tiny_path):
    env = gym.make("textgym/Blackjack-v1")
    messages, _ = env.reset(seed=0)
    choices = cuda_policy(tiny_path, decoding="choices")
    assert choices.act(messages, choices=reply_choices(env)) in reply_choices(env)
    constrained = cuda_policy(tiny_path, decoding="constrained", max_new_tokens=12)
    reply = constrained.act(messages, schemas=reply_schemas(env))
    assert env.step(reply)[4]["invalid"] is False


def test_a_checkpoint_written_on_cuda_resumes_on_cpu(tiny_path, tmp_path):
    run = tmp_path / "run"
    policy = cuda_policy(tiny_path, decoding="choices", save_every=1)
    policy.learn(gym.make_vec("textgym/Blackjack-v1", num_envs=4), 4, output_dir=run)
    on_cpu = PPOPolicy.load(latest_checkpoint(run), device="cpu")
    assert on_cpu.device.type == "cpu"
    prompt = [on_cpu.encode([{"role": "user", "content": "hit?"}])]
    with torch.no_grad():
        cpu_logps = on_cpu.score(prompt, [[1, 2]]).logps
        gpu_logps = policy.score(prompt, [[1, 2]]).logps.cpu()
    torch.testing.assert_close(cpu_logps, gpu_logps, atol=0.1, rtol=0)  # bf16 on two devices
