"""The training commands of ``textgym``: ``train``, ``eval``, ``plot`` and ``sft``.

Each module's ``command`` is a :class:`textgym.plugins.Command` that reaches ``textgym`` through
the ``textgym.commands`` entry points (pyproject.toml); :mod:`~textgym_agents.cli.policies` is
the ``textgym.policies`` loader behind ``play``/``record --policy``. Run-directory knowledge is
in :mod:`~textgym_agents.cli.runs`, training defaults in :mod:`textgym_agents.ppo.defaults`.
"""
