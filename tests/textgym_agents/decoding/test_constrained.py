"""Constrained decoding: every reply satisfies the env's schema, and PPO scores it exactly."""

from typing import Literal

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, TypeAdapter

import textgym  # noqa: F401
from textgym import TextEnvWrapper
from textgym.parsers import FunctionParser, JSONActionParser
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer, evaluate
from textgym_agents.decoding.constrained import (
    ConstrainedReply,
    GrammarCompiler,
    allowed_tokens,
    decoding_mode,
    mask_logits,
    pack_bits,
    unpack_bits,
)
from textgym_agents.ppo import core
from textgym_agents.ppo.rollout import reply_schemas
from textgym_agents.testing import tiny_model


class ServeEnv(gym.Env):
    """A Dict action space (as examples/custom_env.py): a named drink, 1-3 cups, sugar in [0, 1]."""

    observation_space = spaces.Discrete(3)
    action_space = spaces.Dict(
        {
            "drink": spaces.Discrete(3),
            "cups": spaces.Discrete(3, start=1),
            "sugar": spaces.Box(0.0, 1.0, (1,), np.float32),
        }
    )

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.order = int(self.np_random.integers(3))
        return self.order, {}

    def step(self, action):
        return self.order, float(action["drink"] == self.order), True, False, {}


def serve_env():
    return TextEnvWrapper(
        ServeEnv(),
        formatter="Customer orders drink {o}.",
        action_names={"drink": ["coffee", "tea", "juice"]},
        system_prompt="Serve the customer.",
    )


def make_envs(name, num_envs=8):
    if name == "dict":
        return gym.vector.SyncVectorEnv([serve_env for _ in range(num_envs)])
    return gym.make_vec(name, num_envs=num_envs, vectorization_mode="sync")


def constrained_policy(**overrides):
    values = dict(decoding="constrained", max_new_tokens=64, num_steps=2, seed=0)
    values.update(minibatch_size=8, micro_batch_size=4)
    values.update(overrides)
    return PPOPolicy(*tiny_model(), config=PPOConfig(**values))


def conversation(text="hit or stick?"):
    return [{"role": "system", "content": "play"}, {"role": "user", "content": text}]


BLACKJACK = {
    "type": "object",
    "properties": {"action": {"enum": ["stick", "hit"]}},
    "required": ["action"],
    "additionalProperties": False,
}


def test_reply_schema_comes_from_the_parser():
    parser = JSONActionParser.from_space(spaces.Box(-2.0, 2.0, (1,)), field_name="torque")
    torque = parser.reply_schema()["properties"]["torque"]
    assert (torque["minimum"], torque["maximum"]) == (-2.0, 2.0)
    assert FunctionParser(lambda reply: 0).reply_schema() is None

    class Stated(FunctionParser):
        def reply_schema(self):
            return {"type": "integer"}

    assert Stated(int).reply_schema() == {"type": "integer"}
    envs = make_envs("textgym/Blackjack-v1", 2)
    assert reply_schemas(envs) == [envs.envs[0].get_wrapper_attr("parser").reply_schema()] * 2
    assert reply_schemas(gym.make_vec("CartPole-v1", num_envs=2)) is None


def test_decoding_mode_prefers_choices_then_constrained_then_free():
    schema, choices = {"type": "number"}, ["stick", "hit"]
    assert decoding_mode("auto", 2, [choices, choices], [schema, schema]) == "choices"
    assert decoding_mode("auto", 2, [choices, None], [schema, schema]) == "constrained"
    assert decoding_mode("auto", 2, None, [None, schema]) == "constrained"
    assert decoding_mode("auto", 2, None, [None, None]) == "free"
    assert decoding_mode("constrained", 1, [choices], [schema]) == "constrained"
    assert decoding_mode("free", 1, [choices], [schema]) == "free"
    with pytest.raises(ValueError, match="'constrained' needs the reply schema of every"):
        decoding_mode("constrained", 2, None, [schema, None])
    with pytest.raises(ValueError, match="Got 1 schemas for 2 conversations"):
        decoding_mode("auto", 2, None, [schema])
    assert PPOConfig(decoding="constrained").decoding == "constrained"
    flags = {
        mode: (p.wants_choices, p.wants_schemas)
        for mode in ["free", "choices", "constrained", "auto"]
        for p in [PPOPolicy(*tiny_model(), config=PPOConfig(decoding=mode))]
    }
    assert flags == {
        "free": (False, False),
        "choices": (True, False),
        "constrained": (False, True),
        "auto": (True, True),
    }


