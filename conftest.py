"""Shared test set-up: headless rendering for Gymnasium's pygame-based envs."""

import os
import tempfile

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
