import dataclasses
import json

import pytest

from textgym_agents import PPOConfig


def test_every_field_has_help_text():
    helps = PPOConfig.help()
    assert set(helps) == {f.name for f in dataclasses.fields(PPOConfig)}
    assert all(text.strip() for text in helps.values())


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_steps", 0, "num_steps must be an int >= 1, got 0"),
        ("learning_rate", 0.0, "learning_rate must be > 0, got 0.0"),
        ("gamma", 1.5, "gamma must be in [0, 1], got 1.5"),
        ("top_p", 0.0, "top_p must be in (0, 1], got 0.0"),
        ("kl_estimator", "k2", "kl_estimator must be one of ('k1', 'k3', 'abs', 'mse'), got 'k2'"),
        ("target_kl", -1.0, "target_kl must be > 0 or None, got -1.0"),
        (
            "report_to",
            ["csv"],
            "report_to must be a list of ('jsonl', 'tensorboard', 'wandb'), got ['csv']",
        ),
        ("stop_strings", [""], "stop_strings must be a list of non-empty str, got ['']"),
        ("vf_coef", float("nan"), "vf_coef must be >= 0, got nan"),
        ("num_epochs", True, "num_epochs must be an int >= 1, got True"),
        ("pack_turns", "false", "pack_turns must be a bool, got 'false'"),
        ("anneal_lr", 1, "anneal_lr must be a bool, got 1"),
    ],
)
def test_bad_values_name_the_field(field, value, message):
    with pytest.raises(ValueError) as excinfo:
        PPOConfig(**{field: value})
    assert str(excinfo.value) == message


def test_micro_batch_is_at_most_the_minibatch():
    assert PPOConfig(minibatch_size=8).micro_batch_size == 8  # the default 16, capped
    assert PPOConfig(minibatch_size=8, micro_batch_size=4).micro_batch_size == 4


def test_round_trip_and_unknown_keys():
    config = PPOConfig(learning_rate=1e-4, stop_strings='"', report_to="tensorboard")
    assert config.stop_strings == ['"'] and config.report_to == ["tensorboard"]
    again = PPOConfig.from_dict(json.loads(config.to_json()))
    assert again == config
    with pytest.raises(ValueError, match="Unknown PPOConfig field 'lr'"):
        PPOConfig.from_dict({"lr": 1e-4})


def test_list_defaults_are_not_shared_between_configs():
    first = PPOConfig()
    first.report_to.append("tensorboard")
    first.stop_strings.append("}")
    second = PPOConfig()
    assert second.report_to == ["jsonl"] and second.stop_strings == []


def test_for_env_is_the_cli_default_and_settings_win():
    import gymnasium as gym

    import textgym  # noqa: F401
    from textgym_agents.ppo.defaults import CHOICE_DEFAULTS, ENV_RECIPES, JSON_REPLY_DEFAULTS

    env = gym.make("textgym/Blackjack-v1")
    config = PPOConfig.for_env(env, temperature=1.5)
    assert config.decoding == "choices" and config.reply_prefix == '{"action": "'
    assert config.temperature == 1.5  # given settings win
    assert config.ent_coef == ENV_RECIPES["textgym/Blackjack-v1"]["ent_coef"]  # its recipe
    assert config.advantage_estimator == "gigpo" and config.anneal_lr
    assert PPOConfig.for_env(env, ent_coef=0.1).ent_coef == 0.1  # given settings win over it
    assert PPOConfig.for_env("textgym/CliffWalking-v1").ent_coef == CHOICE_DEFAULTS["ent_coef"]
    assert config.num_steps == PPOConfig().num_steps  # one source of the other defaults
    vector = PPOConfig.for_env(gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    assert vector == PPOConfig.for_env("textgym/Blackjack-v1") == PPOConfig.for_env(env)
    with pytest.warns(UserWarning, match="groups of 4 need num_envs to be a multiple of 4"):
        two = PPOConfig.for_env(gym.make_vec("textgym/Blackjack-v1", num_envs=2))
    assert two.advantage_estimator == "gae" and two.ent_coef == CHOICE_DEFAULTS["ent_coef"]
    assert PPOConfig.for_env(env, num_envs=2, group_size=2).advantage_estimator == "gigpo"
    free = PPOConfig.for_env("textgym/Calculator-v0")  # replies: flat JSON objects
    assert free.decoding == "free" and free.reply_prefix == '{"' and free.stop_strings == ["}"]
    assert free.temperature == JSON_REPLY_DEFAULTS["temperature"] and free.micro_batch_tokens == 512
    assert free.learning_rate == ENV_RECIPES["textgym/Calculator-v0"]["learning_rate"] == 5e-4
    assert free.self_imitation == ENV_RECIPES["textgym/Calculator-v0"]["self_imitation"] == 16
    # Self-imitation needs the critic: a critic-free estimator leaves it out, not an error.
    grpo = PPOConfig.for_env("textgym/Calculator-v0", advantage_estimator="grpo", group_size=4)
    assert grpo.self_imitation == 0 and grpo.learning_rate == 5e-4
    assert PPOConfig.for_env("textgym/Calculator-v0", learning_rate=1e-4).learning_rate == 1e-4
    assert PPOConfig.for_env("textgym/Calculator-v0", decoding="constrained").stop_strings == []
    with pytest.raises(ValueError, match="did you mean 'learning_rate'"):
        PPOConfig.for_env(env, learning_rte=1e-4)
