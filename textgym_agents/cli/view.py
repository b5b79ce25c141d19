"""``textgym view``: one self-contained HTML page of a run (no server, nothing fetched).

The ``view`` entry point of ``textgym.commands``; the page is built by
:mod:`textgym_agents.tracking.run_page`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from textgym.cli_common import CLIError, positive_int
from textgym.plugins import FunctionCommand

__all__ = ["command", "configure", "run_view"]

VIEW_EPILOG = """\
examples:
  textgym view runs/bj                      # writes runs/bj/view.html; open it in a browser
  textgym view runs/bj --output bj.html --episodes 8

The page shows the run's settings, its greedy evaluations, the learning curves and sampled
training episodes (episodes.jsonl) turn by turn, the first updates beside the latest.
"""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``textgym view``."""
    parser.description = "Write one HTML page of a run: settings, curves and sampled episodes."
    parser.epilog = VIEW_EPILOG
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (with metrics.jsonl)")
    parser.add_argument("--output", metavar="HTML", help="default: RUN_DIR/view.html")
    parser.add_argument(
        "--episodes",
        type=positive_int,
        default=4,
        help="episodes shown from the first updates, and as many from the latest (default: 4)",
    )


def run_view(args: argparse.Namespace) -> int:
    """``textgym view``: write the page and print where it is."""
    run = Path(args.run_dir)
    from textgym_agents.runfiles.atomic import atomic_write_bytes
    from textgym_agents.tracking.run_page import RunPageError, render_run_page

    try:
        page = render_run_page(run, episodes_per_side=args.episodes)
    except RunPageError as e:
        raise CLIError(str(e)) from None
    output = Path(args.output) if args.output else run / "view.html"
    try:
        atomic_write_bytes(output, page.encode("utf-8"))
    except OSError as e:
        raise CLIError(f"could not write {output}: {e.strerror or e}") from None
    print(f"Wrote {output}")
    return 0


command = FunctionCommand("view", "write one HTML page of a run to look at", configure, run_view)
"""``textgym view``, the ``view`` entry point of ``textgym.commands``."""
