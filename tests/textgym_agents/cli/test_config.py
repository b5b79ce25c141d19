"""`textgym train`'s settings: flags from a config dataclass, config files, per-env defaults.

A stand-in dataclass replaces PPOConfig, so nothing here needs torch.
"""

import argparse
import json
from dataclasses import dataclass, field

import pytest

from textgym.cli_common import UsageError
from textgym_agents.cli.config import add_config_flags, check_values, flag_values, read_config_file
from textgym_agents.cli.runs import read_run_info
from textgym_agents.ppo.defaults import env_defaults, reply_prefix_of


def test_read_run_info_finds_the_run_of_a_policy_or_checkpoint(tmp_path):
    (tmp_path / "cli.json").write_text('{"env": "textgym/Taxi-v4"}')
    checkpoint = tmp_path / "checkpoints" / "step_00000002"
    checkpoint.mkdir(parents=True)
    for path in (tmp_path, tmp_path / "final", checkpoint):
        assert read_run_info(path) == {"env": "textgym/Taxi-v4"}
    assert read_run_info(tmp_path / "elsewhere") == {}


# --- settings, with a stand-in for PPOConfig (no torch here) ---------------------------------


@dataclass
class Settings:
    rate: float = field(default=0.1, metadata={"help": "A rate."})
    steps: int = field(default=4, metadata={"help": "Steps; 50% more is fine."})
    enabled: bool = field(default=True, metadata={"help": "Switch."})
    words: list[str] = field(default_factory=list, metadata={"help": "Words."})
    limit: float | None = field(default=None, metadata={"help": "Optional limit."})
    name: str = field(default="x", metadata={"help": "A name."})


def parse(*argv):
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_config_flags(parser, Settings)
    return flag_values(parser.parse_args(list(argv)))


def test_flags_from_dataclass_fields():
    assert parse() == {}  # only what was typed
    values = parse("--rate", "1e-3", "--steps", "8", "--no-enabled", "--words", '"', "}")
    assert values == {"rate": 1e-3, "steps": 8, "enabled": False, "words": ['"', "}"]}
    assert parse("--limit", "none", "--name", "") == {"limit": None, "name": ""}
    assert parse("--limit", "0.5", "--words") == {"limit": 0.5, "words": []}
    assert Settings(**parse("--steps", "2")).steps == 2


def test_flag_bad_value_names_the_flag(capsys):
    parser = argparse.ArgumentParser(prog="t")
    add_config_flags(parser, Settings)
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["--steps", "many"])
    assert e.value.code == 2
    assert "argument --steps: expected an int, got 'many'" in capsys.readouterr().err
    help_text = parser.format_help()
    assert "Steps; 50% more is fine. (default: 4)" in help_text
    assert "--enabled, --no-enabled" in help_text


def test_config_file_yaml_and_json(tmp_path):
    pytest.importorskip("yaml")  # PyYAML comes with the agents extra
    yaml_file = tmp_path / "s.yaml"
    yaml_file.write_text(
        "rate: 1e-4\nnum_envs: 2\nwords: '\"'\nlimit: null\nenv: textgym/Taxi-v4\n"
    )
    values, train = read_config_file(yaml_file, Settings)
    assert values == {"rate": 1e-4, "words": ['"'], "limit": None}
    assert train == {"num_envs": 2, "env": "textgym/Taxi-v4"}
    json_file = tmp_path / "config.json"  # a run directory's config.json
    json_file.write_text(json.dumps({"ppo": {"steps": 3}, "base": {"name_or_path": "m"}}))
    assert read_config_file(json_file, Settings) == ({"steps": 3}, {"model": "m"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stepz: 3\n", "unknown setting 'stepz'; did you mean 'steps'?"),
        ("steps: 2.5\n", "steps must be an int, got 2.5"),
        ("enabled: 'yes'\n", "enabled must be true or false, got 'yes'"),
        ("- 1\n", "expected a mapping of settings"),
        ("rate: [\n", "invalid YAML"),
    ],
)
def test_config_file_errors_name_the_file_and_field(tmp_path, text, message):
    pytest.importorskip("yaml")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match="bad.yaml") as e:
        read_config_file(path, Settings)
    assert message in str(e.value)
    with pytest.raises(UsageError, match="cannot read"):
        read_config_file(tmp_path / "missing.yaml", Settings)


def test_check_values():
    assert check_values({"rate": 1, "words": "a"}, Settings) == {"rate": 1.0, "words": ["a"]}
    with pytest.raises(ValueError, match="limit must be a number or none"):
        check_values({"limit": "high"}, Settings)


def test_env_defaults_pick_the_decoding_for_the_env():
    blackjack = ['{"action": "stick"}', '{"action": "hit"}']
    defaults = env_defaults(blackjack, {})
    assert defaults["decoding"] == "choices" and defaults["reply_prefix"] == '{"action": "'
    assert "num_steps" not in defaults and "kl_coef" not in defaults  # PPOConfig's own
    assert (defaults["temperature"], defaults["ent_coef"], defaults["learning_rate"]) == (
        2.0,
        0.3,
        1e-4,
    )  # choices explore
    assert "temperature" not in env_defaults(blackjack, {"temperature": 1.0})  # given wins
    free = env_defaults(blackjack, {"decoding": "free"})
    assert free["stop_strings"] == ['"'] and "decoding" not in free
    assert "temperature" not in free and "ent_coef" not in free and "learning_rate" not in free
    assert env_defaults(None, {})["decoding"] == "free"
    assert "reply_prefix" not in env_defaults(None, {})
    assert "reply_prefix" not in env_defaults(blackjack, {"reply_prefix": ""})
    assert reply_prefix_of(["a"]) == "" and reply_prefix_of(["go left", "go right"]) == "go "
