"""The `textgym` command without the training stack: envs, play, usage errors."""

import json
import subprocess
import sys

import pytest

from textgym.cli import main
from textgym.cli_common import UsageError, parse_env_args

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


@pytest.mark.slow
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
