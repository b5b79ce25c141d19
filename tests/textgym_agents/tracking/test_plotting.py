from __future__ import annotations

import matplotlib
import numpy as np
import pytest

from textgym_agents.tracking.metrics_log import METRICS_FILE, MetricsLogger
from textgym_agents.tracking.plotting import _moving_average, plot_learning_curves

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _fake_run(run_dir, n=30, seed=0, invalid=True):
    rng = np.random.default_rng(seed)
    with MetricsLogger(run_dir) as m:
        for step in range(n):
            metrics = {"env/return_mean": step / n + rng.normal(0, 0.1), "env/episodes": 4 * step}
            if invalid:
                metrics["env/invalid_rate"] = max(0.0, 0.5 - step / n)
            m.log(metrics, step=step)
    return run_dir


def test_moving_average_matches_naive_reference():
    ys = np.random.default_rng(0).normal(size=17)
    for window in (1, 3, 5, 40):
        expected = [ys[max(0, i - window + 1) : i + 1].mean() for i in range(len(ys))]
        np.testing.assert_allclose(_moving_average(ys, window), expected)


def _assert_png(path, min_bytes=10_000):
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > min_bytes


def test_plot_one_run(tmp_path):
    run = _fake_run(tmp_path / "run-a")
    backend = matplotlib.get_backend()
    out = plot_learning_curves([run], tmp_path / "plots" / "curves.png")
    assert out == tmp_path / "plots" / "curves.png"
    _assert_png(out)
    assert matplotlib.get_backend() == backend
    assert sorted(p.name for p in out.parent.iterdir()) == ["curves.png"]


def test_plot_two_runs_with_options(tmp_path):
    a = _fake_run(tmp_path / "run-a", seed=0)
    b = _fake_run(tmp_path / "run-b", n=20, seed=1, invalid=False)  # no env/invalid_rate
    out = plot_learning_curves(
        [a, b / METRICS_FILE],
        tmp_path / "curves.png",
        keys=("env/return_mean", "env/invalid_rate", "missing/everywhere"),
        labels=["PPO", "random"],
        smooth=5,
        references={"env/return_mean": 0.5},
        x_key="env/episodes",
    )
    _assert_png(out)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"runs": []}, "Expected at least one run directory or metrics file, got none"),
        ({"keys": ()}, "Expected at least one metric key to plot, got none"),
        ({"smooth": 0}, r"Expected smooth >= 1 \(1 = no smoothing\), got 0"),
        ({"labels": ["a", "b"]}, r"Expected 1 labels \(one per run\), got 2"),
    ],
)
def test_plot_validates_arguments(tmp_path, kwargs, message):
    kwargs.setdefault("runs", [_fake_run(tmp_path / "run", n=3)])
    with pytest.raises(ValueError, match=message):
        plot_learning_curves(out_path=tmp_path / "x.png", **kwargs)
    assert not (tmp_path / "x.png").exists()


def test_a_runs_curve_is_against_episodes_with_its_evaluations_as_error_bars(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    from textgym_agents.tracking.plotting import plot_run, write_evaluations

    with MetricsLogger(tmp_path) as log:
        for step in range(1, 4):
            row = {"env/episodes": 5 * step, "env/return_mean": step, "env/invalid_rate": 0.1}
            log.log(row, step=step)
    write_evaluations(tmp_path, [
        {"name": "base model", "episodes": 0, "mean_return": 0.5, "se": 0.2},
        {"name": "trained", "episodes": 15, "mean_return": 2.5, "se": 0.3},
    ])  # fmt: skip
    drawn, titles = [], []
    original_errorbar, original_title = Axes.errorbar, Axes.set_title
    monkeypatch.setattr(
        Axes,
        "errorbar",
        lambda ax, x, y, **kw: (
            drawn.append((list(x), list(y), kw["yerr"])) or original_errorbar(ax, x, y, **kw)
        ),
    )
    monkeypatch.setattr(
        Axes, "set_title", lambda ax, t, *a, **kw: titles.append(t) or original_title(ax, t)
    )
    assert plot_run(tmp_path).read_bytes()[1:4] == b"PNG"
    assert titles == ["env/return_mean", "env/invalid_rate"]  # no success rate logged: no plot
    assert drawn[0] == ([0.0, 15.0], [0.5, 2.5], [0.2, 0.3])


def test_a_runs_figure_has_episodes_on_x_with_whole_ticks_and_evaluation_error_bars(tmp_path):
    from matplotlib.container import ErrorbarContainer

    from textgym_agents.tracking.plotting import (
        curve_settings,
        learning_curve_figure,
        write_evaluations,
    )

    with MetricsLogger(tmp_path) as log:
        for step in range(1, 4):  # three updates of 1 episode: few points, as in a short run
            row = {"env/episodes": step, "env/return_mean": step / 3}
            log.log({**row, "env/success_rate": step / 4, "env/invalid_rate": 0.1}, step=step)
    write_evaluations(tmp_path, [
        {"name": "base model", "episodes": 0, "mean_return": 0.1, "se": 0.05,
         "success_rate": 0.2, "success_se": 0.04, "invalid_rate": 0.3},
        {"name": "trained", "episodes": 3, "mean_return": 0.9, "se": 0.1,
         "success_rate": 0.7, "success_se": 0.05, "invalid_rate": 0.0},
    ])  # fmt: skip
    keys, x_key = curve_settings([tmp_path])
    assert keys == ["env/return_mean", "env/success_rate", "env/invalid_rate"]
    assert x_key == "env/episodes"
    fig = learning_curve_figure([tmp_path], keys, x_key=x_key)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == keys
    for ax in shown:
        assert ax.get_xlabel() == "training episodes"
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
        (curve,) = ax.get_lines()[:1]
        assert list(curve.get_xdata()) == [1, 2, 3] and curve.get_marker() == "o"
        (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        points, _, _ = bars.lines
        assert list(points.get_xdata()) == [0.0, 3.0]
    success_points = [c for c in shown[1].containers if isinstance(c, ErrorbarContainer)]
    assert list(success_points[0].lines[0].get_ydata()) == [0.2, 0.7]


def test_textgym_plot_of_one_run_redraws_its_curve_against_episodes(tmp_path, monkeypatch):
    from textgym.cli import main
    from textgym_agents.tracking import plotting

    _fake_run(tmp_path / "run", n=5)
    seen = {}
    original = plotting.learning_curve_figure

    def spy(runs, keys, labels=None, smooth=1, references=None, x_key="step"):
        seen.update(keys=list(keys), x_key=x_key)
        return original(runs, keys, labels, smooth, references, x_key)

    monkeypatch.setattr(plotting, "learning_curve_figure", spy)
    assert main(["plot", str(tmp_path / "run")]) == 0
    assert seen == {"keys": ["env/return_mean", "env/invalid_rate"], "x_key": "env/episodes"}
    _assert_png(tmp_path / "run" / "learning_curve.png")
    assert main(["plot", str(tmp_path / "run"), "--x", "step", "--keys", "env/return_mean"]) == 0
    assert seen == {"keys": ["env/return_mean"], "x_key": "step"}
