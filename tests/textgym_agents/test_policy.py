import gymnasium as gym
import pytest
import torch
from peft import PeftModel

import textgym  # noqa: F401
from textgym.episodes import reply_choices
from textgym_agents import PPOConfig, PPOPolicy
from textgym_agents.testing import tiny_model

CONVERSATIONS = [
    [{"role": "user", "content": "Hit or stick?"}],
    [
        {"role": "system", "content": "You play blackjack and answer in JSON."},
        {"role": "user", "content": "Your hand totals 15. The dealer shows a 10. Hit or stick?"},
    ],
    [{"role": "user", "content": "A much longer question " * 5}],
]


@pytest.fixture
def policy():
    model, tokenizer = tiny_model()
    return PPOPolicy(model, tokenizer, config=PPOConfig(max_new_tokens=8))


def test_act_single_and_batch(policy):
    assert isinstance(policy.act(CONVERSATIONS[0]), str)
    replies = policy.act(CONVERSATIONS)
    assert isinstance(replies, list) and len(replies) == 3
    assert all(isinstance(r, str) for r in replies)
    env_batch = tuple(CONVERSATIONS)  # what a vector env returns
    assert len(policy.act(env_batch)) == 3


def test_batched_greedy_generation_equals_one_at_a_time(policy):
    batched = policy.generate(CONVERSATIONS, greedy=True)
    for i, conversation in enumerate(CONVERSATIONS):
        single = policy.generate([conversation], greedy=True)
        assert single.response_ids[0] == batched.response_ids[i]
        assert single.prompt_ids[0] == batched.prompt_ids[i]
    assert len({tuple(r) for r in batched.response_ids}) > 1  # the replies are not trivial


@pytest.mark.parametrize("shared", [True, False])
def test_prefilling_rows_one_at_a_time_generates_what_one_padded_batch_does(
    policy, monkeypatch, shared
):
    """Rows of very different lengths are prefilled alone (no padding); the replies agree."""
    from textgym_agents.decoding import shared_prefix

    system = [{"role": "system", "content": "You play blackjack and answer in JSON, briefly."}]
    chats = [(system if shared else []) + c[-1:] for c in CONVERSATIONS]
    alone = []
    monkeypatch.setattr(shared_prefix, "_prefill_rows", spy(shared_prefix._prefill_rows, alone))
    rows = policy.generate(chats, greedy=True)
    assert len(alone) == 1  # the longest row's own tokens are > 1.25x the mean
    monkeypatch.setattr(shared_prefix, "PREFILL_PADDING_MAX", float("inf"))
    batch = policy.generate(chats, greedy=True)
    assert len(alone) == 1
    assert rows.response_ids == batch.response_ids
    assert len({tuple(r) for r in rows.response_ids}) > 1


def spy(function, calls):
    def wrapper(*args, **kwargs):
        calls.append(args)
        return function(*args, **kwargs)

    return wrapper


def test_responses_stop_at_eos_and_respect_max_new_tokens(policy):
    generation = policy.generate(CONVERSATIONS * 4)
    eos = policy.tokenizer.eos_token_id
    for response in generation.response_ids:
        assert 1 <= len(response) <= 8
        assert eos not in response[:-1]


def test_score_matches_a_naive_full_forward(policy):
    generation = policy.generate(CONVERSATIONS)
    with torch.no_grad():
        scores = policy.score(generation.prompt_ids, generation.response_ids, with_entropy=True)
    for row, (prompt, response) in enumerate(
        zip(generation.prompt_ids, generation.response_ids, strict=True)
    ):
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0].float()
        logps = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
        expected = logps.gather(1, torch.tensor(response)[:, None])[:, 0]
        torch.testing.assert_close(
            scores.logps[row, : len(response)], expected, rtol=1e-4, atol=1e-4
        )
        assert scores.mask[row].sum() == len(response)
    assert scores.values.shape == (3,)
    assert scores.entropy.shape == scores.logps.shape


