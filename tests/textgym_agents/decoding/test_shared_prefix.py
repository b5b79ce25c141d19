"""Generation's key/value caches: room kept for new tokens, and rows carried between calls."""

import pytest
import torch
from transformers import DynamicCache

from textgym_agents import PPOConfig, PPOPolicy
from textgym_agents.decoding.shared_prefix import common_prefix_length, growing_cache
from textgym_agents.testing import tiny_model

SYSTEM = {"role": "system", "content": "You are a calculator agent. Answer in JSON, briefly."}
QUESTIONS = ["What is 12 * 7?", "What is 3 + 4 + 5 + 6?", "Compute 100 / 8, please."]


@pytest.fixture
def policy():
    return PPOPolicy(*tiny_model(), config=PPOConfig(max_new_tokens=6))


def test_a_growing_cache_holds_what_a_dynamic_one_does():
    torch.manual_seed(0)
    source = DynamicCache()
    source.update(torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8), 0)
    grown, plain = growing_cache(3, source), DynamicCache()
    plain.update(source.layers[0].keys, source.layers[0].values, 0)
    for length in (1, 1, 1, 5, 1):  # the 5 outgrows the room kept: the buffer is replaced
        keys, values = torch.randn(2, 3, length, 8), torch.randn(2, 3, length, 8)
        got, expected = grown.update(keys, values, 0), plain.update(keys, values, 0)
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)
    assert grown.get_seq_length() == plain.get_seq_length() == 13
    assert torch.equal(source.layers[0].keys, plain.layers[0].keys[:, :, :4])  # source unchanged


def test_greedy_generation_equals_transformers_generate(policy):
    conversation = [{"role": "user", "content": QUESTIONS[0]}]
    reply = policy.generate([conversation], greedy=True).response_ids[0]
    prompt = torch.tensor([policy.encode(conversation)])
    with torch.no_grad():
        plain = policy.model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=6,
            do_sample=False,
            top_k=None,
            pad_token_id=policy.tokenizer.pad_token_id,
            eos_token_id=sorted(policy.eos_ids),
        )
    assert reply == plain[0, prompt.shape[1] :].tolist()[: len(reply)]


def tokens_run(policy):
    """Count the tokens each forward pass of the policy's decoder runs."""
    counts = []
    handle = policy._decoder().register_forward_pre_hook(
        lambda module, args, kwargs: counts.append(kwargs["input_ids"].numel()), with_kwargs=True
    )
    return counts, handle


def continued(chats, generation):
    """Each conversation, its reply and a new observation: the episode's next prompt."""
    return [
        chat + [{"role": "assistant", "content": text}, {"role": "user", "content": "Result: 84"}]
        for chat, text in zip(chats, generation.texts, strict=True)
    ]


def test_prompts_continuing_the_last_calls_rows_run_only_their_new_tokens(policy):
    first = [[SYSTEM, {"role": "user", "content": q}] for q in QUESTIONS]
    with policy.carrying_caches():
        second = continued(first, policy.generate(first, greedy=True))
        kept = [tokens for tokens, _ in policy._carried.rows]
        counts, handle = tokens_run(policy)
        carried = policy.generate(second, greedy=True)
        handle.remove()
        fresh_episode = [SYSTEM, {"role": "user", "content": "What is 9 - 2?"}]
        assert policy.generate([fresh_episode], greedy=True).texts  # no row continues it
    counts_plain, handle = tokens_run(policy)
    plain = policy.generate(second, greedy=True)
    handle.remove()
    assert carried.response_ids == plain.response_ids
    assert len({tuple(r) for r in plain.response_ids}) > 1
    # Each row first ran the tokens past what its kept row holds, but its last one (which
    # generate() runs for every row): the reply's last token and the new observation.
    prompts = carried.prompt_ids
    new = [len(p) - 1 - max(common_prefix_length([k, p[:-1]]) for k in kept) for p in prompts]
    assert counts[: len(prompts)] == new
    assert all(0 < n < len(p) // 2 for n, p in zip(new, prompts, strict=True))
    assert sum(counts) < sum(counts_plain)


def test_carried_values_are_the_values_scoring_computes(policy):
    with torch.no_grad():  # a value head that is not zero, so the check can fail
        policy.value_head.summary.weight.normal_()
    first = [[SYSTEM, {"role": "user", "content": q}] for q in QUESTIONS]
    assert policy.carried_values([[1, 2, 3]]) is None  # outside carrying_caches
    with policy.carrying_caches():
        second = continued(first, policy.generate(first))
        prompts = [policy.encode(chat) for chat in second]
        prompts.append(policy.encode([{"role": "user", "content": "unrelated"}]))
        values = policy.carried_values(prompts)
    expected = policy.prompt_values(prompts).cpu()
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(torch.tensor(values), expected, atol=1e-4, rtol=1e-4)


def test_carry_caches_false_runs_every_prompt_in_full(policy):
    policy.config = PPOConfig(max_new_tokens=6, carry_caches=False)
    first = [[SYSTEM, {"role": "user", "content": q}] for q in QUESTIONS]
    with policy.carrying_caches():
        second = continued(first, policy.generate(first, greedy=True))
        counts, handle = tokens_run(policy)
        policy.generate(second, greedy=True)
        handle.remove()
        assert policy.carried_values([[1, 2]]) is None
    counts_plain, handle = tokens_run(policy)
    policy.generate(second, greedy=True)
    handle.remove()
    assert sum(counts) == sum(counts_plain)


def test_an_evaluation_carries_caches_and_plays_the_same_episodes():
    import gymnasium as gym

    import textgym  # noqa: F401
    from textgym_agents import evaluate

    results, tokens = [], []
    for carry in (True, False):
        policy = PPOPolicy(*tiny_model(), config=PPOConfig(max_new_tokens=6, carry_caches=carry))
        counts, handle = tokens_run(policy)
        env = gym.make("textgym/Calculator-v0")
        results.append(evaluate(policy, env, 3, num_envs=3, seed=5))
        handle.remove()
        tokens.append(sum(counts))
    carried, plain = results
    played = [[(e.episode_return, e.length) for e in r.episodes] for r in results]
    assert played[0] == played[1]
    assert max(e.length for e in plain.episodes) > 1  # multi-turn: something to carry
    assert tokens[0] < tokens[1]
