"""``textgym serve``: a text env as an OpenEnv server (needs ``pip install "textgym[openenv]"``)."""

from __future__ import annotations

import argparse

from textgym.cli_common import (
    DEFAULT_ENV,
    CLIError,
    add_env_arg,
    make_env,
    parse_env_args,
    positive_int,
)

__all__ = ["SERVE", "ServeCommand"]

SERVE_EPILOG = """\
Any OpenEnv client plays it over the WebSocket /ws, one env per session; /health, /schema and
/docs describe it. Train on it from another process with
gym.make("textgym/OpenEnv-v0", base_url="http://127.0.0.1:8000").

examples:
  textgym serve textgym/Blackjack-v1
  textgym serve textgym/FrozenLake-v1 -e is_slippery=false --port 8001 --max-sessions=16
"""


class ServeCommand:
    """``textgym serve``: serve a text env over OpenEnv's protocol until interrupted."""

    name = "serve"
    help = "serve a text env over OpenEnv's protocol (HTTP + WebSocket)"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Add the env, host, port and session limit."""
        parser.description = "Serve a text env as an OpenEnv server, one env per session."
        parser.epilog = SERVE_EPILOG
        parser.add_argument(
            "env", nargs="?", default=DEFAULT_ENV, metavar="ENV_ID", help=f"default: {DEFAULT_ENV}"
        )
        parser.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
        parser.add_argument(
            "--max-sessions",
            type=positive_int,
            default=4,
            help="sessions open at once; one more gets a capacity error (default: 4)",
        )
        add_env_arg(parser)

    def run(self, args: argparse.Namespace) -> int:
        """Check the env, then serve it (blocks until Ctrl-C)."""
        env_args = parse_env_args(args.env_arg)
        make_env(args.env, env_args).close()  # one-line errors for unknown ids and bad options
        try:
            from textgym.openenv_server import serve
        except ModuleNotFoundError as e:
            raise CLIError(str(e)) from e
        print(f"serving {args.env} on http://{args.host}:{args.port} (Ctrl-C stops)", flush=True)
        serve(
            args.env,
            host=args.host,
            port=args.port,
            max_sessions=args.max_sessions,
            **env_args,
        )
        return 0


SERVE = ServeCommand()
