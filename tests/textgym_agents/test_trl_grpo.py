import copy
import itertools
import math
import random

import gymnasium as gym
import pytest
import torch
from transformers.utils import get_json_schema
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import (
    add_response_schema,
    is_chat_template_prefix_preserving,
    parse_response,
    supports_tool_calling,
)

import textgym
from textgym_agents.testing import load_tokenizer, tiny_model
from textgym_agents.trl_grpo import grpo_dataset, with_tool_template

ENV_ID = "textgym/Blackjack-v1"
SEED = 0
HIT, STICK = '{"action": "hit"}', '{"action": "stick"}'


@pytest.fixture(scope="module")
def tool_tokenizer():
    """The embedded SmolLM2 tokenizer with a template that renders tool calls, as TRL parses."""
    return add_response_schema(with_tool_template(load_tokenizer()))


def tool_call(action):
    return {"type": "function", "function": {"name": "step", "arguments": {"action": action}}}


def tool_call_text(action):
    return (
        f'<tool_call>\n{{"name": "step", "arguments": {{"action": "{action}"}}}}\n</tool_call>'
        "<|im_end|>"
    )


def encode(tokenizer, messages, tools):
    return tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]


def teach_tool_calls(model, tokenizer, env_class, steps=30):
    """Fine-tune a tiny model to play by tool calls: 'hit' first, 'stick' after a tool result.

    A random tiny model never writes a well-formed tool call, so GRPO would see no tool use;
    this short supervised warm-up on real prompts (the task and a deal in the user message,
    rendered with the env's tool schema, as GRPOTrainer renders them) gives it the habit.
    """
    env = env_class()
    rows = []
    for seed in range(8):
        first = [{"role": "user", "content": env.reset(seed=seed)}]
        rows.append((encode(tokenizer, first, [env.step]), "hit"))
        result = env.step(action="hit")
        call = {"role": "assistant", "content": "", "tool_calls": [tool_call("hit")]}
        later = [*first, call, {"role": "tool", "name": "step", "content": result}]
        rows.append((encode(tokenizer, later, [env.step]), "stick"))
    rows = [(p, tokenizer(tool_call_text(a), add_special_tokens=False).input_ids) for p, a in rows]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    rng = random.Random(SEED)
    for _ in range(steps):
        batch = rng.sample(rows, 4)
        length = max(len(p) + len(t) for p, t in batch)
        target_length = max(len(t) for _, t in batch)
        input_ids = torch.full((4, length), tokenizer.pad_token_id)
        attention_mask = torch.zeros((4, length), dtype=torch.long)
        labels = torch.full((4, target_length), -100)
        for i, (prompt, target) in enumerate(batch):  # left padding: targets end every row
            row = prompt + target
            input_ids[i, length - len(row) :] = torch.tensor(row)
            attention_mask[i, length - len(row) :] = 1
            labels[i, target_length - len(target) :] = torch.tensor(target)
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=target_length + 1
        ).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


def test_with_tool_template_gives_smollm2_a_tool_calling_template():
    tokenizer = load_tokenizer()
    assert not supports_tool_calling(tokenizer)
    assert with_tool_template(tokenizer) is tokenizer
    assert supports_tool_calling(tokenizer) and is_chat_template_prefix_preserving(tokenizer)
    template = tokenizer.chat_template
    assert with_tool_template(tokenizer).chat_template is template  # already fine: untouched

    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="cannot render tool calls and is not ChatML"):
        with_tool_template(tokenizer)


def test_the_tool_schema_is_the_action_schema():
    blackjack = textgym.tool_env(ENV_ID)()
    function = get_json_schema(blackjack.step)["function"]
    assert function["name"] == "step"
    assert function["parameters"] == {
        "type": "object",
        "properties": {
            "action": {
                "type": "string",
                "enum": ["stick", "hit"],
                "description": 'one of "stick", "hit"',
            }
        },
        "required": ["action"],
    }
    pendulum = get_json_schema(textgym.tool_env("textgym/Pendulum-v1")().step)["function"]
    assert pendulum["parameters"]["properties"]["torque"] == {
        "type": "number",
        "description": "number from -2.0 to 2.0. Torque on the pivot, in N·m",
    }
    calculator = get_json_schema(textgym.tool_env("textgym/Calculator-v0")().step)["function"]
    assert calculator["parameters"]["required"] == ["reply"]


