from __future__ import annotations

import importlib.util
import json
import logging
import sys
import types

import numpy as np
import pytest
import torch

from textgym_agents.tracking.metrics_log import METRICS_FILE, MetricsLogger, read_metrics


def _lines(run_dir):
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]


# --- MetricsLogger ------------------------------------------------------------------------------


def test_log_writes_one_json_line_per_call(tmp_path):
    with MetricsLogger(tmp_path / "run") as m:
        m.log({"loss": 0.5, "n": 3, "ok": True}, step=1)
        m.log(
            {
                "np": np.float32(0.25),
                "npi": np.int64(7),
                "t": torch.tensor(2.0),
                "t1": torch.ones(1),
                "nan": float("nan"),
                "inf": torch.tensor(float("-inf")),
            },
            step=np.int64(2),
        )
    first, second = _lines(tmp_path / "run")
    assert set(first) == {"step", "time", "loss", "n", "ok"}
    assert (first["step"], first["loss"], first["n"], first["ok"]) == (1, 0.5, 3, True)
    assert second["step"] == 2 and second["time"] >= first["time"]
    assert (second["np"], second["npi"], second["t"], second["t1"]) == (0.25, 7, 2.0, 1.0)
    assert second["nan"] is None and second["inf"] is None
    assert "NaN" not in (tmp_path / "run" / METRICS_FILE).read_text()


def test_log_is_flushed_before_close(tmp_path):
    m = MetricsLogger(tmp_path)
    m.log({"a": 1.0}, step=0)
    assert read_metrics(tmp_path)[0]["a"] == 1.0
    m.close()
    m.close()  # idempotent
    with pytest.raises(RuntimeError, match=r"MetricsLogger.log\(\) called after close\(\)"):
        m.log({"a": 1.0}, step=1)


@pytest.mark.parametrize(
    ("metrics", "step", "error", "message"),
    [
        ({"v": torch.ones(2)}, 0, TypeError, "Metric 'v' must be a scalar"),
        ({"v": np.zeros(3)}, 0, TypeError, "Metric 'v' must be a scalar"),
        ({"v": "high"}, 0, TypeError, "Metric 'v' must be a number, got str"),
        ({"v": None}, 0, TypeError, "Metric 'v' must be a number, got NoneType"),
        ({"step": 1.0}, 0, ValueError, r"Metric names \['step'\] are reserved; rename them"),
        ({"v": 1.0}, 1.5, TypeError, "Expected an int step, got 1.5"),
        ({"v": 1.0}, True, TypeError, "Expected an int step, got True"),
    ],
)
def test_log_rejects_bad_input(tmp_path, metrics, step, error, message):
    with MetricsLogger(tmp_path) as m, pytest.raises(error, match=message):
        m.log(metrics, step=step)
    assert read_metrics(tmp_path) == []


def test_unknown_report_to_lists_allowed_names(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"Unknown report_to \['tensorbord'\]; expected any of "
        r"\['jsonl', 'tensorboard', 'wandb'\]",
    ):
        MetricsLogger(tmp_path, report_to=("jsonl", "tensorbord"))


def test_report_to_accepts_a_single_string_and_no_jsonl(tmp_path):
    with MetricsLogger(tmp_path / "a", report_to="jsonl") as m:
        m.log({"a": 1.0}, step=0)
    assert len(read_metrics(tmp_path / "a")) == 1
    with MetricsLogger(tmp_path / "b", report_to=()) as m:
        m.log({"a": 1.0}, step=0)
    assert not (tmp_path / "b" / METRICS_FILE).exists()


def test_reopening_appends_and_drops_a_partial_last_line(tmp_path, caplog):
    with MetricsLogger(tmp_path) as m:
        m.log({"a": 1.0}, step=0)
        m.log({"a": 2.0}, step=1)
    with open(tmp_path / METRICS_FILE, "a") as f:
        f.write('{"step": 2, "a": 3.')  # a run killed mid-write
    with caplog.at_level(logging.WARNING), MetricsLogger(tmp_path) as m:
        m.log({"a": 3.5}, step=2)
    assert "dropping a truncated last line" in caplog.text
    assert [(r["step"], r["a"]) for r in _lines(tmp_path)] == [(0, 1.0), (1, 2.0), (2, 3.5)]


def test_truncate_after_drops_later_steps_and_keeps_logging(tmp_path):
    with MetricsLogger(tmp_path) as m:
        for step in range(6):
            m.log({"a": float(step)}, step=step)
        assert m.truncate_after(3) == 2
        m.log({"a": 40.0}, step=4)
    assert [(r["step"], r["a"]) for r in read_metrics(tmp_path)] == [
        (0, 0.0),
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [METRICS_FILE]


def test_missing_optional_backends_warn_and_are_skipped(tmp_path, monkeypatch, caplog):
    # None in sys.modules makes the import fail whether or not the package is installed.
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with (
        caplog.at_level(logging.WARNING),
        MetricsLogger(tmp_path, report_to=("jsonl", "tensorboard", "wandb")) as m,
    ):
        m.log({"a": 1.0}, step=0)
    assert "report_to='tensorboard' skipped: tensorboard is not installed" in caplog.text
    assert "report_to='wandb' skipped: wandb is not installed" in caplog.text
    assert len(read_metrics(tmp_path)) == 1
    assert not (tmp_path / "tensorboard").exists()


def test_wandb_receives_config_and_finite_metrics(tmp_path, monkeypatch):
    calls = []

    class FakeRun:
        def log(self, data, step):
            calls.append(("log", data, step))

        def finish(self):
            calls.append(("finish",))

    def init(**kwargs):
        calls.append(("init", kwargs))
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    with MetricsLogger(
        tmp_path / "run", report_to="wandb", run_name="ppo-1", config={"lr": 1e-4}
    ) as m:
        m.log({"a": 1.0, "b": float("nan")}, step=3)
    assert calls == [
        ("init", {"name": "ppo-1", "config": {"lr": 1e-4}, "dir": str(tmp_path / "run")}),
        ("log", {"a": 1.0}, 3),
        ("finish",),
    ]


@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed"
)
def test_tensorboard_scalars_and_purge(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, report_to=("jsonl", "tensorboard"), config={"lr": 0.1}) as m:
        for step in range(4):
            m.log({"env/return_mean": float(step), "loss": float("nan")}, step=step)
        m.truncate_after(1)
        m.log({"env/return_mean": 20.0}, step=2)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert "loss" not in events.Tags()["scalars"]
    scalars = [(e.step, e.value) for e in events.Scalars("env/return_mean")]
    assert scalars == [(0, 0.0), (1, 1.0), (2, 20.0)]


# --- read_metrics -------------------------------------------------------------------------------


def test_read_metrics_skips_a_truncated_last_line(tmp_path, caplog):
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 0, "a": 1}\n\n{"step": 1, "a": null}\n{"step": 2, "a"')
    with caplog.at_level(logging.WARNING):
        records = read_metrics(path)
    assert records == [{"step": 0, "a": 1}, {"step": 1, "a": None}]
    assert "skipping truncated last line 4" in caplog.text
    assert read_metrics(tmp_path) == records


def test_read_metrics_raises_on_a_corrupt_middle_line(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 0}\n{"step": 1\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: invalid metrics line"):
        read_metrics(path)
    path.write_text('{"step": 0}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: expected an object with a 'step'"):
        read_metrics(path)
