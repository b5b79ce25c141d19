"""episodes.jsonl: sampled episodes per update, capped per record and per file."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from textgym_agents.ppo.buffer import Turn, TurnText
from textgym_agents.tracking.episode_samples import (
    EPISODES_FILE,
    EpisodeSampleLog,
    fit_record,
    read_episode_samples,
    sample_episodes,
)

SYSTEM = {"role": "system", "content": "Play well."}


def _turn(index, reply, reward=0.0, done=False, invalid=False, advantage=0.0):
    seen = [SYSTEM, {"role": "user", "content": f"state {index}"}]
    error = "expected JSON" if invalid else None
    turn = Turn([1], [2], reward, terminated=done, invalid=invalid)
    turn.text = TurnText(seen, reply, error, index)
    turn.advantage = advantage
    return turn


def test_a_sample_is_an_episode_turn_by_turn_with_its_rewards_and_advantages():
    streams = {
        0: [_turn(3, "late", done=True), _turn(0, "a"), _turn(1, "bad", -1.0, True, True, -0.7)],
        1: [_turn(5, "middle")],  # a piece: the rollout began and ended inside the episode
    }
    rng = np.random.default_rng(0)
    (record,) = sample_episodes(streams, 1, rng, update=4, episodes_done=9)
    assert {k: record[k] for k in ("update", "episodes_done", "env_index", "complete")} == {
        "update": 4,
        "episodes_done": 9,
        "env_index": 0,
        "complete": True,
    }
    first, second = record["turns"]
    assert first["messages"] == [SYSTEM, {"role": "user", "content": "state 0"}]
    assert second["messages"] == [{"role": "user", "content": "state 1"}]  # what is new
    assert (second["reply"], second["invalid"], second["parse_error"]) == (
        "bad",
        True,
        "expected JSON",
    )
    assert (second["reward"], second["advantage"], record["return"]) == (-1.0, -0.7, -1.0)
    json.dumps(record)  # JSON-ready

    every = sample_episodes(streams, 5, np.random.default_rng(0), update=4)
    assert [r["complete"] for r in every] == [True, False, False]  # whole episodes first
    hand_filled = {0: [Turn([1], [2], 1.0, terminated=True)]}  # no text: never sampled
    assert sample_episodes(hand_filled, 2, np.random.default_rng(0)) == []


def test_a_record_over_its_cap_cuts_long_texts_then_middle_turns():
    turns = [{"turn": i, "reply": "r" * 5_000, "reward": float(i)} for i in range(40)]
    line = fit_record({"update": 1, "turns": turns}, max_bytes=4_000)
    assert len(line) <= 4_000 and line.endswith(b"\n")
    record = json.loads(line)
    kept = [t["turn"] for t in record["turns"]]
    assert kept[0] == 0 and kept[-1] == 39  # the first turn and the latest ones
    assert record["turns_cut"] == 40 - len(kept) > 0
    assert record["turns"][0]["reply"].endswith("characters cut]")
    small = {"update": 2, "turns": [{"reply": "ok"}]}
    assert json.loads(fit_record(small, max_bytes=4_000)) == small  # unchanged when it fits


def test_the_file_cap_keeps_the_first_and_the_latest_updates(tmp_path):
    with EpisodeSampleLog(tmp_path, max_bytes=20_000, max_record_bytes=1_000) as log:
        for update in range(1, 301):
            log.append([{"update": update, "turns": [{"reply": "x" * 400}]}] * 2)
            assert (tmp_path / EPISODES_FILE).stat().st_size <= 20_000
    updates = [r["update"] for r in read_episode_samples(tmp_path)]
    assert updates[:2] == [1, 1] and updates[-2:] == [300, 300]
    assert updates == sorted(updates) and len(set(updates)) < 300  # middle ones dropped
    assert max(np.diff(updates)) > 1


def test_a_resumed_run_drops_the_samples_after_its_checkpoint(tmp_path):
    with EpisodeSampleLog(tmp_path) as log:
        log.append({"update": u, "turns": []} for u in (1, 2, 3, 4))
    (tmp_path / EPISODES_FILE).open("ab").write(b'{"update": 5, "tur')  # killed mid-line
    with EpisodeSampleLog(tmp_path) as log:
        log.truncate_after(2)
        log.append([{"update": 3, "turns": []}])
    assert [r["update"] for r in read_episode_samples(tmp_path)] == [1, 2, 3]


def test_a_file_that_cannot_be_written_warns_and_never_raises(tmp_path, caplog):
    target = tmp_path / "elsewhere.jsonl"
    target.write_text("")
    (tmp_path / EPISODES_FILE).symlink_to(target)  # a run file must not follow a link
    with caplog.at_level(logging.WARNING), EpisodeSampleLog(tmp_path) as log:
        log.append([{"update": 1, "turns": []}])
        log.truncate_after(0)
    assert target.read_text() == ""
    assert "is a symbolic link" in caplog.text and "no more episode samples" in caplog.text


def test_reading_skips_lines_that_are_not_records(tmp_path):
    lines = ['{"update": 1, "turns": []}', "not json", "[1, 2]", '{"update": 2, "turns": 5}']
    (tmp_path / EPISODES_FILE).write_text("\n".join(lines) + "\n")
    assert read_episode_samples(tmp_path) == [{"update": 1, "turns": []}]


def test_the_caps_are_checked():
    with pytest.raises(ValueError, match="max_record_bytes <= max_bytes / 4, got 600 and 2000"):
        EpisodeSampleLog("unused", max_bytes=2_000, max_record_bytes=600)