def test_grpo_dataset_rows_seed_the_episodes_of_a_group():
    blackjack = textgym.tool_env(ENV_ID)
    rows = grpo_dataset(blackjack, 3, seed=5)
    assert rows.column_names == ["prompt", "seed"] and len(rows) == 3
    game, text_env = blackjack(), gym.make(ENV_ID)
    for i, row in enumerate(rows):  # what GRPOTrainer does with each row: reset(**row)
        assert row["prompt"] == [
            {"role": "system", "content": blackjack.task},
            {"role": "user", "content": ""},
        ]
        assert game.reset(**row) == text_env.reset(seed=5 + i)[0][-1]["content"]
        assert game.seed == 5 + i
    (row,) = grpo_dataset(blackjack, 1, system_prompt=False)
    assert row["prompt"] == [{"role": "user", "content": ""}]
    assert game.reset(**row).startswith(blackjack.task)
    with pytest.raises(ValueError, match="Expected num_prompts to be an int >= 1, got 0"):
        grpo_dataset(blackjack, 0)
    with pytest.raises(TypeError, match="Expected a class built by textgym.tool_env"):
        grpo_dataset(gym.make(ENV_ID), 2)


def test_tool_calls_parsed_by_trl_reach_the_env(tool_tokenizer):
    """What GRPOTrainer does with a completion, by hand: parse it, call the tool, score."""
    blackjack = textgym.tool_env(ENV_ID)
    game = blackjack()
    prompt = [{"role": "user", "content": game.reset(seed=0)}]
    prompt_ids = encode(tool_tokenizer, prompt, [game.step])
    assert '"enum": ["stick", "hit"]' in tool_tokenizer.decode(prompt_ids)

    def call_tools(completion_text):
        ids = tool_tokenizer(completion_text, add_special_tokens=False)["input_ids"]
        message = parse_response(tool_tokenizer, ids, prefix=prompt_ids, tools=[game.step])
        return [
            getattr(game, call["function"]["name"])(**call["function"]["arguments"])
            for call in message["tool_calls"]
        ]

    (invalid,) = call_tools(tool_call_text("fold"))
    assert "action: Input should be 'stick' or 'hit'" in invalid
    (result,) = call_tools("I have 11, so I hit.\n" + tool_call_text("hit"))
    assert result == "Your hand totals 12. The dealer shows a 10."
    assert game.replies == ['{"action": "fold"}', '{"action": "hit"}']
    assert game.get_reward() == -1.0 - 1.0  # the invalid call's penalty, then unfinished


@pytest.mark.slow
def test_grpo_trainer_trains_on_rewards_from_the_env(tool_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    episodes = []  # (seed, replies, reward) of every rollout, in the order TRL scores them
    # Each rollout gets its own deal, so a group's rewards differ even though the warmed-up
    # model always plays hit-then-stick: 4 (hit busts), 5, 6 (hit, then stick; 6 wins), 7, ...
    deals = itertools.count(4)

    class Blackjack(textgym.tool_env(ENV_ID)):
        def reset(self, **row):
            return super().reset(**row, seed=next(deals))  # TRL's rows here: only "prompt"

        def get_reward(self):
            reward = super().get_reward()
            episodes.append((self.seed, list(self.replies), reward))
            return reward

    model, tokenizer = tiny_model(tool_tokenizer)
    assert teach_tool_calls(model, tokenizer, textgym.tool_env(ENV_ID)) < 0.05
    model.eval()
    before = copy.deepcopy(model.state_dict())

    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,  # no train_dataset: the env owns the data, reset() writes the prompt
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=128,
        max_tool_calling_iterations=2,
        temperature=0.5,
        learning_rate=1e-5,
        bf16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=SEED,
    )
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=args, environment_factory=Blackjack
    )
    assert [tool.__name__ for tool in trainer.tools] == ["step"]
    trainer.train()

    assert trainer.state.global_step == 2
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and all(math.isfinite(entry["loss"]) for entry in logs)
    assert all(entry["tools/call_frequency"] > 0 for entry in logs)
    # The rewards GRPO optimised are the env's: they are what TRL logged for each step, and
    # every episode replays to the same return on a fresh text env.
    assert [seed for seed, _, _ in episodes] == list(range(4, 12))
    for step, log in enumerate(logs):
        rewards = [reward for _, _, reward in episodes[4 * step : 4 * step + 4]]
        assert log["rewards/Blackjack/mean"] == pytest.approx(sum(rewards) / 4)
    for seed, replies, reward in episodes:
        replay = gym.make(ENV_ID)
        replay.reset(seed=seed)
        steps = [replay.step(reply) for reply in replies]
        finished = bool(steps) and (steps[-1][2] or steps[-1][3])
        assert sum(float(s[1]) for s in steps) - (0.0 if finished else 1.0) == reward
    assert any(replies == [HIT, STICK] for _, replies, _ in episodes)  # multi-turn
    assert any(log["reward_std"] > 0 for log in logs)
    changed = [name for name, p in model.state_dict().items() if not torch.equal(p, before[name])]
    assert changed
