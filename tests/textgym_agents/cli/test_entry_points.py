"""The training commands reach `textgym` through entry points, and listing them needs no torch."""

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from textgym.plugins import COMMANDS_GROUP, POLICIES_GROUP, Command, load_command

# `textgym ARGS` in a fresh interpreter; fails if torch or transformers got imported.
NO_TORCH = (
    "import sys\n"
    "from textgym.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "heavy = {'torch', 'transformers', 'peft', 'trl'} & set(sys.modules)\n"
    "assert not heavy, heavy\n"
    "sys.exit(code)\n"
)
# The agents half importable, its dependencies not: what `pip install textgym` alone gives.
WITHOUT_TORCH = (
    "import sys\n"
    "for name in ['torch', 'transformers', 'peft', 'trl']:\n"
    "    sys.modules[name] = None\n"
    "from textgym.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def textgym(code, *args):
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )


def test_every_training_command_is_an_entry_point():
    commands = {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP)}
    assert {"train", "eval", "plot", "sft"} <= set(commands)
    for name, entry_point in commands.items():
        command = load_command(entry_point)
        assert isinstance(command, Command) and command.name == name and command.help
    (loader,) = [ep.load() for ep in entry_points(group=POLICIES_GROUP)]
    assert callable(loader.run_info) and callable(loader.load)


def test_the_package_exports_load_on_first_use():
    import textgym_agents

    assert sorted(textgym_agents.__all__) == sorted(textgym_agents._EXPORTS)
    for name in textgym_agents.__all__:
        assert getattr(textgym_agents, name).__name__ == name
    assert set(textgym_agents.__all__) <= set(dir(textgym_agents))


def test_help_lists_every_command_without_importing_torch():
    result = textgym(NO_TORCH, "--help")
    assert result.returncode == 0, result.stderr
    listing = result.stdout.split("options:")[0]
    for name in ["envs", "play", "record", "train", "eval", "plot", "sft"]:
        assert f"\n    {name} " in listing, name
    result = textgym(NO_TORCH, "train", "--help")  # the PPOConfig flags need no torch either
    assert result.returncode == 0, result.stderr
    assert "--learning-rate LEARNING_RATE" in result.stdout


@pytest.mark.slow
def test_without_torch_the_commands_give_the_install_hint(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    out = str(tmp_path / "out")
    cases = [
        ["train", "--output", out],
        ["eval", "embedded"],
        ["plot", str(tmp_path)],
        ["sft", str(tmp_path), "--output", out],
        ["play", "--policy", "embedded"],
    ]
    for args in cases:
        result = textgym(WITHOUT_TORCH, *args)
        assert result.returncode == 1, (args, result.stderr)
        assert "pip install 'textgym[agents]'" in result.stderr, args
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
