"""One self-contained HTML page of a run: settings, curves and sampled episodes side by side.

No script and nothing fetched: inline CSS, the curves as a base64 PNG, every string from the
run directory escaped (model replies are untrusted text), and a policy that forbids scripts.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from textgym_agents.tracking.episode_samples import read_episode_samples
from textgym_agents.tracking.metrics_log import METRICS_FILE, read_metrics
from textgym_agents.tracking.plotting import (
    EVALUATIONS_FILE,
    curve_settings,
    learning_curve_figure,
    png_bytes,
)

__all__ = ["RunPageError", "render_run_page"]

EPISODES_PER_SIDE = 4
"""Sampled episodes shown from the first updates, and as many from the latest."""
_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.5em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { margin: 0; white-space: pre-wrap; word-break: break-word; font: 12px/1.35 monospace; }
.sides { display: grid; grid-template-columns: 1fr 1fr; gap: 1.5em; }
.episode { margin-bottom: 1.2em; }
.episode table { width: 100%; }
tr.invalid td { background: #fde8e8; }
.pos { color: #0a6b2b; } .neg { color: #b3261e; }
.role { color: #666; font-weight: bold; }
.note { color: #666; }
img.curves { max-width: 100%; border: 1px solid #ddd; }
"""


class RunPageError(ValueError):
    """A run directory that cannot be shown: missing, or a damaged file (named)."""


def render_run_page(
    run_dir: str | os.PathLike[str], episodes_per_side: int = EPISODES_PER_SIDE
) -> str:
    """The HTML page of ``run_dir``: settings, evaluations, curves, episodes first and latest.

    The run directory is read as data only (JSON files and ``metrics.jsonl``); nothing in it
    is imported or executed, and every string from it is escaped.

    Args:
        run_dir: A run directory of ``textgym train`` or ``PPOPolicy.learn``.
        episodes_per_side: Sampled episodes shown from the first updates and from the latest.

    Raises:
        RunPageError: ``run_dir`` has no ``metrics.jsonl``, or one of its files is damaged.

    Example:
        >>> import tempfile
        >>> from textgym_agents.tracking.metrics_log import MetricsLogger
        >>> from textgym_agents.tracking.episode_samples import EpisodeSampleLog
        >>> with MetricsLogger(tempfile.mkdtemp()) as m:
        ...     m.log({"env/episodes": 2, "env/return_mean": 0.5}, step=1)
        >>> turn = {"turn": 0, "messages": [], "reply": "<b>hi</b>", "invalid": True,
        ...         "parse_error": "not JSON", "reward": -1.0, "advantage": -0.5}
        >>> with EpisodeSampleLog(m.run_dir) as log:
        ...     log.append([{"update": 1, "turns": [turn]}])
        >>> page = render_run_page(m.run_dir)
        >>> "&lt;b&gt;hi&lt;/b&gt;" in page, "<b>hi</b>" in page, "<script" in page
        (True, False, False)
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunPageError(f"no such run directory: {run_dir}")
    if not (run_dir / METRICS_FILE).is_file():
        raise RunPageError(f"{run_dir} is not a run directory: it has no {METRICS_FILE}")
    try:
        records = read_metrics(run_dir)
    except (OSError, ValueError) as e:
        raise RunPageError(f"{run_dir / METRICS_FILE} is damaged: {e}") from None
    config = _json_file(run_dir / "config.json", dict)
    info = _json_file(run_dir / "cli.json", dict)
    evaluations = _json_file(run_dir / EVALUATIONS_FILE, list)
    samples = read_episode_samples(run_dir)
    title = f"textgym run {run_dir.resolve().name}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_POLICY}">',
        f"<title>{_text(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_text(title)}</h1>",
        _summary(run_dir, records, info, config),
        _evaluations(evaluations),
        _curves(run_dir, records),
        _episodes(samples, episodes_per_side),
        _settings(config),
        "</body></html>",
    ]
    return "\n".join(part for part in parts if part)


def _text(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _number(value: Any, spec: str = ".3g") -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _text("" if value is None else value)
    return format(value, spec) if math.isfinite(value) else str(value)


def _json_file(path: Path, kind: type) -> Any:
    """A JSON file of the run, or an empty ``kind`` when it is missing; damage is an error."""
    try:
        value = json.loads(path.read_bytes())
    except FileNotFoundError:
        return kind()
    except (OSError, ValueError) as e:
        raise RunPageError(f"{path} is damaged: {e}") from None
    if not isinstance(value, kind):
        raise RunPageError(f"{path} is damaged: expected a JSON {kind.__name__}")
    return value


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A table of cells that are already HTML (escaped by the caller)."""
    head = "".join(f"<th>{_text(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(rows_cells) + "</tr>" for rows_cells in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _summary(
    run_dir: Path, records: list[dict[str, Any]], info: Mapping[str, Any], config: Mapping[str, Any]
) -> str:
    base = config.get("base") if isinstance(config.get("base"), Mapping) else {}
    env = config.get("env") if isinstance(config.get("env"), Mapping) else {}
    last = records[-1] if records else {}
    facts = [
        ("env", info.get("env") or env.get("id")),
        ("model", info.get("model") or base.get("name_or_path") or "embedded"),
        ("episodes asked", info.get("episodes")),
        ("updates logged", last.get("step")),
        ("episodes trained", last.get("env/episodes")),
        ("run directory", str(run_dir)),
    ]
    rows = [[f"<th>{_text(k)}</th>", f"<td>{_number(v)}</td>"] for k, v in facts if v is not None]
    return "<h2>Run</h2>" + "<table>" + "".join(f"<tr>{''.join(r)}</tr>" for r in rows) + "</table>"


