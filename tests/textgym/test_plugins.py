"""`textgym` plugins: commands and policy loaders found through entry points (faked here)."""

import sys
from importlib.metadata import EntryPoint

import pytest

import textgym.plugins
from textgym.cli import main
from textgym.plugins import COMMANDS_GROUP, POLICIES_GROUP, Command, FunctionCommand

PLUGIN = '''
import argparse
from textgym.plugins import FunctionCommand, UnknownPolicyError

def _configure(parser):
    parser.description = "Greets."
    parser.epilog = "examples:\\n  textgym hello world\\n"
    parser.add_argument("who")

def _run(args):
    print(f"hello {args.who}")
    return 3

hello = FunctionCommand("hello", "say hello", _configure, _run)
misnamed = FunctionCommand("other", "wrong name", _configure, _run)
not_a_command = object()

class Sticky:
    """Always replies the first valid reply."""
    wants_choices = True
    wants_schemas = False
    def act_batch(self, batch, *, choices=None, schemas=None, greedy=False):
        return [options[0] for options in choices]

class Loader:
    def run_info(self, target):
        if target != "sticky":
            raise UnknownPolicyError(f"not mine: {target}")
        return {"env": "textgym/Blackjack-v1"}
    def load(self, target, env):
        return Sticky(), "the sticky policy"

class Refuses:
    def run_info(self, target):
        raise UnknownPolicyError(f"first loader does not know {target}")
    def load(self, target, env):
        raise AssertionError("never asked")
'''


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """Pretend these entry points are the installed ones: ``installed({group: {name: value}})``."""
    (tmp_path / "fake_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_plugin", raising=False)

    def install(groups):
        def entry_points(*, group):
            return [EntryPoint(n, v, group) for n, v in groups.get(group, {}).items()]

        monkeypatch.setattr(textgym.plugins, "entry_points", entry_points)

    return install


@pytest.mark.parametrize("command", ["train", "eval", "plot", "sft"])
def test_a_missing_agents_extra_gives_the_install_hint(installed, capsys, command):
    installed({})  # no entry point at all: the agents half is not installed
    assert main([command, "--episodes", "3"]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"textgym {command}: error: `textgym {command}` comes with the training stack, which is "
        "not installed; install the training stack with: pip install 'textgym[agents]'\n"
    )


def test_without_plugins_help_lists_the_core_commands(installed, capsys):
    installed({})
    assert main(["--help"]) == 0
    listing = capsys.readouterr().out.split("options:")[0]  # the epilog shows examples
    assert "envs " in listing and "play " in listing and "record " in listing
    assert "train " not in listing and "sft " not in listing
    assert main(["envs", "textgym/Blackjack-v1"]) == 0  # the core commands still work


def test_play_policy_without_a_loader_gives_the_install_hint(installed, capsys):
    installed({})
    assert main(["play", "--policy", "runs/bj"]) == 1
    err = capsys.readouterr().err
    assert "--policy needs a policy loader, and none is installed" in err
    assert "pip install 'textgym[agents]'" in err and err.count("\n") == 1


def test_a_third_party_command(installed, capsys):
    installed({COMMANDS_GROUP: {"hello": "fake_plugin:hello"}})
    assert main(["hello", "world"]) == 3
    assert capsys.readouterr().out == "hello world\n"
    assert main(["--help"]) == 0
    assert "hello     say hello" in capsys.readouterr().out
    assert main(["hello", "--help"]) == 0
    out = capsys.readouterr().out
    assert "Greets." in out and "examples:" in out and "--debug" in out
    assert main(["hello"]) == 2
    assert "the following arguments are required: who" in capsys.readouterr().err


def test_a_plugin_cannot_replace_a_core_command(installed, capsys):
    installed({COMMANDS_GROUP: {"envs": "fake_plugin:hello"}})
    assert main(["envs", "textgym/Blackjack-v1"]) == 0
    assert "textgym/Blackjack-v1  (Blackjack-v1)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("fake_plugin:misnamed", "names the command 'other'; expected 'hello'"),
        ("fake_plugin:not_a_command", "is not a textgym Command (name, help, configure, run)"),
        ("no_such_module:hello", "could not be imported (No module named 'no_such_module')"),
    ],
)
def test_a_broken_plugin_fails_in_one_line(installed, capsys, value, message):
    installed({COMMANDS_GROUP: {"hello": value}})
    assert main(["hello", "x"]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert main(["--help"]) == 0  # the listing survives a broken plugin
    assert "hello     (unavailable: " in capsys.readouterr().out


def test_the_first_loader_that_knows_the_target_loads_it(installed, capsys):
    loaders = {"a_refuses": "fake_plugin:Refuses", "b_sticky": "fake_plugin:Loader"}
    installed({POLICIES_GROUP: loaders})
    assert main(["play", "--policy", "sticky", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("the sticky policy plays textgym/Blackjack-v1")  # the run's env
    assert '[assistant]\n{"action": "stick"}' in out
    assert main(["play", "--policy", "nope"]) == 1
    assert "first loader does not know nope" in capsys.readouterr().err


def test_record_policy_uses_the_loader(installed, capsys, tmp_path):
    pytest.importorskip("datasets")
    installed({POLICIES_GROUP: {"sticky": "fake_plugin:Loader"}})
    out = tmp_path / "data"
    args = ["record", "--policy", "sticky", "--episodes", "3", "--num-envs", "2"]
    assert main([*args, "--output", str(out)]) == 0
    assert "with the sticky policy" in capsys.readouterr().out
    from datasets import load_from_disk

    dataset = load_from_disk(str(out))
    assert {row[0]["content"] for row in dataset["completion"]} == {'{"action": "stick"}'}
    assert sorted(set(dataset["episode"])) == [0, 1, 2]


def test_function_command_is_a_command():
    command = FunctionCommand("x", "y", lambda parser: None, lambda args: 0)
    assert isinstance(command, Command) and command.run(None) == 0
