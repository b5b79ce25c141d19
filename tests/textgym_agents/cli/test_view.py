"""`textgym view` on a real tiny run: the page, its escaping, its errors; a headless browser."""

import json
import shutil
import subprocess

import numpy as np
import pytest

from textgym.cli import main  # also registers the textgym/ envs
from textgym_agents.tracking.episode_samples import read_episode_samples
from textgym_agents.tracking.metrics_log import read_metrics

CHROMIUM = "/usr/bin/chromium"
HOSTILE = '<script>alert("reply")</script><img src=x onerror=alert(1)>'


@pytest.fixture(scope="module")
def run(tiny_dir, tmp_path_factory):
    """A finished tiny run with free decoding: random replies, rejected (3 end an episode)."""
    out = tmp_path_factory.mktemp("view") / "run"
    args = ["train", "textgym/Blackjack-v1", "--model", tiny_dir, "--episodes", "6"]
    args += ["--eval-episodes", "2", "--num-envs", "2", "--num-steps", "3", "--no-progress"]
    args += ["--minibatch-size", "8", "--decoding", "free", "--max-new-tokens", "6"]
    assert main([*args, "--output", str(out)]) == 0
    return out


@pytest.mark.slow
def test_training_records_sampled_episodes_with_their_advantages(run):
    records = read_episode_samples(run)
    steps = [r["step"] for r in read_metrics(run)]
    assert {r["update"] for r in records} == set(steps)  # every update, as logged
    assert all(len([r for r in records if r["update"] == s]) <= 2 for s in steps)
    turns = [t for r in records for t in r["turns"]]
    assert all(isinstance(t["advantage"], float) and np.isfinite(t["advantage"]) for t in turns)
    rejected = [t for t in turns if t["invalid"]]
    assert rejected and all(t["parse_error"] for t in rejected)  # why, for each rejected reply
    first = next(r for r in records if r["complete"])["turns"][0]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]


@pytest.mark.slow
def test_view_writes_one_self_contained_page(run, tmp_path, capsys):
    copy = shutil.copytree(run, tmp_path / "run")
    records = read_episode_samples(copy)
    records[-1]["turns"][0]["reply"] = HOSTILE  # what a model may well write
    records[-1]["turns"][0]["parse_error"] = "</pre><b>not JSON</b>"
    lines = "".join(json.dumps(r) + "\n" for r in records)
    (copy / "episodes.jsonl").write_text(lines)

    assert main(["view", str(copy)]) == 0
    assert capsys.readouterr().out == f"Wrote {copy / 'view.html'}\n"
    page = (copy / "view.html").read_text()
    assert "&lt;script&gt;alert(&quot;reply&quot;)&lt;/script&gt;" in page
    assert "&lt;/pre&gt;&lt;b&gt;not JSON&lt;/b&gt;" in page
    assert "<script" not in page and "onerror=" not in page.replace("onerror=alert", "")
    assert "http://" not in page and "https://" not in page  # nothing fetched
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert page.count('src="data:image/png;base64,') == 1  # the curves, inline
    assert "First updates" in page and "Latest updates" in page
    assert "update 1," in page and f"update {read_metrics(copy)[-1]['step']}," in page
    assert "textgym/Blackjack-v1" in page and "decoding" in page  # the run's settings

    out = tmp_path / "elsewhere.html"
    assert main(["view", str(copy), "--output", str(out), "--episodes", "1"]) == 0
    assert out.read_text().count('<div class="episode">') == 2  # one first, one latest


def test_view_of_a_missing_or_damaged_run_is_a_one_line_error(run, tmp_path, capsys):
    damaged = shutil.copytree(run, tmp_path / "damaged")
    (damaged / "config.json").write_text('{"ppo": ')
    broken_metrics = shutil.copytree(run, tmp_path / "broken")
    (broken_metrics / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    cases = [
        (tmp_path / "missing", "no such run directory"),
        (tmp_path, "is not a run directory: it has no metrics.jsonl"),
        (damaged, "config.json is damaged"),
        (broken_metrics, "metrics.jsonl is damaged"),
    ]
    for path, message in cases:
        assert main(["view", str(path)]) == 1, path
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (damaged / "view.html").exists()


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which(CHROMIUM) is None,
    reason=f"no {CHROMIUM}: apt-get install chromium (scripts/setup.sh does as root)",
)
def test_a_headless_browser_shows_the_page_without_errors(run, tmp_path):
    from PIL import Image

    assert main(["view", str(run)]) == 0
    url = (run / "view.html").resolve().as_uri()
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic"]
    flags += ["--no-first-run", "--disable-background-networking", "--disable-component-update"]
    flags += ["--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]
    flags += ["--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # A page without scripts logs nothing: a console line would be an error, or a blocked fetch.
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert console == []
    assert dom.stdout.count("<table>") >= 3 and "<script" not in dom.stdout
    assert 'class="curves"' in dom.stdout and "Latest updates" in dom.stdout

    shot = tmp_path / "page.png"
    size = ["--window-size=1200,2000", f"--screenshot={shot}"]
    result = subprocess.run([*flags, *size, url], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert pixels.shape == (2000, 1200, 3)
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # not blank, not one colour
    # The curves: matplotlib's first colour (C0, #1f77b4) drawn by the inline PNG.
    blue = np.all(np.abs(pixels - [31, 119, 180]) <= 12, axis=-1)
    assert blue.sum() > 200
    # The tables: header cells (#f3f3f3) in the top half and beside each other lower down.
    header = np.all(pixels == [243, 243, 243], axis=-1)
    rows_with_header = np.flatnonzero(header.any(axis=1))
    assert rows_with_header.min() < 1000 and rows_with_header.max() > blue.nonzero()[0].max()
    left, right = header[:, :600].any(axis=0).sum(), header[:, 600:].any(axis=0).sum()
    assert left > 100 and right > 100  # first and latest updates side by side
