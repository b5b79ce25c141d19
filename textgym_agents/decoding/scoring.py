"""Scoring: log-probs of replies, values of prompts, and choice distributions, in one pass.

Scoring runs prompt + reply through the model once (right padding; the rows' shared prefix
once; a row that begins another row inside that row's pass) and reads the log-probs of the
reply tokens and the value of the last prompt token.
Rows decoded by choices get the log-prob of their choice under the distribution over all of
them; replies sampled under a grammar, their tokens' log-probs under the distribution
renormalised over the tokens the grammar allowed. :class:`PolicyScoring` is the part of
:class:`~textgym_agents.PPOPolicy` that does it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from textgym_agents.decoding.choices import ChoiceScores, merge_rows, score_choices
from textgym_agents.decoding.constrained import allowed_tokens, mask_logits
from textgym_agents.decoding.shared_prefix import (
    PrefixPass,
    RowsPass,
    containing_rows,
    continue_tree,
    decoder_hidden_states,
    decoder_of,
    fork_cache,
    run_rows,
    shared_length,
)
from textgym_agents.model.precision import in_compute_dtype
from textgym_agents.ppo.core import entropy, logprobs_from_logits

__all__ = ["HEAD_CHUNK_POSITIONS", "PolicyScoring", "Scores"]

HEAD_CHUNK_POSITIONS = 64
"""Reply positions whose logits are computed at once in scoring (see ``_reply_scores``)."""


@dataclass
class Scores:
    """Output of one scoring forward pass over (prompt, response) pairs."""

    logps: torch.Tensor  # (B, T) per-token log-probs of the response tokens
    mask: torch.Tensor  # (B, T) 1 for response tokens, 0 for padding
    values: torch.Tensor | None  # (B,) value of each prompt
    entropy: torch.Tensor | None  # (B, T)
    # Rows with choices: the (K,) log-probs of all their choices (None for other rows).
    choice_logps: list[torch.Tensor | None] | None = None


class PolicyScoring:
    """Scoring methods of :class:`~textgym_agents.PPOPolicy` (its model, head and config)."""

    model: Any
    tokenizer: Any
    value_head: nn.Module
    config: Any
    _prefix_pass: PrefixPass | None = None  # set inside sharing_prefix()
    _base_prefix_pass: PrefixPass | None = None  # the same prefix under the base model

    @property
    def device(self) -> torch.device:
        """Device of the model."""
        return next(self.model.parameters()).device

    @in_compute_dtype
    def score(
        self,
        prompts: Sequence[list[int]],
        responses: Sequence[list[int]],
        *,
        choices: Sequence[list[list[int]] | None] | None = None,
        values: bool = True,
        with_entropy: bool = False,
        adapter: bool = True,
    ) -> Scores:
        """Per-token log-probs of ``responses`` given ``prompts`` and the value of each prompt.

        Log-probs use the sampling temperature, so they are those of the distribution that generated
        the replies (for choices, the tempered distribution over the choices); a reply sampled under
        a grammar (a :class:`~textgym_agents.decoding.constrained.ConstrainedReply`) is scored under
        the distribution renormalised over the tokens its grammar allowed, entropy included. A row
        with ``choices`` (its choices' token ids; the response is one of them) gets one log-prob,
        that of the response under the distribution over its choices, in column 0 (entropy
        likewise), and the log-probs of all its choices in ``choice_logps``. With
        ``adapter=False`` the base model (the PPO reference) is scored. Gradients flow when
        called outside ``torch.no_grad()``.
        """
        if not adapter:
            # The base model runs the same layout on a prefix of its own.
            shared, self._prefix_pass = self._prefix_pass, self._base_prefix_pass
            try:
                with self.model.disable_adapter():
                    return self.score(
                        prompts, responses, choices=choices, values=False, with_entropy=with_entropy
                    )
            finally:
                self._prefix_pass = shared
        picked = [b for b in range(len(prompts)) if choices is not None and choices[b] is not None]
        if not picked:
            return self._score_tokens(prompts, responses, values, with_entropy)
        chosen_ids = [choices[b] for b in picked]  # type: ignore[index]
        try:
            chosen = [c.index(list(responses[b])) for b, c in zip(picked, chosen_ids, strict=True)]
        except ValueError:
            raise ValueError("A response is not one of its row's choices") from None
        result = self.score_choices([prompts[b] for b in picked], chosen_ids, values=values)  # type: ignore[arg-type]
        logps = result.chosen(chosen)[:, None]
        entropy_ = result.entropy()[:, None] if with_entropy else None
        parts = [(picked, logps, torch.ones_like(logps), result.values, entropy_)]
        free = [b for b in range(len(prompts)) if b not in set(picked)]
        if free:
            scores = self._score_tokens(
                [prompts[b] for b in free], [responses[b] for b in free], values, with_entropy
            )
            parts.append((free, scores.logps, scores.mask, scores.values, scores.entropy))
        logps, mask, value, ent = merge_rows(parts, len(prompts))
        every: list[torch.Tensor | None] = [None] * len(prompts)
        for b, row in zip(picked, result.logps, strict=True):
            every[b] = row
        return Scores(logps=logps, mask=mask, values=value, entropy=ent, choice_logps=every)

    @in_compute_dtype
    def score_choices(
        self,
        prompts: Sequence[list[int]],
        choices: Sequence[Sequence[list[int]]],
        *,
        values: bool = False,
    ) -> ChoiceScores:
        """Distribution over each prompt's choices (token ids, see ``choice_ids``).

        Each prompt runs once and its choices on top of its key/value cache, at most
        ``config.choice_batch_size`` choices per forward pass; a prompt with more choices has them
        scored in pieces that are checkpointed under gradients, so memory does not grow with the
        number of choices (see :func:`~textgym_agents.decoding.choices.score_choices`). With
        ``config.share_repeated_prompts``, a prompt given again with the same choices runs once
        and its rows share one result (a loss over them sums their gradients).
        """
        if self.config.share_repeated_prompts:
            first: dict[Any, int] = {}  # a distinct (prompt, choices): its place in `rows`
            rows: list[int] = []  # the first row of each distinct one
            index = []
            for b, (prompt, options) in enumerate(zip(prompts, choices, strict=True)):
                key = (tuple(prompt), tuple(map(tuple, options)))
                if key not in first:
                    first[key] = len(rows)
                    rows.append(b)
                index.append(first[key])
            if len(rows) < len(prompts):
                shared = self._score_distinct(
                    [prompts[b] for b in rows], [choices[b] for b in rows], values
                )
                return ChoiceScores(
                    [shared.logps[i] for i in index],
                    None if shared.values is None else shared.values[index],
                )
        return self._score_distinct(prompts, choices, values)

    def _score_distinct(
        self, prompts: Sequence[list[int]], choices: Sequence[Sequence[list[int]]], values: bool
    ) -> ChoiceScores:
        return score_choices(
            self._choice_scorer,
            prompts,
            choices,
            values=values,
            length_norm=self.config.choice_length_norm,
            temperature=self.config.temperature,
            batch_size=self.config.choice_batch_size,
            prompt_scorer=_OnePromptScorer(self),
        )

    def _choice_scorer(
        self, prompts: Sequence[list[int]], choices: Sequence[Sequence[list[int]]], values: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        first, last_hidden = self._choice_prompts(prompts)
        total, count = self._choice_totals(first, last_hidden, [len(p) for p in prompts], choices)
        value = self.value_head(last_hidden).float() if values else None
        return total, count, value

    def _choice_prompts(
        self, prompts: Sequence[list[int]], share: bool = True
    ) -> tuple[RowsPass, torch.Tensor]:
        """Run the prompts (their shared prefix once): the pass and each one's last hidden state.

        With ``share=False`` a prefix of :meth:`sharing_prefix` is not used (the prompts run
        as the rollout runs them).
        """
        decoder, pad = self._decoder(), self.tokenizer.pad_token_id
        first = run_rows(
            decoder,
            prompts,
            pad=pad,
            max_shared=min(len(p) for p in prompts) - 1,
            prefix=self._prefix_pass if share else None,
        )
        last = torch.tensor([len(p) - 1 - first.offset for p in prompts], device=self.device)
        return first, first.hidden[torch.arange(len(prompts), device=self.device), last]

    def _choice_totals(
        self,
        first: RowsPass,
        last_hidden: torch.Tensor,
        lengths: Sequence[int],
        choices: Sequence[Sequence[list[int]]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed log-prob and token count of each choice on top of its prompt's pass.

        ``first.cache`` is consumed (extended by the choices).
        """
        decoder, pad = self._decoder(), self.tokenizer.pad_token_id
        index = [b for b, options in enumerate(choices) for _ in options]
        flat = [list(c) for options in choices for c in options]
        width = max(len(c) for c in flat)
        # The prompt's last position predicts a choice's first token; the choice's own
        # tokens (all but its last, each prompt's choices packed in one row) predict the rest.
        predict = last_hidden[index][:, None]
        if width > 1:
            rest, starts = continue_tree(
                decoder, first, lengths, [[c[:-1] for c in options] for options in choices], pad=pad
            )
            columns = torch.zeros((len(flat), width - 1), dtype=torch.long)
            n = 0
            for b, options in enumerate(choices):
                for start, ids in zip(starts[b], options, strict=True):
                    columns[n, : len(ids) - 1] = start + torch.arange(len(ids) - 1)
                    n += 1
            rows = torch.tensor(index, device=self.device)[:, None]
            predict = torch.cat([predict, rest[rows, columns.to(self.device)]], dim=1)
        labels = torch.zeros((len(flat), width), dtype=torch.long)
        mask = torch.zeros((len(flat), width))
        for n, ids in enumerate(flat):
            labels[n, : len(ids)] = torch.tensor(ids)
            mask[n, : len(ids)] = 1
        logits = self._lm_head()(predict[:, :width]).float()
        # Untempered: the temperature applies to the distribution over choices (score_choices).
        logps = logprobs_from_logits(logits, labels.to(self.device))
        mask = mask.to(self.device)
        return (logps * mask).sum(dim=1), mask.sum(dim=1)

    def _score_tokens(
        self,
        prompts: Sequence[list[int]],
        responses: Sequence[list[int]],
        values: bool,
        with_entropy: bool,
    ) -> Scores:
        device = self.device
        reply_width = max(len(r) for r in responses)
        sequences = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
        # A row that begins another row is read from that row's pass (config.pack_turns).
        owner = containing_rows(sequences) if self.config.pack_turns else range(len(prompts))
        carriers = sorted(set(owner))
        row_of = torch.tensor([carriers.index(c) for c in owner], device=device)
        # The logits at position i predict token i + 1, so a reply is read from the last
        # prompt position on; the shared prefix must end before every such position.
        hidden, offset = self._hidden_states(
            [sequences[c] for c in carriers], max_shared=min(len(p) for p in prompts) - 1
        )
        width = hidden.shape[1]
        positions = torch.zeros((len(prompts), reply_width), dtype=torch.long)
        labels = torch.zeros((len(prompts), reply_width), dtype=torch.long)
        mask = torch.zeros((len(prompts), reply_width))
        for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
            start = len(prompt) - 1 - offset
            positions[row] = torch.arange(start, start + reply_width).clamp(max=width - 1)
            labels[row, : len(response)] = torch.tensor(response)
            mask[row, : len(response)] = 1
        positions = positions.to(device)
        reply_hidden = hidden[row_of[:, None], positions]
        vocab = self._lm_head().weight.shape[0]
        allowed = allowed_tokens(responses, reply_width, vocab, device)  # (B, T, V)
        logps, ent = self._reply_scores(
            reply_hidden, labels.to(device), allowed, with_entropy, mask.to(device)
        )
        value = None
        if values:
            value = self.value_head(hidden[row_of, positions[:, 0]]).float()
        return Scores(logps=logps, mask=mask.to(device), values=value, entropy=ent)

    def _reply_scores(
        self,
        reply_hidden: torch.Tensor,
        labels: torch.Tensor,
        allowed: torch.Tensor | None,
        with_entropy: bool,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropy) of the reply tokens, a few positions' logits at a time.

        The logits of a reply position are a vocabulary-sized row (49,152 floats for SmolLM2),
        and the log-softmax and entropy keep several such copies for the backward pass, so
        their memory grows with the positions computed at once (chunks of whole rows, up to 256
        positions, cost the calculator's update ~0.15 GB at its peak; docs/performance.md,
        "What an update holds"). Only the positions ``mask`` marks (the replies' own tokens,
        not the padding after a shorter reply) go through the head, in chunks of
        :data:`HEAD_CHUNK_POSITIONS`; the others get log-prob and entropy 0. With gradients
        each chunk is checkpointed (its logits recomputed in the backward pass), so only one
        chunk's logits exist at a time, whatever the rows' lengths. The same chunks are used
        without gradients, so the scoring pass and the first epoch compute bit-identical
        log-probs.
        """
        rows, width = labels.shape
        scored = mask.reshape(-1).nonzero().squeeze(1)  # the reply tokens, row after row
        # One position per row: a chunk holds positions, not whole replies.
        hidden = reply_hidden.reshape(rows * width, 1, reply_hidden.shape[-1])[scored]
        flat_labels = labels.reshape(rows * width, 1)[scored]
        if allowed is not None:
            allowed = allowed.reshape(rows * width, 1, allowed.shape[-1])[scored]
        logps, entropies = [], []
        for start in range(0, len(scored), HEAD_CHUNK_POSITIONS):
            part = slice(start, start + HEAD_CHUNK_POSITIONS)
            inputs = (hidden[part], flat_labels[part], None if allowed is None else allowed[part])
            if torch.is_grad_enabled():
                lp, ent = checkpoint(self._head_chunk, *inputs, with_entropy, use_reentrant=False)
            else:
                lp, ent = self._head_chunk(*inputs, with_entropy)
            logps.append(lp)
            entropies.append(ent)

        def placed(parts: list[torch.Tensor]) -> torch.Tensor:
            full = reply_hidden.new_zeros(rows * width, dtype=torch.float32)
            if parts:
                full = full.index_put((scored,), torch.cat(parts).reshape(-1))
            return full.reshape(rows, width)

        return placed(logps), placed(entropies) if with_entropy else None

    def _head_chunk(
        self,
        hidden: torch.Tensor,
        labels: torch.Tensor,
        allowed: torch.Tensor | None,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self._lm_head()(hidden).float()  # (b, T, V)
        temperature = self.config.temperature
        if allowed is not None:
            logits, temperature = mask_logits(logits, allowed, temperature), 1.0
        logps = logprobs_from_logits(logits, labels, temperature=temperature)
        if not with_entropy:
            return logps, logps.new_zeros(())
        return logps, entropy(logits, temperature=temperature)

    @in_compute_dtype
    def prompt_values(self, prompts: Sequence[list[int]]) -> torch.Tensor:
        """Value of each prompt (no reply), for bootstrapping."""
        hidden, offset = self._hidden_states(prompts, max_shared=min(len(p) for p in prompts) - 1)
        last = torch.tensor([len(p) - 1 - offset for p in prompts], device=self.device)
        return self.value_head(hidden[torch.arange(len(prompts)), last]).float()

    def _causal_lm(self) -> nn.Module:
        return self.model.get_base_model()

    def _lm_head(self) -> nn.Module:
        return self._causal_lm().get_output_embeddings()

    def _decoder(self) -> nn.Module:
        return decoder_of(self.model)

    def _hidden_states(
        self, sequences: Sequence[list[int]], *, max_shared: int
    ) -> tuple[torch.Tensor, int]:
        # The decoder alone: logits are computed for reply positions only, not the whole
        # sequence, which saves a (B, L, vocab) tensor per forward.
        pad = self.tokenizer.pad_token_id
        return decoder_hidden_states(
            self._decoder(), sequences, pad=pad, max_shared=max_shared, prefix=self._prefix_pass
        )

    @contextmanager
    def sharing_prefix(self, prompts: Sequence[list[int]]) -> Iterator[PrefixPass | None]:
        """Inside, passes over rows that start with ``prompts``' shared prefix run it once.

        The prefix (see :func:`~textgym_agents.decoding.shared_prefix.shared_length`, at most
        the shortest prompt but its last token) is computed on the first pass that uses it;
        every pass of :meth:`score` and :meth:`score_choices` over rows that start with it
        reuses it (the reference model, ``adapter=False``, has its own, computed without the
        adapter: the same layout, so the KL before any update is exactly 0). Under gradients, call
        the yielded :class:`~textgym_agents.decoding.shared_prefix.PrefixPass`'s ``backward()``
        after the passes' own backward passes and before the optimizer step. Yields None (and
        changes nothing) when the prompts share no prefix worth it.
        """
        shared = shared_length(prompts, min(len(p) for p in prompts) - 1) if prompts else 0
        if not shared or self._prefix_pass is not None:
            yield None
            return
        self._prefix_pass = PrefixPass(prompts[0][:shared])
        self._base_prefix_pass = PrefixPass(prompts[0][:shared])
        try:
            yield self._prefix_pass
        finally:
            self._prefix_pass = self._base_prefix_pass = None

    def trainable_parameters(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """(LoRA parameters, value-head parameters)."""
        lora = [p for p in self.model.parameters() if p.requires_grad]
        return lora, list(self.value_head.parameters())


class _OnePromptScorer:
    """A :class:`~textgym_agents.decoding.choices.PromptScorer`: one prompt, its choices in pieces.

    The prompt runs once; each piece continues a copy of its key/value cache (the copy
    shares the prompt's key/value tensors, and a piece only appends to the copy), so a piece
    can run again in the backward pass.
    """

    def __init__(self, scoring: PolicyScoring) -> None:
        self.scoring = scoring

    def run_prompt(
        self, prompt: list[int], values: bool
    ) -> tuple[tuple[RowsPass, torch.Tensor], torch.Tensor | None]:
        """The prompt's pass and last hidden state (1, H); its value (1,) when asked.

        The prompt runs whole, in training as in the rollout, so reused rollout scores are
        those of the first epoch to the bit.
        """
        first, last_hidden = self.scoring._choice_prompts([prompt], share=False)
        value = self.scoring.value_head(last_hidden).float() if values else None
        return (first, last_hidden), value

    def score_piece(
        self, state: tuple[RowsPass, torch.Tensor], choices: Sequence[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed log-prob and token count of each of ``choices`` after the prompt."""
        first, last_hidden = state
        own = replace(first, cache=fork_cache(first.cache))
        length = first.attention_mask.shape[1]  # one row: no padding
        return self.scoring._choice_totals(own, last_hidden, [length], [choices])
