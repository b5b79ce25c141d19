"""Choice decoding: every reply is one of the env's valid replies, and PPO trains on it."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import textgym  # noqa: F401
from textgym import TextEnvWrapper
from textgym.parsers import ActionParseError, ActionParser
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer, evaluate
from textgym_agents.decoding.choices import choice_token_ids, score_choices
from textgym_agents.ppo import core
from textgym_agents.ppo.rollout import reply_choices
from textgym_agents.testing import PayingChoice, tiny_model, word_tokenizer

WORDS = ["yes", "no", "maybe", "red", "green", "blue", "gray", "choose"]


class WordParser(ActionParser):
    """Bare words as actions, so the word-level test tokenizer can spell every choice."""

    def __init__(self, words):
        self.words = list(words)

    def parse(self, text):
        if text.strip() not in self.words:
            raise ActionParseError(f"expected one of {self.words}")
        return self.words.index(text.strip())

    def instructions(self):
        return "answer"

    def choices(self):
        return list(self.words)


def paying_env():
    return TextEnvWrapper(
        PayingChoice(),
        formatter=lambda obs, info: f"{WORDS[3 + obs]} choose",
        parser=WordParser(["no", "yes"]),
        system_prompt="answer",
    )


def blackjack_policy(**overrides):
    values = dict(num_steps=2, minibatch_size=8, micro_batch_size=4, decoding="choices", seed=0)
    values.update(overrides)
    return PPOPolicy(*tiny_model(), config=PPOConfig(**values))


def conversation(text="hit or stick?"):
    return [{"role": "system", "content": "play"}, {"role": "user", "content": text}]


def test_choice_token_ids_reject_bad_choice_sets():
    tokenizer = word_tokenizer(["go", "left", "right"])
    with pytest.raises(ValueError, match="does not start with the reply prefix"):
        choice_token_ids(tokenizer, ["left"], "go ", 2)
    with pytest.raises(ValueError, match="same tokens"):
        choice_token_ids(tokenizer, ["left", "left"], "", 2)
    with pytest.raises(ValueError, match="at least one"):
        choice_token_ids(tokenizer, [], "", 2)


def test_probabilities_sum_to_one_and_chunking_does_not_change_them():
    policy = blackjack_policy()
    prompts = [policy.encode(conversation(t)) for t in ["a", "bb", "a longer question"]]
    choices = [
        policy.choice_ids(["stick", "hit"]),
        policy.choice_ids(["left", "down", "right", "up"]),
        policy.choice_ids(["x"]),
    ]
    with torch.no_grad():
        whole = policy.score_choices(prompts, choices, values=True)
        chunked = score_choices(policy._choice_scorer, prompts, choices, values=True, batch_size=1)
    for row, other, options in zip(whole.logps, chunked.logps, choices, strict=True):
        assert row.shape == (len(options),)
        assert torch.isclose(row.exp().sum(), torch.tensor(1.0), atol=1e-5)
        torch.testing.assert_close(row, other, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(whole.values, chunked.values, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        plain_values = policy.prompt_values(prompts)
    torch.testing.assert_close(whole.values, plain_values, atol=1e-5, rtol=1e-5)


def test_a_repeated_prompt_runs_once_and_its_rows_share_scores_and_gradients(monkeypatch):
    """share_repeated_prompts: the same log-probs, values and LoRA gradients as a row per turn."""
    prompts_text = ["a", "bb", "a", "a", "bb", "a longer question"]
    results = {}
    for share in (True, False):
        policy = blackjack_policy(share_repeated_prompts=share)
        prompts = [policy.encode(conversation(t)) for t in prompts_text]
        choices = [policy.choice_ids(["stick", "hit"])] * 5 + [policy.choice_ids(["x", "y"])]
        rows = []
        scorer = policy._choice_scorer
        monkeypatch.setattr(
            policy,
            "_choice_scorer",
            lambda p, c, v, s=scorer, r=rows: r.append(len(p)) or s(p, c, v),
        )
        scores = policy.score_choices(prompts, choices, values=True)
        picked = [0, 1, 1, 0, 1, 0]  # rows 0, 2, 3 show one prompt and differ in their pick
        loss = scores.chosen(picked).mul(torch.arange(1.0, 7.0)).sum() + scores.values.sum()
        loss.backward()
        grads = {
            n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None
        }
        results[share] = (sum(rows), scores, grads)
    (shared_rows, shared, shared_grads), (rows, single, grads) = results[True], results[False]
    assert (shared_rows, rows) == (3, 6)
    for a, b in zip(shared.logps, single.logps, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared.values, single.values, atol=1e-5, rtol=1e-5)
    assert grads and shared_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4)


def test_hundreds_of_choices_in_bounded_pieces():
    policy = blackjack_policy(choice_batch_size=64)
    words = [f"{a}{b}" for a in "abcdefghijklmnopqrstuvwxyz" for b in "0123456789xyz"][:300]
    choices = [policy.choice_ids(words), policy.choice_ids(["stick", "hit"])]
    prompts = [policy.encode(conversation("pick a word")), policy.encode(conversation("b"))]
    calls = []

    def scorer(group_prompts, group_choices, values):
        calls.append(sum(len(c) for c in group_choices))
        return policy._choice_scorer(group_prompts, group_choices, values)

    with torch.no_grad():
        pieces = score_choices(scorer, prompts, choices, values=True, batch_size=64)
        whole = score_choices(policy._choice_scorer, prompts, choices, values=True, batch_size=400)
    assert max(calls) <= 64 and sum(calls) == 302
    assert pieces.logps[0].shape == (300,)
    for a, b in zip(pieces.logps, whole.logps, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pieces.values, whole.values, atol=1e-5, rtol=1e-5)
    assert pieces.values.shape == (2,)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("system", ["play", "play " * 40])  # the long one is a shared prefix
def test_cached_choice_scores_match_full_sequences(attention, system):
    """Each prompt runs once, its choices packed on its cache: same numbers as whole sequences."""
    policy = blackjack_policy()
    policy.model.set_attn_implementation(attention)
    texts = ["a", "a much longer question here", "b"]
    prompts = [
        policy.encode([{"role": "system", "content": system}, {"role": "user", "content": t}])
        for t in texts
    ]
    choices = [
        policy.choice_ids(["stick", "hit me now"]),
        policy.choice_ids(["up", "x y z w", "x y", "q"]),
        policy.choice_ids(["one"]),
    ]
    with torch.no_grad():
        scores = policy.score_choices(prompts, choices)
        for prompt, options, logps in zip(prompts, choices, scores.logps, strict=True):
            full = policy.score([prompt] * len(options), options, values=False)
            totals = (full.logps * full.mask).sum(dim=1)
            torch.testing.assert_close(logps, totals.log_softmax(0), atol=1e-5, rtol=1e-5)


def test_temperature_divides_the_choice_scores_not_each_token():
    """T flattens the distribution over valid replies; the most likely reply stays the same."""
    prompts = [conversation("a"), conversation("b c")]
    choices_text = ["stick", "hit me now", "up"]
    cold, hot = blackjack_policy(), blackjack_policy(temperature=3.0)
    hot.model.load_state_dict(cold.model.state_dict())
    ids = [cold.encode(p) for p in prompts]
    choices = [cold.choice_ids(choices_text)] * len(ids)
    with torch.no_grad():
        base = cold.score_choices(ids, choices)
        tempered = hot.score_choices(ids, choices)
    for row, hot_row in zip(base.logps, tempered.logps, strict=True):
        torch.testing.assert_close(hot_row, (row / 3.0).log_softmax(0), atol=1e-5, rtol=1e-5)
        assert int(hot_row.argmax()) == int(row.argmax())
        assert -(hot_row.exp() * hot_row).sum() > -(row.exp() * row).sum()  # flatter
    with pytest.raises(ValueError, match="temperature > 0"):
        score_choices(cold._choice_scorer, ids, choices, temperature=0.0)


def test_generate_picks_only_valid_replies():
    policy = blackjack_policy()
    options = ['{"action": "stick"}', '{"action": "hit"}']
    batch = [conversation("a"), conversation("b"), conversation("c")]
    generation = policy.generate(batch, choices=[options] * 3)
    assert all(text in options for text in generation.texts)
    assert generation.choice_ids is not None
    for response, ids in zip(generation.response_ids, generation.choice_ids, strict=True):
        assert response in ids
    # greedy picks the most likely choice of each row
    greedy = policy.generate(batch, choices=[options] * 3, greedy=True)
    with torch.no_grad():
        scores = policy.score_choices(greedy.prompt_ids, greedy.choice_ids)
    assert greedy.texts == [options[int(row.argmax())] for row in scores.logps]
    # act: one conversation takes one list of choices
    assert policy.act(conversation(), choices=options) in options


def test_modes_without_choices(caplog):
    with caplog.at_level("WARNING", logger="textgym_agents.policy"):
        assert isinstance(blackjack_policy(max_new_tokens=3).act(conversation()), str)
    assert "has no valid replies" in caplog.text  # decoded as 'auto' would: free text
    auto = blackjack_policy(decoding="auto", max_new_tokens=3)
    assert isinstance(auto.act(conversation()), str)  # falls back to free text
    free = blackjack_policy(decoding="free", max_new_tokens=3)
    reply = free.act(conversation(), choices=["zzz"])
    assert reply != "zzz" or len(free.tokenizer.encode(reply)) <= 3  # choices ignored
    with pytest.raises(ValueError, match="decoding must be one of"):
        PPOConfig(decoding="beam")


def test_reply_prefix_is_not_scored():
    policy = blackjack_policy(reply_prefix='{"action": "')
    ids = policy.choice_ids(['{"action": "stick"}', '{"action": "hit"}'])
    tokenizer = policy.tokenizer
    assert [tokenizer.decode(i) for i in ids] == ['stick"}<|im_end|>', 'hit"}<|im_end|>']
    reply = policy.act(conversation(), choices=['{"action": "stick"}', '{"action": "hit"}'])
    assert reply in ('{"action": "stick"}', '{"action": "hit"}')


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vector_env_lists_its_choices(mode):
    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=2, vectorization_mode=mode)
    assert reply_choices(envs) == [['{"action": "stick"}', '{"action": "hit"}']] * 2
    envs.close()
    plain = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode=mode)
    assert reply_choices(plain) is None
    plain.reset(seed=0)  # still usable: the workers were not asked for what they lack
    plain.close()


def test_mixed_rows_score_like_separate_calls():
    policy = blackjack_policy()
    prompts = [policy.encode(conversation(t)) for t in ["a", "b", "c"]]
    options = policy.choice_ids(["stick", "hit"])
    free_reply = policy.tokenizer.encode("maybe later", add_special_tokens=False)
    responses = [options[1], free_reply, options[0]]
    with torch.no_grad():
        mixed = policy.score(prompts, responses, choices=[options, None, options])
        alone = policy.score(prompts[1:2], responses[1:2])
        chosen = policy.score(
            [prompts[0], prompts[2]], [options[1], options[0]], choices=[options, options]
        )
    assert mixed.logps.shape == (3, len(free_reply))
    torch.testing.assert_close(mixed.logps[1], alone.logps[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mixed.logps[[0, 2], :1], chosen.logps, atol=1e-5, rtol=1e-5)
    assert mixed.mask[0].tolist() == [1] + [0] * (len(free_reply) - 1)
    with pytest.raises(ValueError, match="not one of"):
        policy.score(prompts[:1], [free_reply], choices=[options])


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_training_with_choices_ratio_one_no_invalid_and_lora_gradients(monkeypatch, temperature):
    policy = blackjack_policy(temperature=temperature)
    calls = []
    original = core.policy_loss

    def spy(new, old, *args, **kwargs):
        calls.append((new.detach().clone(), old.clone(), args[1].clone()))
        return original(new, old, *args, **kwargs)

    monkeypatch.setattr(core, "policy_loss", spy)
    named = policy.model.named_parameters()
    lora_before = {n: p.detach().clone() for n, p in named if "lora_" in n}
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    buffer = trainer.collect()
    assert all(t.choice_ids is not None and t.scored_tokens == 1 for t in buffer)
    metrics = trainer.update(buffer)
    assert metrics["env/invalid_rate"] == 0.0
    new, old, mask = calls[0]
    assert new.shape[1] == 1 and mask.sum() == new.shape[0]
    assert torch.equal(new, old)  # bit-identical on the first minibatch
    named = dict(policy.model.named_parameters())
    assert any(not torch.equal(named[n], p) for n, p in lora_before.items())
    assert 0.0 <= metrics["policy/entropy"] <= np.log(2) + 1e-6


def test_kl_to_reference_with_choices():
    policy = blackjack_policy(kl_coef=0.1)
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    first = trainer.update(trainer.collect())
    assert first["objective/kl"] == 0.0
    for _ in range(2):
        trainer.update(trainer.collect())
    buffer = trainer.collect()
    trainer.score(buffer.turns(), np.arange(len(buffer)))
    trainer.compute_advantages(buffer)
    assert any(abs(t.kl) > 0 for t in buffer)


def test_evaluate_with_choices_has_no_invalid_replies():
    result = evaluate(blackjack_policy(), gym.make("textgym/Blackjack-v1"), n_episodes=8)
    assert result["invalid_rate"] == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bf16: mixed precision
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.slow
def test_policy_learns_to_prefer_paying_choice(seed, dtype):
    """With choices, a tiny model learns that "yes" pays: > 90% of greedy replies."""
    torch.manual_seed(seed)  # choices are sampled with torch's generator
    model, tokenizer = tiny_model(word_tokenizer(WORDS), tie_word_embeddings=False, dtype=dtype)
    with torch.no_grad():  # a near-uniform start: both replies are sampled at first
        model.lm_head.weight.mul_(0.1)
    config = PPOConfig(
        num_steps=1,
        minibatch_size=16,
        micro_batch_size=16,
        num_epochs=4,
        learning_rate=1e-2,
        kl_coef=0.0,
        decoding="choices",
        seed=0,
    )
    policy = PPOPolicy(model, tokenizer, config=config)
    envs = gym.vector.SyncVectorEnv([paying_env for _ in range(16)])
    trainer = PPOTrainer(policy, envs)
    prompts = [paying_env().reset(seed=seed)[0] for seed in range(16)]
    options = [["no", "yes"]] * len(prompts)

    def yes_probability():
        ids = [policy.choice_ids(o) for o in options]
        with torch.no_grad():
            scores = policy.score_choices([policy.encode(p) for p in prompts], ids)
        return float(scores.chosen([1] * len(prompts)).exp().mean())

    assert 0.25 < yes_probability() < 0.75  # it did not start out knowing

    def greedy_yes_rate():
        return np.mean([r == "yes" for r in policy.act(prompts, greedy=True, choices=options)])

    history = []
    for _ in range(20):
        metrics = trainer.step()
        assert metrics["env/invalid_rate"] == 0.0
        history.append((metrics["env/success_rate"], greedy_yes_rate()))
        if history[-1][0] > 0.8 and history[-1][1] > 0.9:
            break
    assert history[-1][1] > 0.9, history
    assert history[-1][0] > 0.8, history
    assert yes_probability() > 0.9
