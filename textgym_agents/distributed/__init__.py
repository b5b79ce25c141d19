"""The processes of a training run act as one: data parallel under ``accelerate launch``.

:mod:`.collectives` sums gradients and gathers statistics across processes (a single process
skips every collective); :mod:`.signals` makes Ctrl-C / SIGTERM stop them all at one point.
"""

from textgym_agents.distributed.collectives import Distributed, current, share_policy
from textgym_agents.distributed.signals import StopSignals

__all__ = ["Distributed", "StopSignals", "current", "share_policy"]