def _evaluations(points: list[Any]) -> str:
    rows = []
    for point in points:
        if not isinstance(point, Mapping):
            continue
        rows.append(
            [
                f"<td>{_text(point.get('name', ''))}</td>",
                f'<td class="num">{_number(point.get("episodes"))}</td>',
                f'<td class="num">{_number(point.get("evaluation_episodes"))}</td>',
                f'<td class="num">{_number(point.get("mean_return"), ".3f")}</td>',
                f'<td class="num">{_number(point.get("se"), ".3f")}</td>',
                f'<td class="num">{_rate(point.get("success_rate"))}</td>',
                f'<td class="num">{_rate(point.get("invalid_rate"))}</td>',
            ]
        )
    if not rows:
        return ""
    header = ["policy", "after episodes", "evaluation episodes", "mean return", "s.e."]
    return "<h2>Greedy evaluations</h2>" + _table([*header, "success", "invalid"], rows)


def _rate(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _text(f"{value:.1%}")
    return "-" if value is None else _text(value)


def _curves(run_dir: Path, records: list[dict[str, Any]]) -> str:
    if not records:
        return '<h2>Learning curves</h2><p class="note">No update has been logged yet.</p>'
    keys, x_key = curve_settings([run_dir])
    try:
        png = png_bytes(learning_curve_figure([run_dir], keys, x_key=x_key))
    except (TypeError, ValueError) as e:  # a metrics value that is not a number
        return f'<h2>Learning curves</h2><p class="note">Cannot draw them: {_text(e)}</p>'
    data = base64.b64encode(png).decode("ascii")
    alt = "learning curves: " + ", ".join(keys)
    return (
        "<h2>Learning curves</h2>"
        f'<img class="curves" alt="{_text(alt)}" src="data:image/png;base64,{data}">'
    )


def _episodes(samples: list[dict[str, Any]], per_side: int) -> str:
    title = "<h2>Sampled training episodes</h2>"
    if not samples:
        return title + '<p class="note">No episodes.jsonl (or it is empty).</p>'
    if len(samples) <= 2 * per_side:
        half = math.ceil(len(samples) / 2)
        first, latest = samples[:half], samples[half:]
    else:
        first, latest = samples[:per_side], samples[-per_side:]
    note = (
        '<p class="note">Each turn: what the model saw (the whole prompt on the first turn, then '
        "the new user message), its reply, whether the env parsed it, the reward and the "
        "advantage the update gave the turn.</p>"
    )
    columns = [("First updates", first), ("Latest updates", latest)]
    sides = "".join(
        f"<div><h3>{_text(name)}</h3>{''.join(_episode(r) for r in chosen)}</div>"
        for name, chosen in columns
    )
    return f'{title}{note}<div class="sides">{sides}</div>'


def _episode(record: Mapping[str, Any]) -> str:
    head = (
        f"update {_number(record.get('update'))}, after {_number(record.get('episodes_done'))} "
        f"episodes, env {_number(record.get('env_index'))}: return "
        f"{_number(record.get('return'))}"
    )
    if not record.get("complete", True):
        head += " (part of an episode: the rollout began or ended inside it)"
    if record.get("turns_cut"):
        head += f", {_number(record.get('turns_cut'))} middle turns left out"
    rows = []
    for turn in record.get("turns", []):
        if not isinstance(turn, Mapping):
            continue
        invalid = bool(turn.get("invalid"))
        parsed = "✗ rejected" if invalid else "✓"
        if turn.get("parse_error"):
            parsed += f"<pre>{_text(turn['parse_error'])}</pre>"
        advantage = turn.get("advantage")
        sign = _sign_class(advantage)
        rows.append(
            ("<tr class='invalid'>" if invalid else "<tr>")
            + f'<td class="num">{_number(turn.get("turn"))}</td>'
            + f"<td>{_messages(turn.get('messages'))}</td>"
            + f"<td><pre>{_text(turn.get('reply', ''))}</pre></td>"
            + f"<td>{parsed}</td>"
            + f'<td class="num">{_number(turn.get("reward"))}</td>'
            + f'<td class="num {sign}">{_number(advantage)}</td></tr>'
        )
    header = "".join(
        f"<th>{h}</th>" for h in ("turn", "model saw", "reply", "parsed", "reward", "advantage")
    )
    return (
        f'<div class="episode"><p>{head}</p><table><tr>{header}</tr>{"".join(rows)}</table></div>'
    )


def _sign_class(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or value == 0:
        return ""
    return "pos" if value > 0 else "neg"


def _messages(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    parts = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role, content = message.get("role", ""), message.get("content", "")
        block = f'<span class="role">{_text(role)}</span><pre>{_text(content)}</pre>'
        if role == "system":  # long and the same every episode: folded
            block = (
                f"<details><summary>system prompt</summary><pre>{_text(content)}</pre></details>"
            )
        parts.append(block)
    return "".join(parts)


def _settings(config: Mapping[str, Any]) -> str:
    ppo = config.get("ppo")
    if not isinstance(ppo, Mapping):
        return ""
    from textgym_agents.ppo.config import PPOConfig  # the defaults, to show what was changed

    defaults = PPOConfig().to_dict()
    rows = [
        [f"<td>{_text(key)}</td>", f"<td>{_text(json.dumps(value))}</td>"]
        + [f"<td>{_text(json.dumps(defaults.get(key)))}</td>"]
        for key, value in ppo.items()
        if key not in defaults or value != defaults[key]
    ]
    every = [[f"<td>{_text(k)}</td>", f"<td>{_text(json.dumps(v))}</td>"] for k, v in ppo.items()]
    return (
        "<h2>Settings</h2><p>PPO settings that differ from the defaults:</p>"
        + _table(["setting", "this run", "default"], rows)
        + "<details><summary>every setting</summary>"
        + _table(["setting", "value"], every)
        + "</details>"
    )