@pytest.mark.parametrize("size", [1, 31, 32, 33, 100])
def test_pack_bits_matches_a_naive_reference(size):
    generator = torch.Generator().manual_seed(size)
    allowed = torch.rand((3, size), generator=generator) < 0.5
    words = pack_bits(allowed)
    assert words.dtype == torch.int32 and words.shape == (3, -(-size // 32))
    for row in range(3):
        naive = [0] * words.shape[1]
        for token in allowed[row].nonzero().flatten().tolist():
            naive[token // 32] |= 1 << (token % 32)
        naive = [w - (1 << 32) if w >= 1 << 31 else w for w in naive]  # as int32
        assert words[row].tolist() == naive
    assert torch.equal(unpack_bits(words, size), allowed)


def test_masked_logits_renormalise_over_allowed_tokens():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn((2, 3, 10), generator=generator, requires_grad=True)
    allowed = torch.rand((2, 3, 10), generator=generator) < 0.4
    allowed[..., 0] = True
    masked = mask_logits(logits, allowed, temperature=0.7)
    probs = (logits.detach() / 0.7).exp() * allowed
    naive = probs / probs.sum(-1, keepdim=True)
    torch.testing.assert_close(masked.softmax(-1), naive)
    naive_entropy = -(naive * naive.clamp(min=1e-30).log()).sum(-1)
    torch.testing.assert_close(core.entropy(masked), naive_entropy)
    labels = torch.zeros((2, 3), dtype=torch.long)
    core.logprobs_from_logits(masked, labels).sum().backward()
    assert torch.all(logits.grad[~allowed] == 0) and torch.all(logits.grad[allowed] != 0)


def _replies_are_valid(envs, texts):
    _, _, _, _, infos = envs.step(list(texts))
    errors = [infos["parse_error"][i] for i in range(len(texts)) if infos["invalid"][i]]
    assert not errors, list(zip(texts, errors, strict=False))


@pytest.mark.parametrize("env_id", ["textgym/Blackjack-v1", "textgym/Pendulum-v1", "dict"])
@pytest.mark.slow
def test_every_sampled_reply_is_valid(env_id):
    """Discrete (Blackjack), Box (Pendulum) and Dict action schemas, through a sync vector env."""
    torch.manual_seed(0)
    envs = make_envs(env_id)
    schemas = reply_schemas(envs)
    policy = constrained_policy(temperature=1.5)
    replies = set()
    for seed in (0, 1):
        observations, _ = envs.reset(seed=seed)
        generation = policy.generate(list(observations), schemas=schemas)
        assert all(isinstance(r, ConstrainedReply) for r in generation.response_ids)
        eos = policy.tokenizer.eos_token_id
        assert all(r[-1] == eos and eos not in r[:-1] for r in generation.response_ids)
        _replies_are_valid(envs, generation.texts)
        replies.update(generation.texts)
    assert len(replies) > 1  # sampled, not one forced reply


@pytest.mark.parametrize("env_id, budget", [("textgym/Pendulum-v1", 12), ("dict", 30)])
@pytest.mark.slow
def test_replies_finish_within_the_token_budget(env_id, budget):
    """Near max_new_tokens a reply follows a short finish instead of being cut off."""
    torch.manual_seed(0)
    envs = make_envs(env_id)
    policy = constrained_policy(temperature=1.5, max_new_tokens=budget)
    compiler, schemas = policy._grammar_compiler(), reply_schemas(envs)
    replies, closed = set(), 0
    for seed in (0, 1, 2):
        generation = policy.generate(list(envs.reset(seed=seed)[0]), schemas=schemas)
        assert max(len(r) for r in generation.response_ids) <= budget
        _replies_are_valid(envs, generation.texts)
        replies.update(generation.texts)
        for reply, schema in zip(generation.response_ids, schemas, strict=True):
            replay = compiler.matcher(schema)
            for k, token in enumerate(reply):
                recorded = unpack_bits(reply.allowed[k], compiler.vocab_size)
                grammar = _allowed_by(replay, compiler.vocab_size)
                assert recorded[token] and set(recorded.nonzero().flatten().tolist()) <= grammar
                closed += int(recorded.sum()) == 1 < len(grammar)  # the budget bound here
                if k + 1 < len(reply):
                    assert replay.consume_token(token)
    assert closed > 0 and len(replies) > 1


def test_closing_finishes_any_state():
    policy = constrained_policy()
    compiler, tokenizer = policy._grammar_compiler(), policy.tokenizer
    schema = serve_env().parser.reply_schema()  # keys in the Dict space's (sorted) order
    complete = '{"cups": 2, "drink": "tea", "sugar": 0.5}'
    for start in ['{"', '{"cups": 2, "drink": "te', '{"cups": 2, "', '{"cups": 2, "drink": "t']:
        matcher = compiler.matcher(schema, tokenizer.encode(start))
        path = compiler.closing(matcher)
        text = start + tokenizer.decode(path)
        assert serve_env().parse_reply(text)[1] is None, text
        assert not matcher.is_accepting()  # closing() leaves the matcher where it was
    assert compiler.closing(compiler.matcher(schema, tokenizer.encode(complete))) == []


def test_masks_are_the_grammar_s_and_eos_only_where_the_reply_is_complete():
    torch.manual_seed(1)
    envs = make_envs("dict", 4)
    schemas = reply_schemas(envs)
    policy = constrained_policy(temperature=1.5)
    generation = policy.generate(list(envs.reset(seed=0)[0]), schemas=schemas)
    compiler = policy._grammar_compiler()
    wrapper = envs.envs[0]
    eos = policy.tokenizer.eos_token_id
    for reply, schema in zip(generation.response_ids, schemas, strict=True):
        allowed = unpack_bits(reply.allowed, compiler.vocab_size)
        replay = compiler.matcher(schema)  # the same grammar, replayed over the sampled tokens
        for k, token in enumerate(reply):
            expected = torch.zeros(compiler.vocab_size, dtype=torch.bool)
            expected[sorted(_allowed_by(replay, compiler.vocab_size))] = True
            assert torch.equal(allowed[k], expected)
            assert allowed[k, token]  # every sampled token was allowed
            complete = wrapper.parse_reply(policy.tokenizer.decode(reply[:k]))[1] is None
            assert bool(allowed[k, eos]) == complete
            if token != eos:
                assert replay.consume_token(token)


def _allowed_by(matcher, vocab_size):
    import llguidance.torch

    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab_size)
    llguidance.torch.fill_next_token_bitmask(matcher, bitmask)
    return set(unpack_bits(bitmask[0], vocab_size).nonzero().flatten().tolist())


def test_scores_are_the_renormalised_distribution_and_greedy_takes_its_argmax():
    policy = constrained_policy(temperature=0.8)
    envs = make_envs("textgym/Pendulum-v1", 3)
    batch = list(envs.reset(seed=0)[0])
    for greedy in (False, True):
        torch.manual_seed(0)
        generation = policy.generate(batch, schemas=reply_schemas(envs), greedy=greedy)
        with torch.no_grad():
            scores = policy.score(generation.prompt_ids, generation.response_ids, with_entropy=True)
        for row, (prompt, reply) in enumerate(
            zip(generation.prompt_ids, generation.response_ids, strict=True)
        ):
            with torch.no_grad():
                logits = policy.model(input_ids=torch.tensor([prompt + reply])).logits[0].float()
            logits = logits[len(prompt) - 1 : -1] / 0.8
            allowed = unpack_bits(reply.allowed, logits.shape[-1])
            naive = logits.masked_fill(~allowed, float("-inf")).log_softmax(-1)
            expected = naive.gather(1, torch.tensor(reply)[:, None])[:, 0]
            n = len(reply)
            torch.testing.assert_close(scores.logps[row, :n], expected, rtol=1e-4, atol=1e-4)
            entropy = -(naive.exp() * naive.nan_to_num(neginf=0.0)).sum(-1)
            torch.testing.assert_close(scores.entropy[row, :n], entropy, rtol=1e-4, atol=1e-4)
            if greedy:
                assert naive.argmax(-1).tolist() == list(reply)
        _replies_are_valid(envs, generation.texts)
        envs.reset(seed=0)


def test_union_schema_every_reply_validates():
    """A union of replies (a tool call or an answer, as the calculator env takes)."""

    class Call(BaseModel):
        model_config = ConfigDict(extra="forbid")
        tool: Literal["calculator"]
        expression: str

    class Answer(BaseModel):
        model_config = ConfigDict(extra="forbid")
        answer: float

    adapter = TypeAdapter(Call | Answer)
    schema = adapter.json_schema()
    schema["$defs"]["Call"]["properties"]["expression"]["maxLength"] = 12
    policy = constrained_policy(temperature=1.5)
    torch.manual_seed(0)
    generation = policy.generate(
        [conversation(f"{n} + 1?") for n in range(12)], schemas=[schema] * 12
    )
    kinds = {type(adapter.validate_json(text)).__name__ for text in generation.texts}
    assert kinds == {"Call", "Answer"}, generation.texts


def test_reply_prefix_and_stop_strings_follow_the_grammar():
    envs = make_envs("textgym/Blackjack-v1", 4)
    schemas = reply_schemas(envs)
    prefix = '{"action": "'
    # '"' is a stop string that occurs inside every reply: it must not cut one short
    policy = constrained_policy(reply_prefix=prefix, stop_strings=['"'], max_new_tokens=8)
    torch.manual_seed(0)
    generation = policy.generate(list(envs.reset(seed=0)[0]), schemas=schemas)
    assert all(text.startswith(prefix) for text in generation.texts)
    _replies_are_valid(envs, generation.texts)
    assert policy.tokenizer.decode(generation.prompt_ids[0]).endswith(prefix)
    bad = constrained_policy(reply_prefix="[")
    with pytest.raises(ValueError, match=r"The reply prefix '\[' does not start any reply"):
        bad.act(conversation(), schemas=BLACKJACK)
    # where the reply is complete, a stop string leaves nothing but EOS
    compiler = GrammarCompiler(policy.tokenizer, len(policy.tokenizer))
    tokenizer = policy.tokenizer
    mask = compiler.mask([{"type": "integer"}] * 2, stop_strings=["7"])
    seven, one = tokenizer.encode("7"), tokenizer.encode("1")
    prompt = torch.tensor([one, one])
    mask(prompt, torch.zeros((2, compiler.vocab_size)))
    scores = mask(torch.tensor([one + seven, one + one]), torch.zeros((2, compiler.vocab_size)))
    assert torch.isfinite(scores[0]).nonzero().flatten().tolist() == [tokenizer.eos_token_id]
    assert torch.isfinite(scores[1]).sum() > 10  # "1" may go on: "12", "1.5", ...


def test_mixed_rows_and_auto_mode():
    blackjack = make_envs("textgym/Blackjack-v1", 2)
    pendulum = make_envs("textgym/Pendulum-v1", 2)
    policy = constrained_policy(decoding="auto", max_new_tokens=32)
    torch.manual_seed(0)
    picked = policy.generate(
        list(blackjack.reset(seed=0)[0]),
        choices=[['{"action": "stick"}', '{"action": "hit"}']] * 2,
        schemas=reply_schemas(blackjack),
    )
    assert picked.choice_ids is not None  # choices win where the env lists them
    batch = list(pendulum.reset(seed=0)[0]) + [conversation()]
    mixed = policy.generate(batch, schemas=reply_schemas(pendulum) + [None])
    assert [type(r).__name__ for r in mixed.response_ids] == ["ConstrainedReply"] * 2 + ["list"]
    with torch.no_grad():
        together = policy.score(mixed.prompt_ids, mixed.response_ids)
        free = policy.score(mixed.prompt_ids[2:], mixed.response_ids[2:])
    n = len(mixed.response_ids[2])
    torch.testing.assert_close(together.logps[2, :n], free.logps[0, :n], rtol=1e-5, atol=1e-5)
    width = together.logps.shape[1]
    only_free = allowed_tokens(mixed.response_ids[2:], width, 8)
    assert only_free is None  # no mask at all for free replies


def test_training_ratio_is_exactly_one_and_no_reply_is_invalid(monkeypatch):
    policy = constrained_policy(kl_coef=0.05)
    calls = []
    original = core.policy_loss

    def spy(new, old, *args, **kwargs):
        calls.append((new.detach().clone(), old.clone(), args[1].clone()))
        return original(new, old, *args, **kwargs)

    monkeypatch.setattr(core, "policy_loss", spy)
    named = policy.model.named_parameters()
    lora_before = {n: p.detach().clone() for n, p in named if "lora_" in n}
    trainer = PPOTrainer(policy, make_envs("textgym/Blackjack-v1", 4))
    buffer = trainer.collect()
    assert all(isinstance(t.response_ids, ConstrainedReply) for t in buffer)
    metrics = trainer.update(buffer)
    assert metrics["env/invalid_rate"] == 0.0
    new, old, mask = calls[0]
    scored = mask.bool()  # padding columns of `new` are not log-probs of anything
    assert torch.equal(new[scored], old[scored])  # rollout and update agree bit for bit
    assert mask.sum() > new.shape[0]  # per-token rows, not one log-prob per turn
    named = dict(policy.model.named_parameters())
    assert any(not torch.equal(named[n], p) for n, p in lora_before.items())
    for key in ["loss/policy", "policy/entropy", "objective/kl"]:
        assert np.isfinite(metrics[key]), key


def test_evaluate_with_constrained_decoding_has_no_invalid_replies():
    policy = constrained_policy(max_new_tokens=32)
    result = evaluate(policy, make_envs("dict", 4), n_episodes=8)
    assert result["invalid_rate"] == 0.0
    assert result["episodes"] == 8


def test_async_vector_env_lists_its_schemas():
    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=2, vectorization_mode="async")
    try:
        sync = make_envs("textgym/Blackjack-v1", 2)
        assert reply_schemas(envs) == reply_schemas(sync)
        envs.reset(seed=0)  # the workers are still alive
    finally:
        envs.close()
