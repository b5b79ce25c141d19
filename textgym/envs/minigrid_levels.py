"""BabyAI levels that GLAM's BabyAI-Text uses and the ``minigrid`` package does not ship.

Imports ``minigrid`` at the top: :mod:`textgym.envs.minigrid_text` imports this module only
when such a level is made, after checking that the extra is installed.
"""

from __future__ import annotations

from typing import Any

from minigrid.envs.babyai.core.roomgrid_level import RoomGridLevel
from minigrid.envs.babyai.core.verifier import ObjDesc, PickupInstr

__all__ = ["PickupLocal"]


class PickupLocal(RoomGridLevel):
    """Pick up an object in a single room without doors: GoToLocal's layout, a pickup mission.

    The room holds ``num_dists`` objects (balls, boxes, keys); one of them is named by colour
    and type ("pick up the blue key"). Picking up any object the mission names succeeds;
    the episode is truncated after ``max_steps`` (64 for the default 8 × 8 room).

    Example:
        >>> env = PickupLocal()
        >>> obs, info = env.reset(seed=0)
        >>> obs["mission"]
        'pick up the green ball'
    """

    def __init__(self, room_size: int = 8, num_dists: int = 8, **kwargs: Any) -> None:
        """Create the level.

        Args:
            room_size: Side of the room, walls included.
            num_dists: Objects placed in the room, the target among them.
            **kwargs: Passed to minigrid's ``RoomGridLevel`` (``max_steps``, ``render_mode``).
        """
        self.num_dists = num_dists
        super().__init__(num_rows=1, num_cols=1, room_size=room_size, **kwargs)

    def gen_mission(self) -> None:
        """Place the agent and the objects, then name one of them to pick up."""
        self.place_agent()
        objs = self.add_distractors(num_distractors=self.num_dists, all_unique=False)
        self.check_objs_reachable()
        target = self._rand_elem(objs)
        self.instrs = PickupInstr(ObjDesc(target.type, target.color))
