"""Pieces of one PPO optimizer step: the minibatch layout and one micro-batch's loss.

:class:`~textgym_agents.ppo.trainer.PPOTrainer` strings them together; the losses are in
:mod:`.core`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from textgym_agents.decoding.shared_prefix import containing_rows, shared_length
from textgym_agents.ppo import core
from textgym_agents.ppo.buffer import Turn

logger = logging.getLogger(__name__)

__all__ = [
    "STEP_STATS",
    "VALUE_STATS",
    "behaviour_weight",
    "chained_order",
    "keep_old_scores",
    "micro_batch_loss",
    "minibatch_loss",
    "minibatches",
    "score_inputs",
]

# Statistics of one optimizer step, summed over micro-batches (and processes).
STEP_STATS = (
    "loss/policy",
    "loss/value",
    "loss/total",
    "policy/entropy",
    "policy/approx_kl",
    "policy/clip_frac",
    "policy/ratio_mean",
    "value/clip_frac",
)
VALUE_STATS = ("loss/value", "value/")
"""Prefixes of the statistics a critic-free run leaves out."""


def minibatches(
    order: np.ndarray,
    turns: list[Turn],
    minibatch_size: int,
    micro_batch_size: int,
    micro_batch_tokens: int | None = None,
    *,
    pack: bool = False,
) -> Iterator[list[list[int]]]:
    """Minibatches of turn indices, each split into micro-batches of similar length.

    Sorting within a minibatch cuts padding without changing its gradient. The same order
    gives the same layout, so scoring and the first epoch see identical forward passes. With
    ``micro_batch_tokens``, a micro-batch also stops growing before its rows, padded to its
    longest, would pass more tokens than that through the model (the start every row of the
    minibatch shares runs once and is not counted); a longer row still gets a micro-batch of
    its own. Activation memory follows these tokens, so this bounds it where prompts are long.
    With ``pack``, a free-text turn whose prompt and reply begin another turn's prompt in the
    same minibatch rides in that turn's row (``PPOConfig.pack_turns``): it joins that turn's
    micro-batch and costs no row or tokens of its own.

    Args:
        order: A permutation of ``range(len(turns))``, shape ``(N,)``.
        turns: The turns the indices point into.
        minibatch_size: Turns per minibatch (one optimizer step); the last may be smaller.
        micro_batch_size: Most rows per forward pass.
        micro_batch_tokens: Most padded tokens per forward pass, or None for no bound.
        pack: Let turns ride in the row of a turn that begins with them.

    Example:
        >>> turns = [Turn([1], [2] * n, reward=0.0) for n in (1, 3, 2)]
        >>> list(minibatches(np.array([0, 1, 2]), turns, 2, 1))
        [[[1], [0]], [[2]]]
        >>> list(minibatches(np.array([0, 1, 2]), turns, 3, 3, micro_batch_tokens=8))
        [[[1, 2], [0]]]
        >>> list(minibatches(np.array([0, 1, 2]), turns, 3, 1, pack=True))
        [[[1, 0, 2]]]
    """
    for start in range(0, len(order), minibatch_size):
        chunk = order[start : start + minibatch_size].tolist()
        rows = _rows(chunk, turns) if pack else [[i] for i in chunk]
        rows.sort(key=lambda row: -_length(turns[row[0]]))
        if micro_batch_tokens is None:
            yield [
                [i for row in rows[j : j + micro_batch_size] for i in row]
                for j in range(0, len(rows), micro_batch_size)
            ]
            continue
        prompts = [turns[i].prompt_ids for i in chunk]
        shared = shared_length(prompts, min(len(p) for p in prompts) - 1)
        micros: list[list[list[int]]] = []
        width = 0  # own tokens of the current micro-batch's first (longest) row
        for row in rows:  # longest first: a micro-batch's first row sets its padded width
            count = len(micros[-1]) if micros else 0
            if 0 < count < micro_batch_size and width * (count + 1) <= micro_batch_tokens:
                micros[-1].append(row)
                continue
            micros.append([row])
            width = _length(turns[row[0]]) - shared
        yield [[i for row in micro for i in row] for micro in micros]


def _rows(chunk: list[int], turns: list[Turn]) -> list[list[int]]:
    """The chunk's turns as forward rows: each row's longest turn first, then those it holds."""
    free = [i for i in chunk if turns[i].choice_ids is None]  # choice turns are scored apart
    owner = containing_rows([turns[i].prompt_ids + turns[i].response_ids for i in free])
    carrier = {i: i for i in chunk} | {i: free[o] for i, o in zip(free, owner, strict=True)}
    rows: dict[int, list[int]] = {}
    for i in chunk:
        row = rows.setdefault(carrier[i], [carrier[i]])
        if carrier[i] != i:
            row.append(i)
    return list(rows.values())


def chained_order(rng: np.random.Generator, turns: list[Turn]) -> np.ndarray:
    """A random order of ``turns`` in which each chain of turns stays together, in order.

    Consecutive turns form a chain where one's prompt and reply begin the next one's prompt
    (a multi-turn episode that keeps its conversation), so :func:`minibatches` with ``pack``
    can run the chain as one row. The chains are shuffled, not the turns; without chains this
    is ``rng.permutation(len(turns))``.

    Example:
        >>> turns = [Turn([1], [2], 0.0), Turn([1, 2, 3], [4], 0.0), Turn([5], [6], 0.0)]
        >>> chained_order(np.random.default_rng(0), turns).tolist() in ([0, 1, 2], [2, 0, 1])
        True
    """
    chains: list[list[int]] = []
    for i, turn in enumerate(turns):
        before = turns[i - 1] if i else None
        if (
            before is not None
            and turn.choice_ids is None
            and turn.prompt_ids[: _length(before)] == before.prompt_ids + before.response_ids
        ):
            chains[-1].append(i)
        else:
            chains.append([i])
    return np.array([i for k in rng.permutation(len(chains)) for i in chains[k]], dtype=int)


def _length(turn: Turn) -> int:
    return len(turn.prompt_ids) + len(turn.response_ids)


def score_inputs(turns: list[Turn], rows: list[int]) -> dict[str, Any]:
    """What :meth:`PPOPolicy.score <textgym_agents.PPOPolicy.score>` needs for turns ``rows``."""
    return {
        "prompts": [turns[i].prompt_ids for i in rows],
        "responses": [turns[i].response_ids for i in rows],
        "choices": [turns[i].choice_ids for i in rows],
    }


def keep_old_scores(turn: Turn, scores: Any, row: int) -> None:
    """Keep row ``row`` of ``scores`` on ``turn`` as its old log-probs, detached, on the CPU.

    ``old_logps`` holds the turn's scored tokens; ``old_choice_logps`` the log-probs of all its
    choices, where it has choices (else None).
    """
    turn.old_logps = scores.logps[row, : turn.scored_tokens].detach().cpu()
    every = scores.choice_logps[row] if scores.choice_logps else None
    turn.old_choice_logps = None if every is None else every.detach().cpu()


def micro_batch_loss(
    policy: Any,
    config: Any,
    turns: list[Turn],
    minibatch_tokens: float,
    minibatch_turns: float,
    ent_coef: float | None = None,
    *,
    first_pass: bool = False,
) -> dict[str, float]:
    """Forward + backward of one micro-batch, weighted so the minibatch sums to means.

    The policy and entropy terms are token means, so they are weighted by this micro-batch's
    share of the minibatch's scored tokens; the value term is a turn mean, weighted by its
    share of the turns. Summing the returned statistics (the keys of :data:`STEP_STATS`) and
    the gradients over a minibatch's micro-batches gives those of the whole minibatch.

    Args:
        policy: The :class:`~textgym_agents.PPOPolicy` being trained.
        config: Its :class:`~textgym_agents.PPOConfig` (clip ranges, ``ent_coef``, ``vf_coef``).
        turns: The scored turns of this micro-batch (``old_logps``, ``value``, ``advantage``,
            ``returns`` set).
        minibatch_tokens: Scored tokens of the whole minibatch (over every process).
        minibatch_turns: Turns of the whole minibatch (over every process).
        ent_coef: The entropy bonus's weight now (default ``config.ent_coef``; the trainer's
            :class:`~textgym_agents.ppo.core.EntropyController` steers it).
        first_pass: The weights are still the rollout's (the first optimizer step of the
            update): a turn without ``old_logps`` takes this pass's own, detached, so its
            ratio is exactly 1 (``PPOConfig.score_in_update``). Otherwise such a turn is an
            error.

    Raises:
        ValueError: A turn has no ``old_logps`` and this is not the first pass.
    """
    device = policy.device
    if not first_pass and any(t.old_logps is None for t in turns):
        raise ValueError(
            "A turn has no old log-probs: score the batch (PPOTrainer.score) with the order "
            "of the first epoch before optimising it"
        )
    ent_coef = config.ent_coef if ent_coef is None else ent_coef
    critic = config.uses_critic  # critic-free: no value forward, no value loss
    scores = policy.score(
        [t.prompt_ids for t in turns],
        [t.response_ids for t in turns],
        choices=[t.choice_ids for t in turns],
        values=critic,
        with_entropy=True,
    )
    old = torch.zeros_like(scores.logps)  # (B, T)
    for row, turn in enumerate(turns):
        if turn.old_logps is None:  # first_pass
            keep_old_scores(turn, scores, row)
        old[row, : turn.scored_tokens] = turn.old_logps.to(device)
    # Turns credited over all their choices (config.all_choices) take the expected surrogate
    # below instead of the sampled reply's.
    credited = [r for r, t in enumerate(turns) if t.choice_advantages is not None]
    # Explored turns (config.explore_eps) were drawn from a mixture μ: weighted by π_old / μ.
    advantages = torch.tensor(
        [0.0 if t.choice_advantages is not None else t.advantage * behaviour_weight(t)
         for t in turns], device=device
    )  # fmt: skip
    pg_loss, pg_stats = core.policy_loss(
        scores.logps, old, advantages, scores.mask, config.clip_range
    )
    if credited:
        rows = (
            [scores.choice_logps[r] for r in credited],  # type: ignore[index]
            [turns[r].old_choice_logps.to(device) for r in credited],  # type: ignore[union-attr]
            [torch.tensor(turns[r].choice_advantages, device=device) for r in credited],
        )
        if config.choice_update == "mirror":
            choice_loss = core.mirror_descent_loss(*rows, config.mirror_step)
        else:
            choice_loss = core.expected_policy_loss(*rows, config.clip_range)
        pg_loss = pg_loss + choice_loss / scores.mask.sum().clamp(min=1)
    ent = core.masked_mean(scores.entropy, scores.mask)
    token_share = float(scores.mask.sum()) / minibatch_tokens
    turn_share = len(turns) / minibatch_turns
    loss = (pg_loss - ent_coef * ent) * token_share
    stats = {}
    if critic:
        old_values = torch.tensor([t.value for t in turns], device=device)
        returns = torch.tensor([t.returns for t in turns], device=device)
        v_loss, v_stats = core.value_loss(
            scores.values, old_values, returns, config.clip_range_value
        )
        loss = loss + config.vf_coef * v_loss * turn_share
        stats["loss/value"] = float(v_loss.detach()) * turn_share
        stats["value/clip_frac"] = float(v_stats["value_clip_frac"]) * turn_share
    loss.backward()
    return {
        "loss/policy": float(pg_loss.detach()) * token_share,
        **stats,
        "loss/total": float(loss.detach()),
        "policy/entropy": float(ent.detach()) * token_share,
        "policy/approx_kl": float(pg_stats["approx_kl"]) * token_share,
        "policy/clip_frac": float(pg_stats["clip_frac"]) * token_share,
        "policy/ratio_mean": float(pg_stats["ratio_mean"]) * token_share,
    }


def behaviour_weight(turn: Turn) -> float:
    """``π_old(a) / μ(a)`` of a turn drawn from a mixture μ, else 1.

    With it, the clipped surrogate's gradient at the old weights is, in expectation over μ,
    the on-policy gradient: ``Σ_a μ(a) · π(a) / μ(a) · ∇log π(a) · A(a) = E_π[∇log π · A]``.
    The PPO ratio stays ``π_θ / π_old``, exactly 1 at the old weights.

    Example:
        >>> import math, torch
        >>> turn = Turn([1], [2], reward=0.0, behaviour_logp=math.log(0.5))
        >>> turn.old_logps = torch.tensor([math.log(0.25)])
        >>> round(behaviour_weight(turn), 6)
        0.5
    """
    if turn.behaviour_logp is None:
        return 1.0
    return math.exp(float(turn.old_logps[0]) - turn.behaviour_logp)


def minibatch_loss(
    policy: Any,
    config: Any,
    turns: list[Turn],
    minibatch: list[list[int]],
    minibatch_tokens: float,
    minibatch_turns: float,
    ent_coef: float | None = None,
    *,
    first_pass: bool = False,
) -> dict[str, float]:
    """:func:`micro_batch_loss` of each micro-batch of ``minibatch``; the summed statistics.

    The gradients accumulate in the parameters' ``.grad``; an empty minibatch (a process that
    ran out of turns) returns ``{}`` and leaves them untouched.
    """
    stats: dict[str, float] = {}
    # The rows' shared prefix (the system prompt) runs once for all micro-batches.
    with policy.sharing_prefix([turns[i].prompt_ids for m in minibatch for i in m]) as prefix:
        for micro in minibatch:
            micro_turns = [turns[i] for i in micro]
            micro_stats = micro_batch_loss(
                policy,
                config,
                micro_turns,
                minibatch_tokens,
                minibatch_turns,
                ent_coef,
                first_pass=first_pass,
            )
            for key, value in micro_stats.items():
                stats[key] = stats.get(key, 0.0) + value
        if prefix is not None:
            prefix.backward()
    return stats


def bootstrap_values(policy: Any, turns: list[Turn], micro_batch_size: int) -> None:
    """Set ``bootstrap_value`` of the turns that have ``bootstrap_ids`` (the critic's value).

    Turns whose value the rollout already computed (``PPOConfig.score_in_update``) keep it.
    """
    pending = [t for t in turns if t.bootstrap_ids is not None and t.bootstrap_value is None]
    for start in range(0, len(pending), micro_batch_size):
        chunk = pending[start : start + micro_batch_size]
        values = policy.prompt_values([t.bootstrap_ids for t in chunk])
        for turn, value in zip(chunk, values.tolist(), strict=True):
            turn.bootstrap_value = value


def skip_nonfinite_step(
    step_stats: dict[str, float], optimizer: torch.optim.Optimizer, update: int, epoch: int
) -> bool:
    """Drop this step's gradient, with a warning, if its loss or gradient norm is NaN/inf.

    A NaN step would poison the weights and Adam's moments for good, so the caller skips
    ``optimizer.step()`` when this returns True (and counts the step). ``update`` and
    ``epoch`` (1-based) name the step in the warning.
    """
    loss, grad_norm = step_stats["loss/total"], step_stats["policy/grad_norm"]
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return False
    logger.warning(
        "Update %d, epoch %d: non-finite loss (%s) or gradient norm (%s); "
        "skipping this optimizer step",
        update,
        epoch,
        loss,
        grad_norm,
    )
    optimizer.zero_grad(set_to_none=True)
    return True
