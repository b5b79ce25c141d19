"""Choice decoding: score every valid reply and sample one, so no reply is ever invalid.

For a finite action set the env lists its valid replies (``env.reply_choices()``). Each one is
tokenised once (minus the reply prefix, plus EOS so that no choice is a prefix of another) and
scored on top of its prompt, which runs once for all its choices; the turn's distribution is
the softmax of the choices' summed (or mean, TWOSOME-style) token log-probs. PPO uses the log of
that normalised probability, and the update recomputes it the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils.checkpoint import checkpoint

__all__ = [
    "ChoiceScores",
    "PromptScorer",
    "check_choice_set",
    "choice_token_ids",
    "score_choices",
]

# (prompts, each prompt's choices, values) -> (summed log-prob of each choice (N,), its token
# count (N,), value of each prompt (B,) or None); N counts the choices of all prompts in order.
GroupScorer = Callable[
    [Sequence[list[int]], Sequence[Sequence[list[int]]], bool],
    tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
]


class PromptScorer(Protocol):
    """Scores one prompt's choices piece by piece on top of a single run of the prompt."""

    def run_prompt(self, prompt: list[int], values: bool) -> tuple[Any, torch.Tensor | None]:
        """Run ``prompt`` once: ``(state for score_piece, its value (1,) or None)``."""

    def score_piece(
        self, state: Any, choices: Sequence[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed log-prob (n,) and token count (n,) of ``choices`` after the prompt.

        Must leave ``state`` as it found it: a checkpointed piece runs again in backward.
        """


def choice_token_ids(
    tokenizer: object, replies: Sequence[str], prefix: str, eos_id: int | None
) -> list[list[int]]:
    """Token ids of each reply after the reply prefix, EOS appended.

    Example:
        >>> from textgym_agents.testing import word_tokenizer
        >>> tokenizer = word_tokenizer(["go", "left", "right"])
        >>> ids = choice_token_ids(tokenizer, ["go left", "go right"], "go ", 2)
        >>> [tokenizer.convert_ids_to_tokens(i) for i in ids]
        [['left', '<|im_end|>'], ['right', '<|im_end|>']]
    """
    result = []
    for reply in replies:
        if not reply.startswith(prefix):
            raise ValueError(
                f"The choice {reply!r} does not start with the reply prefix {prefix!r}; with "
                "choice decoding every valid reply must begin with config.reply_prefix"
            )
        ids = list(tokenizer.encode(reply[len(prefix) :], add_special_tokens=False))  # type: ignore[attr-defined]
        if eos_id is not None:
            ids.append(eos_id)
        if not ids:
            raise ValueError(f"The choice {reply!r} is empty after the reply prefix")
        result.append(ids)
    return check_choice_set(result, replies)


def check_choice_set(ids: list[list[int]], replies: Sequence[str]) -> list[list[int]]:
    """Return ``ids`` (the token ids of ``replies``) if they make a choice set, else raise.

    A set needs at least one choice, and no two choices with the same tokens.

    Example:
        >>> check_choice_set([[1, 2], [3, 2]], ["a", "b"])
        [[1, 2], [3, 2]]
        >>> check_choice_set([[1, 2], [1, 2]], ["a", "a"])
        Traceback (most recent call last):
        ...
        ValueError: Two choices have the same tokens: ['a', 'a']
    """
    if not ids:
        raise ValueError("Choice decoding needs at least one valid reply, got none")
    if len({tuple(i) for i in ids}) != len(ids):
        raise ValueError(f"Two choices have the same tokens: {list(replies)}")
    return ids


@dataclass
class ChoiceScores:
    """Distributions over each prompt's choices.

    Attributes:
        logps: One (K,) tensor per prompt: log-probability of each choice (sums to 1 in
            probability space).
        values: (B,) value of each prompt, when asked for.
    """

    logps: list[torch.Tensor]
    values: torch.Tensor | None

    def chosen(self, index: Sequence[int]) -> torch.Tensor:
        """(B,) log-probability of the chosen choice of each prompt."""
        return torch.stack([row[k] for row, k in zip(self.logps, index, strict=True)])

    def entropy(self) -> torch.Tensor:
        """(B,) entropy of each prompt's distribution over its choices."""
        return torch.stack([-(row.exp() * row).sum() for row in self.logps])

    def explore(
        self, eps: float, generator: torch.Generator | None = None
    ) -> tuple[list[int], list[float]]:
        """One choice per prompt from ``(1 - eps) * π + eps * uniform``, and its log-probability.

        The behaviour distribution μ of ``PPOConfig.explore_eps``: every valid reply keeps at
        least ``eps / K`` of the mass, and μ is known exactly, so training can weight a turn
        by ``π(a) / μ(a)`` (at most ``1 / (1 - eps)``).

        Example:
            >>> import torch
            >>> scores = ChoiceScores([torch.tensor([0.0, -100.0]).log_softmax(0)], None)
            >>> picks, logps = scores.explore(1.0, torch.Generator().manual_seed(0))
            >>> round(logps[0], 4)  # uniform over two replies
            -0.6931
        """
        if not 0.0 <= eps <= 1.0:
            raise ValueError(f"Expected eps in [0, 1], got {eps}")
        picks, logps = [], []
        for row in self.logps:
            probs = row.detach().double().exp().cpu()
            mixture = (1.0 - eps) * probs + eps / len(probs)
            k = int(torch.multinomial(mixture, 1, generator=generator))
            picks.append(k)
            logps.append(float(mixture[k].log()))
        return picks, logps

    def sample(self, greedy: bool, generator: torch.Generator | None = None) -> list[int]:
        """Index of one choice per prompt: the most likely, or drawn from the distribution."""
        if greedy:
            return [int(row.argmax()) for row in self.logps]
        return [
            int(torch.multinomial(row.detach().float().exp().cpu(), 1, generator=generator))
            for row in self.logps
        ]


def score_choices(
    scorer: GroupScorer,
    prompts: Sequence[list[int]],
    choices: Sequence[Sequence[list[int]]],
    *,
    values: bool = False,
    length_norm: bool = False,
    temperature: float = 1.0,
    batch_size: int = 64,
    prompt_scorer: PromptScorer | None = None,
) -> ChoiceScores:
    """Distribution over each prompt's choices, scoring at most ``batch_size`` choices per call.

    Prompts are grouped in order so that a group holds at most ``batch_size`` choices; the
    scorer runs each prompt of a group once and its choices on top of it. A prompt with more
    choices runs once through ``prompt_scorer`` and its choices go on top of it in pieces of
    ``batch_size`` (without a ``prompt_scorer`` it is split into pieces that each run the
    prompt again). With gradients, when a prompt has more than ``batch_size`` choices, each
    scorer call is checkpointed (:func:`torch.utils.checkpoint.checkpoint`): its activations
    are recomputed in the backward pass, so one call's exist at a time. Memory then holds the
    prompts' passes and one call's (``batch_size`` choices) however many choices there are,
    in the rollout and in the update, whose loss takes the softmax over every choice.
    Checkpointing recomputes the same operations, so the values are those without it; sets
    of at most ``batch_size`` choices per prompt are scored as they always were. Gradients
    flow when called outside ``torch.no_grad()``.

    Args:
        scorer: Summed token log-probs of each prompt's choices (and prompt values).
        prompts: Prompt token ids.
        choices: For each prompt, the token ids of its choices.
        values: Also return the value of each prompt.
        length_norm: Rank choices by mean token log-prob instead of the sum.
        temperature: Divides each choice's score before the softmax over the choices, so it
            flattens (> 1) or sharpens (< 1) the distribution over valid replies; the most
            likely choice stays the same. The scorer's token log-probs are untempered.
        batch_size: Choices per scorer call.
        prompt_scorer: Runs one prompt once and scores its choices piece by piece, for
            prompts with more than ``batch_size`` choices.
    """
    if temperature <= 0:
        raise ValueError(f"Expected temperature > 0, got {temperature}")
    if len(prompts) != len(choices):
        raise ValueError(f"Got {len(prompts)} prompts but {len(choices)} choice lists")
    large = [b for b, c in enumerate(choices) if prompt_scorer is not None and len(c) > batch_size]
    groups = _groups(choices, batch_size, skip=set(large))
    calls = len(groups) + sum(math.ceil(len(choices[b]) / batch_size) for b in large)
    # Checkpointed only where memory would grow with the number of choices: a set of small
    # ones is bounded by the caller's batch, and its update then runs each call once.
    split = any(len(options) > batch_size for options in choices)
    run = _Runner(torch.is_grad_enabled() and split and calls > 1)
    totals: list[list[torch.Tensor]] = [[] for _ in prompts]  # each prompt's scores, in order
    prompt_values: list[torch.Tensor | None] = [None] * len(prompts)
    for group in groups:
        total, count, value = run(
            scorer,
            [prompts[b] for b, _, _ in group],
            [choices[b][start:end] for b, start, end in group],
            values,
        )
        sizes = [end - start for _, start, end in group]
        scores = total / count if length_norm else total
        for (b, _, _), part in zip(group, scores.split(sizes), strict=True):
            totals[b].append(part)
        if value is not None:  # a split prompt's value comes from its first piece
            for (b, start, _), v in zip(group, value, strict=True):
                if start == 0:
                    prompt_values[b] = v
    for b in large:
        state, value = prompt_scorer.run_prompt(prompts[b], values)  # type: ignore[union-attr]
        for start in range(0, len(choices[b]), batch_size):
            piece = choices[b][start : start + batch_size]
            total, count = run(prompt_scorer.score_piece, state, piece)  # type: ignore[union-attr]
            totals[b].append(total / count if length_norm else total)
        prompt_values[b] = None if value is None else value[0]
    sizes = [len(options) for options in choices]
    flat = torch.cat([part for parts in totals for part in parts])
    scores = flat / temperature if temperature != 1.0 else flat
    logps = [row.log_softmax(dim=0) for row in scores.split(sizes)]
    return ChoiceScores(logps, torch.stack(prompt_values) if values else None)  # type: ignore[arg-type]


def _groups(
    choices: Sequence[Sequence[list[int]]], batch_size: int, skip: set[int]
) -> list[list[tuple[int, int, int]]]:
    """``(prompt, first choice, end)`` pieces, at most ``batch_size`` choices per group.

    Prompts in ``skip`` are left out; a prompt with more choices than ``batch_size`` is split,
    and runs once per piece.

    Example:
        >>> _groups([[[1]] * 3, [[2]] * 2, [[3]]], 4, skip={2})
        [[(0, 0, 3)], [(1, 0, 2)]]
        >>> _groups([[[1]] * 5], 2, skip=set())
        [[(0, 0, 2)], [(0, 2, 4)], [(0, 4, 5)]]
    """
    groups: list[list[tuple[int, int, int]]] = [[]]
    size = 0
    for b, options in enumerate(choices):
        if b in skip:
            continue
        for start in range(0, len(options), batch_size):
            end = min(start + batch_size, len(options))
            if size + end - start > batch_size:
                groups.append([])
                size = 0
            groups[-1].append((b, start, end))
            size += end - start
    return [group for group in groups if group]


class _Runner:
    """Calls a scorer as it is, or checkpointed (activations recomputed in the backward pass).

    The recomputation runs under the autocast state of the forward pass (``checkpoint``
    restores it), so a mixed-precision forward is recomputed in the same precision.
    """

    def __init__(self, checkpointed: bool) -> None:
        self.checkpointed = checkpointed

    def __call__(self, function: Callable[..., Any], *args: Any) -> Any:
        if not self.checkpointed:
            return function(*args)
        return checkpoint(function, *args, use_reentrant=False)


Part = tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def merge_rows(
    parts: Sequence[Part], size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Put row groups scored apart back in batch order (differentiably).

    Each part is ``(rows, logps (n, T), mask (n, T), values (n,) | None, entropy | None)``;
    widths are padded to the widest part. Returns the merged logps, mask, values, entropy.
    """
    width = max(part[1].shape[1] for part in parts)
    rows = [b for part in parts for b in part[0]]
    if sorted(rows) != list(range(size)):
        raise ValueError("The parts must cover every row exactly once")
    inverse = torch.empty(size, dtype=torch.long)
    inverse[torch.tensor(rows)] = torch.arange(size)
    inverse = inverse.to(parts[0][1].device)

    def merged(index: int, pad: bool) -> torch.Tensor | None:
        tensors = [part[index] for part in parts]
        if any(t is None for t in tensors):
            return None
        if pad:
            tensors = [torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tensors]
        return torch.cat(tensors).index_select(0, inverse)

    return merged(1, True), merged(2, True), merged(3, False), merged(4, True)  # type: ignore[return-value]