def test_shared_system_prompt_path_matches_naive_forward_and_trains(policy):
    system = {"role": "system", "content": "You are playing blackjack against the dealer. " * 4}
    batch = [[system, {"role": "user", "content": f"Your hand totals {n}."}] for n in (4, 12, 20)]
    generation = policy.generate(batch)
    prompts, responses = generation.prompt_ids, generation.response_ids
    assert min(len(p) for p in prompts) > 40
    from textgym_agents.decoding.shared_prefix import SHARED_PREFIX_MIN, common_prefix_length

    assert common_prefix_length(prompts) >= SHARED_PREFIX_MIN  # the shared-prefix path is taken
    for param in policy.value_head.parameters():
        torch.nn.init.normal_(param)
    scores = policy.score(prompts, responses)
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        with torch.no_grad():
            logits = policy.model(input_ids=torch.tensor([prompt + response])).logits[0]
        expected = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), -1)
        expected = expected.gather(1, torch.tensor(response)[:, None])[:, 0]
        torch.testing.assert_close(
            scores.logps[row, : len(response)].detach(), expected, rtol=1e-4, atol=1e-4
        )
    with torch.no_grad():
        one_by_one = torch.cat([policy.prompt_values([p]) for p in prompts])
    torch.testing.assert_close(
        policy.prompt_values(prompts).detach(), one_by_one, rtol=1e-4, atol=1e-4
    )
    # gradients through the shared prefix's cache equal those of plain full forwards
    lora_b = [p for n, p in policy.model.named_parameters() if "lora_B" in n]
    shared_grads = torch.autograd.grad((scores.logps * scores.mask).sum(), lora_b)
    naive_total = 0
    for prompt, response in zip(prompts, responses, strict=True):
        logits = policy.model(input_ids=torch.tensor([prompt + response])).logits[0]
        logps = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), -1)
        naive_total = naive_total + logps.gather(1, torch.tensor(response)[:, None]).sum()
    naive_grads = torch.autograd.grad(naive_total, lora_b)
    assert any(g.abs().sum() > 0 for g in naive_grads)
    for a, b in zip(shared_grads, naive_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def test_temperature_scales_logps(policy):
    generation = policy.generate(CONVERSATIONS[:1])
    with torch.no_grad():
        cold = policy.score(generation.prompt_ids, generation.response_ids).logps
        policy.config.temperature = 0.5
        hot = policy.score(generation.prompt_ids, generation.response_ids).logps
    assert not torch.allclose(cold, hot)


def test_prompt_values_equal_score_values(policy):
    generation = policy.generate(CONVERSATIONS)
    for param in policy.value_head.parameters():  # the head starts at zero: make it non-trivial
        torch.nn.init.normal_(param)
    with torch.no_grad():
        from_score = policy.score(generation.prompt_ids, generation.response_ids).values
        from_prompts = policy.prompt_values(generation.prompt_ids)
    torch.testing.assert_close(from_score, from_prompts, rtol=1e-5, atol=1e-5)


def test_lora_attached_and_base_frozen(policy):
    assert isinstance(policy.model, PeftModel)
    lora, head = policy.trainable_parameters()
    assert lora and head
    frozen = [n for n, p in policy.model.named_parameters() if not p.requires_grad]
    assert frozen and all("lora_" not in n for n in frozen)


def test_save_load_reproduces_logps_and_values(tmp_path):
    model, tokenizer = tiny_model()
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    policy = PPOPolicy.from_pretrained(str(tmp_path / "base"), config=PPOConfig(max_new_tokens=6))
    with torch.no_grad():  # make the adapter and head non-trivial
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.1)
        for param in policy.value_head.parameters():
            param.normal_(std=0.1)
    generation = policy.generate(CONVERSATIONS)
    with torch.no_grad():
        before = policy.score(generation.prompt_ids, generation.response_ids)
    policy.save(tmp_path / "saved")
    assert (tmp_path / "saved" / "adapter" / "adapter_config.json").is_file()
    loaded = PPOPolicy.load(tmp_path / "saved")
    with torch.no_grad():
        after = loaded.score(generation.prompt_ids, generation.response_ids)
    assert torch.equal(before.logps, after.logps)
    assert torch.equal(before.values, after.values)
    assert loaded.config.max_new_tokens == 6
    # the adapter is plain peft: loadable for inference elsewhere
    base, _ = tiny_model(dtype=loaded.model.dtype)  # the dtype "auto" chose on this machine
    reloaded = PeftModel.from_pretrained(base, tmp_path / "saved" / "adapter")
    ids = torch.tensor([generation.prompt_ids[0]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, loaded.model(ids).logits)


def test_save_without_a_reloadable_base_is_a_clear_error(policy, tmp_path):
    with pytest.raises(ValueError, match="The base model has no name or path to reload it from"):
        policy.save(tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_load_missing_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a saved policy: policy.json is missing"):
        PPOPolicy.load(tmp_path)


def test_act_on_env_observation(policy):
    env = gym.make("textgym/Blackjack-v1")
    messages, _ = env.reset(seed=0)
    reply = policy.act(messages)
    _, _, _, _, info = env.step(reply)
    assert info["reply"] == reply


@pytest.mark.slow
def test_embedded_model_one_training_iteration(tmp_path):
    """The real SmolLM2 model: one PPO iteration on textgym/Blackjack-v1."""
    config = PPOConfig(num_steps=1, max_new_tokens=16, minibatch_size=4, micro_batch_size=4)
    policy = PPOPolicy.from_pretrained(config=config)
    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=4)
    from textgym_agents import PPOTrainer

    trainer = PPOTrainer(policy, envs)
    metrics = trainer.step()
    assert metrics["env/turns"] == 4
    assert all(
        torch.isfinite(torch.tensor(metrics[k]))
        for k in ["loss/policy", "loss/value", "policy/entropy"]
    )
    policy.save(tmp_path / "p")
    assert (tmp_path / "p" / "policy.json").is_file()


def test_adapter_init_follows_config_seed_not_the_global_rng():
    def lora_weights(seed, global_seed):
        torch.manual_seed(global_seed)
        policy = PPOPolicy(*tiny_model(), config=PPOConfig(seed=seed))
        return [p.detach().clone() for n, p in policy.model.named_parameters() if "lora_A" in n]

    state = torch.get_rng_state()
    first = lora_weights(seed=0, global_seed=1)
    same = lora_weights(seed=0, global_seed=2)
    other = lora_weights(seed=1, global_seed=1)
    assert all(torch.equal(a, b) for a, b in zip(first, same, strict=True))
    assert not any(torch.equal(a, b) for a, b in zip(first, other, strict=True))
    torch.set_rng_state(state)


def test_learn_without_a_config_uses_the_env_defaults_and_with_one_keeps_it(tmp_path):
    """One source of defaults: learn() on a policy made without a config trains with
    PPOConfig.for_env(envs) (what `textgym train` uses); a given config is kept exactly."""
    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=2)
    bare = PPOPolicy(*tiny_model())
    assert bare.config.decoding == "free"
    bare.learn(envs, total_episodes=1, output_dir=None)
    assert bare.config == PPOConfig.for_env(envs, seed=0)
    assert bare.config.decoding == "choices"
    given = PPOConfig(num_steps=1, max_new_tokens=2, progress=False)
    kept = PPOPolicy(*tiny_model(), config=given)
    kept.learn(envs, total_episodes=1, output_dir=None)
    assert kept.config is given


