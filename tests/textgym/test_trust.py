"""Data, never code: env records and run info name only code textgym knows, unless trusted."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import textgym
from textgym.checker import find_text_wrapper
from textgym.cli_common import CLIError, recorded_env
from textgym.env_records import check_record, env_record, make_recorded_env
from textgym.trust import UntrustedCodeError, check_env_args, untrusted

MARKER = "textgym_code_marker"  # the code_marker fixture's module (conftest.py)


def crafted(entry_point=None, formatter=None, wrapper=None):
    """A Blackjack env record whose spec was edited the way a hostile run directory would be."""
    spec = json.loads(env_record(gym.make("textgym/Blackjack-v1"))["spec"])
    if entry_point is not None:
        spec["entry_point"] = entry_point
    if formatter is not None:
        spec["kwargs"]["formatter"] = formatter
    if wrapper is not None:
        spec["additional_wrappers"].append({"name": "X", "entry_point": wrapper, "kwargs": {}})
    return {"id": spec["id"], "spec": json.dumps(spec), "system_prompt": None}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"entry_point": f"{MARKER}:planted"}, f"the entry point '{MARKER}:planted'"),
        (
            {"formatter": f"{MARKER}:Planted"},
            f"the importable name '{MARKER}:Planted' (in formatter)",
        ),
        ({"wrapper": f"{MARKER}:Planted"}, f"the wrapper entry point '{MARKER}:Planted'"),
    ],
    ids=["entry-point", "formatter", "wrapper"],
)
def test_a_crafted_record_is_refused_before_anything_is_imported(code_marker, change, named):
    record = crafted(**change)
    with pytest.raises(UntrustedCodeError, match="--trust-run") as refused:
        make_recorded_env(record)
    assert named in str(refused.value)
    with pytest.raises(UntrustedCodeError):
        check_record(record, "runs/x/config.json")
    assert not code_marker.exists()  # not even imported
    with pytest.raises((RuntimeError, TypeError)):  # the opt-in imports (and calls) it
        make_recorded_env(record, trust_code=True)
    assert code_marker.read_text().startswith("imported")


def test_records_of_the_registered_envs_rebuild_without_opt_in():
    for env_id in ("textgym/Blackjack-v1", "textgym/FrozenLake-v1", "textgym/Calculator-v0"):
        record = env_record(gym.make(env_id))
        check_record(record, "x")
        assert make_recorded_env(record).spec.id == env_id


def test_a_user_registered_env_is_trusted_for_the_names_its_registration_gives(
    tmp_path, monkeypatch
):
    (tmp_path / "trusttest_formatters.py").write_text(
        "from textgym.envs.classic import BlackjackFormatter\n"
        "class Formatter(BlackjackFormatter):\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    name = "trusttest_formatters:Formatter"
    found = untrusted("textgym/Blackjack-v1", {"formatter": name})
    assert found == [f"the importable name '{name}' (in formatter)"]
    textgym.register("trusttest/Blackjack-v0", "Blackjack-v1", name, action_names=["stick", "hit"])
    try:
        record = env_record(gym.make("trusttest/Blackjack-v0"))
        assert name in record["spec"]
        env = make_recorded_env(record)
        assert type(find_text_wrapper(env).formatter).__name__ == "Formatter"
        assert untrusted("textgym/Blackjack-v1", {"formatter": name}) == []
    finally:
        gym.registry.pop("trusttest/Blackjack-v0")


@pytest.mark.parametrize(
    ("env_id", "kwargs", "refused"),
    [
        ("textgym/Blackjack-v1", {"history": 2, "system_prompt": "Reply: stick"}, []),
        ("textgym/Blackjack-v1", {"system_prompt": "see http://example.com"}, []),
        ("textgym/Blackjack-v1", {"parser": "textgym.parsers:JSONActionParser"}, []),
        ("textgym/Blackjack-v1", {"formatter": "os:system"}, ["'os:system' (in formatter)"]),
        ("textgym/Blackjack-v1", {"a": {"b": ["json:loads"]}}, ["'json:loads' (in a.b[0])"]),
        ("textgym/Blackjack-v1", {"env_id": "os:Env-v0"}, ["'os:Env-v0' (in env_id)"]),
        ("os:Env-v0", {}, ["the env id 'os:Env-v0' (not registered here)"]),
        ("nosuch/Env-v0", {}, ["the env id 'nosuch/Env-v0' (not registered here)"]),
        ("textgym/Blackjack-v1", {"x": object()}, ["x holds a object, not JSON"]),
    ],
)
def test_what_a_file_may_name(env_id, kwargs, refused):
    found = untrusted(env_id, kwargs)
    assert len(found) == len(refused)
    for text, part in zip(found, refused, strict=True):
        assert part in text


def test_run_info_from_a_file_is_checked_but_the_command_line_is_not():
    info = {"env": "textgym/Blackjack-v1", "env_args": {"formatter": "os:system"}}
    with pytest.raises(CLIError, match=r"runs/x \(cli.json\) names code .*'os:system'"):
        recorded_env(info, None, {}, "runs/x (cli.json)")
    assert recorded_env(info, None, {}, "x", trust=True)[1] == {"formatter": "os:system"}
    # another env on the command line: the file's arguments are not used, nothing to check
    assert recorded_env(info, "textgym/FrozenLake-v1", {}, "x") == ("textgym/FrozenLake-v1", {})
    with pytest.raises(UntrustedCodeError):
        check_env_args("textgym/Blackjack-v1", info["env_args"], "x")
