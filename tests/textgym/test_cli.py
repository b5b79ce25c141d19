"""The `textgym` command without the training stack: envs, play, usage errors, settings."""

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from textgym.cli import main
from textgym.cli_common import UsageError, parse_env_args, read_run_info
from textgym.cli_config import (
    add_config_flags,
    check_values,
    env_defaults,
    flag_values,
    read_config_file,
    reply_prefix_of,
)

# Runs the command with the training stack made unimportable, as with only the core package.
CORE_ONLY = (
    "import sys\n"
    "for name in ['torch', 'transformers', 'peft', 'textgym_agents']:\n"
    "    sys.modules[name] = None\n"
    "from textgym.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def textgym(*args, stdin=""):
    return subprocess.run(
        [sys.executable, "-c", CORE_ONLY, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_envs_lists_every_text_env_with_its_replies():
    result = textgym("envs")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    blackjack = (
        'textgym/Blackjack-v1  (Blackjack-v1)\n  replies: {"action": "stick"} | {"action": "hit"}'
    )
    assert blackjack in out
    assert "textgym/Pendulum-v1" in out and '"torque": number from -2.0 to 2.0' in out
    assert "textgym/Calculator-v0" in out and "free text:" in out


def test_envs_json_and_verbose(capsys):
    assert main(["envs", "textgym/Blackjack-v1", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["reply_choices"] == ['{"action": "stick"}', '{"action": "hit"}']
    assert row["instructions"].startswith("Reply with a JSON object")
    assert main(["envs", "textgym/FrozenLake-v1", "-v"]) == 0
    out = capsys.readouterr().out
    assert "[system] You walk on a frozen lake" in out
    assert "[user] You are at row 0, column 0" in out


def test_envs_unknown_id_is_one_line_error(capsys):
    assert main(["envs", "nope/Nothing-v0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "textgym envs: error:" in err and "Traceback" not in err


def test_non_text_env_is_refused_with_a_hint(capsys):
    assert main(["play", "CartPole-v1"]) == 1
    assert "try textgym/CartPole-v1" in capsys.readouterr().err


def test_play_shows_what_the_model_sees_and_reads_stdin():
    replies = 'I fold\n{"action": "stick"}\n'
    result = textgym("play", "textgym/Blackjack-v1", "--seed", "0", stdin=replies)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "[system]\nYou are playing blackjack" in out
    assert 'Example reply: {"action": "stick"}' in out  # the instructions in the system prompt
    assert "[user]\nYour hand totals" in out
    assert "(reward -1, return -1, invalid reply)" in out  # the penalty of an invalid reply
    assert "Your last reply was invalid (no JSON object found" in out  # the model sees the error
    assert "episode 1 over, terminated" in out


def test_play_number_picks_a_listed_reply_and_eof_ends_cleanly():
    result = textgym("play", "textgym/FrozenLake-v1", "-e", "is_slippery=false", stdin="2\n")
    assert result.returncode == 0, result.stderr
    assert '1) {"action": "left"}  2) {"action": "down"}' in result.stdout
    assert '[assistant] > {"action": "down"}' in result.stdout
    assert "You are at row 1, column 0" in result.stdout
    assert result.stdout.rstrip().endswith("(end of input)")


def test_play_multi_line_reply(capsys, monkeypatch):
    lines = iter(["Thought: add them\\", "Action: calculator(2 + 3)"])

    def fake_input(prompt=""):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)
    assert main(["play", "textgym/Calculator-v0", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "Observation: 5" in out and "invalid reply" not in out


def test_train_eval_plot_need_the_agents_extra(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    commands = [["train"], ["eval", "embedded"], ["plot", str(tmp_path)]]
    for args in [*commands, ["play", "--policy", "embedded"]]:
        result = textgym(*args)
        assert result.returncode == 1, args
        assert "pip install 'textgym[agents]'" in result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_usage_errors_exit_2(capsys):
    assert main(["bogus"]) == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err
    assert main(["play", "--episodes", "0"]) == 2
    assert "--episodes: expected an int >= 1, got '0'" in capsys.readouterr().err
    assert main(["envs", "--jsn"]) == 2
    assert "unrecognized arguments: --jsn; did you mean --json?" in capsys.readouterr().err
    assert main(["play", "-e", "no-equals-sign"]) == 2
    assert "--env-arg expects KEY=VALUE" in capsys.readouterr().err


def test_help_has_examples(capsys):
    for args in (["--help"], ["envs", "--help"], ["play", "--help"], ["plot", "--help"]):
        assert main(args) == 0
        assert "examples:" in capsys.readouterr().out


def test_parse_env_args():
    assert parse_env_args(["a=1", "b=x", "c=[1, 2]", "d=null"]) == {
        "a": 1,
        "b": "x",
        "c": [1, 2],
        "d": None,
    }
    with pytest.raises(UsageError):
        parse_env_args(["=1"])


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
    assert defaults["num_steps"] == 4 and defaults["kl_coef"] == 0.0
    assert (defaults["temperature"], defaults["ent_coef"], defaults["learning_rate"]) == (
        2.0,
        0.3,
        1e-4,
    )  # choices explore
    assert "temperature" not in env_defaults(blackjack, {"temperature": 1.0})  # given wins
    free = env_defaults(blackjack, {"decoding": "free"})
    assert free["stop_strings"] == ['"'] and "decoding" not in free
    assert "temperature" not in free and "ent_coef" not in free and free["learning_rate"] == 2e-4
    assert env_defaults(None, {})["decoding"] == "free"
    assert "reply_prefix" not in env_defaults(None, {})
    assert env_defaults(blackjack, {"minibatch_size": 8})["micro_batch_size"] == 8
    assert "reply_prefix" not in env_defaults(blackjack, {"reply_prefix": ""})
    assert reply_prefix_of(["a"]) == "" and reply_prefix_of(["go left", "go right"]) == "go "