@pytest.mark.slow
def test_each_learn_call_uses_the_settings_of_its_env_and_says_so(caplog):
    """Without a config of its own, a second learn() on another env gets that env's settings
    (not the first env's), and the settings used are logged."""
    bare = PPOPolicy(*tiny_model())
    blackjack = gym.make_vec("textgym/Blackjack-v1", num_envs=2)
    with caplog.at_level("INFO", logger="textgym_agents.policy"):
        bare.learn(blackjack, total_episodes=1, output_dir=None)
    assert "decoding='choices'" in caplog.text and "temperature=2.0" in caplog.text
    tools = gym.make_vec("textgym/Calculator-v0", num_envs=2)
    bare.learn(tools, total_episodes=1, output_dir=None)
    assert bare.config == PPOConfig.for_env(tools, seed=0)
    assert (bare.config.decoding, bare.config.temperature) == ("free", 0.7)


def test_act_on_a_bare_observation_after_learning_with_choices(caplog):
    """A policy trained with choice decoding still answers act(obs) without the valid
    replies (free text after the reply prefix, warned once); with them it picks one."""
    policy = PPOPolicy(*tiny_model())
    env = gym.make("textgym/Blackjack-v1")
    policy.learn(gym.make_vec("textgym/Blackjack-v1", num_envs=2), 1, output_dir=None)
    assert policy.config.decoding == "choices"
    observation, _ = env.reset(seed=0)
    with caplog.at_level("WARNING", logger="textgym_agents.policy"):
        first, second = policy.act(observation), policy.act(observation)
    assert isinstance(first, str) and isinstance(second, str)
    assert first.startswith(policy.config.reply_prefix)
    assert caplog.text.count("choices=env.reply_choices()") == 1  # said once
    assert policy.act(observation, choices=reply_choices(env)) in reply_choices(env)
