"""The math of PPO for multi-turn text agents: masked statistics, turn-level GAE, losses, KL.

Pure torch, no model code, so every function can be tested against a naive reference.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from trl.trainer.utils import entropy_from_logits, selective_log_softmax

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "compute_gae",
    "entropy",
    "entropy_from_logits",
    "expected_policy_loss",
    "explained_variance",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "mirror_descent_loss",
    "policy_loss",
    "selective_log_softmax",
    "value_loss",
]

KLEstimator = Literal["k1", "k3", "abs", "mse"]
_KL_ESTIMATORS = ("k1", "k3", "abs", "mse")


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the entries where ``mask`` (0/1 or bool, same shape) is nonzero.

    Masked-out entries are dropped with ``torch.where`` rather than multiplied by 0, so padding
    that holds ``inf`` or ``nan`` cannot poison the result or its gradient. An empty mask gives 0.
    ``dim=None`` reduces over all entries.

    Example:
        >>> import torch
        >>> masked_mean(torch.tensor([1.0, 2.0, 100.0]), torch.tensor([1, 1, 0]))
        tensor(1.5000)
    """
    mask = mask.bool()
    total = torch.where(mask, values, torch.zeros_like(values)).sum(dim=dim)
    return total / mask.sum(dim=dim).clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the entries where ``mask`` is nonzero.

    With one valid entry the unbiased correction n / (n - 1) is undefined, so the (zero) biased
    variance is returned instead of ``nan``.

    Example:
        >>> import torch
        >>> masked_var(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1, 1, 0]))
        tensor(2.)
    """
    centered = values - masked_mean(values, mask)
    variance = masked_mean(centered**2, mask)
    if unbiased:
        n = mask.bool().sum()
        variance = variance * n / (n - 1).clamp(min=1)
    return variance


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True
) -> torch.Tensor:
    """Normalise ``values`` to mean 0 and std 1 over the valid entries (all entries are mapped).

    With ``shift_mean=False`` the mean is added back, so only the scale changes.

    Example:
        >>> import torch
        >>> masked_whiten(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1, 1, 0]))[:2]
        tensor([-0.7071,  0.7071])
    """
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level generalised advantage estimation for one env's turns, in time order.

    The sequence may span several episodes. A truncated turn bootstraps from ``next_values``
    (the episode could have gone on) while a terminated one does not; neither lets advantages
    flow back across the episode boundary.

    Args:
        rewards: ``(T,)`` reward of each turn.
        values: ``(T,)`` V(prompt) of each turn.
        next_values: ``(T,)`` V of the state after each turn: V(final observation) for a truncated
            turn, the bootstrap value for the last turn of a still-running episode. Ignored where
            ``terminated``.
        terminated: ``(T,)`` bool (or 0/1) flags.
        truncated: ``(T,)`` bool (or 0/1) flags.
        gamma: Discount factor.
        lam: GAE λ.

    Returns:
        ``(advantages, returns)``, both ``(T,)``, with ``returns = advantages + values``. They are
        detached and at least float32.

    Example:
        >>> import torch
        >>> advantages, returns = compute_gae(
        ...     rewards=torch.tensor([0.0, 1.0]), values=torch.tensor([0.5, 0.5]),
        ...     next_values=torch.tensor([0.5, 0.0]), terminated=torch.tensor([False, True]),
        ...     truncated=torch.tensor([False, False]), gamma=1.0, lam=1.0)
        >>> advantages, returns
        (tensor([0.5000, 0.5000]), tensor([1., 1.]))
    """
    shapes = [tuple(x.shape) for x in (rewards, values, next_values, terminated, truncated)]
    if len(shapes[1]) != 1 or len(set(shapes)) != 1:
        raise ValueError(
            "Expected 1-D rewards, values, next_values, terminated, truncated of one shape, got "
            + ", ".join(map(str, shapes))
        )
    # A bf16 value head would otherwise accumulate rounding error through the recursion.
    dtype = torch.promote_types(values.dtype, torch.float32)
    rewards, values, next_values = (x.detach().to(dtype) for x in (rewards, values, next_values))
    next_non_terminal = 1.0 - terminated.to(dtype)
    episode_continues = 1.0 - (terminated.bool() | truncated.bool()).to(dtype)

    delta = rewards + gamma * next_values * next_non_terminal - values  # (T,)
    advantages = torch.zeros_like(values)
    last_gae_lam = torch.zeros((), dtype=dtype, device=values.device)
    for t in reversed(range(values.shape[0])):
        last_gae_lam = delta[t] + gamma * lam * episode_continues[t] * last_gae_lam
        advantages[t] = last_gae_lam
    returns = advantages + values
    return advantages, returns


def policy_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    clip_range: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss with a per-token ratio, averaged over all valid tokens.

    Args:
        per_token_logps: ``(B, T)`` log-probs under the current policy (with grad).
        old_per_token_logps: ``(B, T)`` log-probs recorded at rollout time.
        advantages: ``(B,)`` one advantage per turn, given to each of its tokens, or ``(B, T)``.
        completion_mask: ``(B, T)`` 1 for response tokens, 0 for padding.
        clip_range: ε of the ratio clip ``[1 - ε, 1 + ε]``.

    Returns:
        ``(pg_loss, stats)``; stats holds detached scalars ``clip_frac`` (share of valid tokens
        whose clipped branch is taken), ``approx_kl`` (k3 estimator) and ``ratio_mean``.

    Example:
        >>> import torch
        >>> logps = torch.tensor([[-1.0, -2.0]])
        >>> pg_loss, stats = policy_loss(logps, logps, torch.tensor([2.0]), torch.ones(1, 2), 0.2)
        >>> pg_loss, stats["clip_frac"], stats["approx_kl"]
        (tensor(-2.), tensor(0.), tensor(0.))
    """
    shapes = [tuple(x.shape) for x in (per_token_logps, old_per_token_logps, completion_mask)]
    if len(set(shapes)) != 1:
        raise ValueError(
            "Expected per_token_logps, old_per_token_logps and completion_mask of one shape, got "
            + ", ".join(map(str, shapes))
        )
    if advantages.ndim == 1:
        advantages = advantages.unsqueeze(-1)  # (B, 1)
    mask = completion_mask.bool()
    # Zero the log-ratio at padding so garbage log-probs there cannot overflow exp() into nan.
    log_ratio = torch.where(mask, per_token_logps - old_per_token_logps, 0.0)  # (B, T)
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    pg_losses_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    pg_loss = masked_mean(torch.max(pg_losses, pg_losses_clipped), mask)

    with torch.no_grad():
        stats = {
            "clip_frac": masked_mean((pg_losses_clipped > pg_losses).float(), mask),
            "approx_kl": masked_mean((ratio - 1) - log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return pg_loss, stats


def expected_policy_loss(
    logps: list[torch.Tensor],
    old_logps: list[torch.Tensor],
    advantages: list[torch.Tensor],
    clip_range: float,
) -> torch.Tensor:
    """PPO's clipped surrogate in expectation over every reply, summed over the rows.

    For a turn whose replies are a known finite set, the sampled surrogate's expectation over
    the reply drawn from ``π_old`` is ``Σ_a π_old(a) · max(-A(a) r(a), -A(a) clip(r(a)))``
    with ``r(a) = π(a) / π_old(a)``: every reply is credited, not only the sampled one. At
    ``π = π_old`` its gradient is ``-Σ_a A(a) ∇π(a)``, the all-actions policy gradient (Mean
    Actor-Critic, Asadi et al. 2017).

    Args:
        logps: One ``(K,)`` tensor per row: log-probs of the row's replies (with grad).
        old_logps: One ``(K,)`` tensor per row: the same under the rollout policy.
        advantages: One ``(K,)`` tensor per row: the advantage of each reply.
        clip_range: ε of the ratio clip.

    Returns:
        The sum over rows (0 without rows).

    Example:
        >>> import torch
        >>> logps = [torch.tensor([0.25, 0.75]).log()]
        >>> expected_policy_loss(logps, logps, [torch.tensor([1.0, -1.0])], 0.2)
        tensor(0.5000)
    """
    total = torch.zeros(())
    for row, old, advantage in zip(logps, old_logps, advantages, strict=True):
        ratio = torch.exp(row - old)
        clipped = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
        losses = torch.max(-advantage * ratio, -advantage * clipped)
        total = total.to(row.device) + (old.exp() * losses).sum()
    return total


def mirror_descent_loss(
    logps: list[torch.Tensor],
    old_logps: list[torch.Tensor],
    advantages: list[torch.Tensor],
    step: float,
) -> torch.Tensor:
    """Fit of each row's log-probs to a policy mirror-descent step, summed over the rows.

    Mirror descent with the KL divergence (the natural policy gradient of a softmax policy)
    moves a distribution over known replies to ``π_new(a) ∝ π_old(a) · exp(step · A(a))``:
    every log-prob changes by ``step · A(a)`` up to a constant shared by the row. The loss is
    half the mean over a row's replies of ``(d(a) - mean(d) - step · (A(a) - mean(A)))²`` with
    ``d = log π - log π_old``, so its minimum is that policy and a constant added to a row's
    advantages changes nothing, and at ``π = π_old`` a row whose advantages are all equal gives
    no gradient (later steps pull it back to ``π_old``). Its gradient in log-prob space does not
    shrink with ``π(a)``: a reply the policy has all but ruled out moves as fast as a likely
    one, where the clipped surrogate's gradient ``Σ_a A(a) ∇π(a)`` vanishes (approximate
    policy mirror descent with a general parametrisation: Alfano, Yuan and Rebeschini 2023,
    arXiv:2301.13139).

    Args:
        logps: One ``(K,)`` tensor per row: log-probs of the row's replies (with grad).
        old_logps: One ``(K,)`` tensor per row: the same under the rollout policy.
        advantages: One ``(K,)`` tensor per row: the advantage of each reply.
        step: Change of a log-prob (relative to the row's mean) per unit of advantage.

    Returns:
        The sum over rows (0 without rows).

    Example:
        >>> import torch
        >>> old = torch.tensor([0.999, 0.001]).log()
        >>> logps = old.clone().requires_grad_()
        >>> loss = mirror_descent_loss([logps], [old], [torch.tensor([-1.0, 1.0])], step=1.0)
        >>> torch.autograd.grad(loss, logps)[0]  # the unlikely reply is pulled up at full rate
        tensor([ 0.5000, -0.5000])
    """
    total = torch.zeros(())
    for row, old, advantage in zip(logps, old_logps, advantages, strict=True):
        dtype = torch.promote_types(row.dtype, torch.float32)  # never below float32
        change = row.to(dtype) - old.to(dtype)
        target = step * advantage.to(dtype)
        error = (change - change.mean()) - (target - target.mean())
        total = total.to(row.device) + 0.5 * error.square().mean()
    return total


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    clip_range_value: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss ``0.5 * mean(max((v - R)^2, (v_clipped - R)^2))``.

    Args:
        values: ``(B,)`` current V(prompt) of each turn (with grad).
        old_values: ``(B,)`` V(prompt) recorded at rollout time.
        returns: ``(B,)`` GAE returns.
        clip_range_value: Keeps ``v`` within this distance of ``old_values``; None disables it.

    Returns:
        ``(v_loss, stats)`` with the detached scalar ``value_clip_frac``.

    Example:
        >>> import torch
        >>> v, old, ret = torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([3.0])
        >>> value_loss(v, old, ret, clip_range_value=None)[0]
        tensor(0.5000)
        >>> value_loss(v, old, ret, clip_range_value=0.5)[0]  # v_clipped = 0.5
        tensor(3.1250)
    """
    if not values.shape == old_values.shape == returns.shape:
        raise ValueError(
            "Expected values, old_values and returns of one shape, got "
            f"{tuple(values.shape)}, {tuple(old_values.shape)} and {tuple(returns.shape)}"
        )
    v_loss_unclipped = (values - returns) ** 2
    if clip_range_value is None:
        return 0.5 * v_loss_unclipped.mean(), {"value_clip_frac": values.new_zeros(())}
    v_clipped = old_values + torch.clamp(values - old_values, -clip_range_value, clip_range_value)
    v_loss_clipped = (v_clipped - returns) ** 2
    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    value_clip_frac = (v_loss_clipped > v_loss_unclipped).float().mean().detach()
    return v_loss, {"value_clip_frac": value_clip_frac}


def kl_penalty(
    per_token_logps: torch.Tensor,
    ref_per_token_logps: torch.Tensor,
    estimator: KLEstimator = "k1",
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from log-probs of the sampled tokens.

    ``"k1"`` is unbiased but can be negative, ``"k3"`` is unbiased and never negative
    (Schulman, "Approximating KL divergence"), ``"abs"`` and ``"mse"`` are biased but non-negative.

    Example:
        >>> import torch
        >>> kl_penalty(torch.tensor([-1.0]), torch.tensor([-1.5]), estimator="mse")
        tensor([0.1250])
    """
    log_ratio = per_token_logps - ref_per_token_logps
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    if estimator == "abs":
        return log_ratio.abs()
    if estimator == "mse":
        return 0.5 * log_ratio**2
    raise ValueError(f"Unknown KL estimator {estimator!r}; expected one of {_KL_ESTIMATORS}")


def explained_variance(y_pred: torch.Tensor, y_true: torch.Tensor) -> float:
    """``1 - Var[y_true - y_pred] / Var[y_true]``: 1 is perfect, 0 no better than the mean.

    Returns ``nan`` when ``y_true`` is constant, as stable-baselines3 does.

    Example:
        >>> import torch
        >>> explained_variance(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0]))
        1.0
    """
    y_pred, y_true = y_pred.detach().flatten().double(), y_true.detach().flatten().double()
    var_y = torch.var(y_true, correction=0)
    if var_y == 0:
        return float("nan")
    return float(1.0 - torch.var(y_true - y_pred, correction=0) / var_y)


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probs of ``labels`` ``(B, T)`` under ``softmax(logits / temperature)``, ``(B, T, V)``.

    Dividing by the sampling temperature makes the scores match the distribution the tokens
    were drawn from. TRL's ``selective_log_softmax`` avoids materialising the full log-softmax.

    Example:
        >>> import torch
        >>> logprobs_from_logits(torch.zeros(1, 2, 4), torch.tensor([[0, 3]]))
        tensor([[-1.3863, -1.3863]])
    """
    if temperature <= 0:
        raise ValueError(f"Expected temperature > 0, got {temperature}")
    if temperature != 1.0:
        logits = logits / temperature
    return selective_log_softmax(logits, labels)


def entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)`` per position, via TRL's helper.

    Example:
        >>> import torch
        >>> entropy(torch.zeros(1, 2, 4))
        tensor([[1.3863, 1.3863]])
    """
    if temperature <= 0:
        raise ValueError(f"Expected temperature > 0, got {temperature}")
    if temperature != 1.0:
        logits = logits / temperature
    return entropy_from_logits(logits)


class FixedKLController:
    """A KL coefficient β that stays put.

    Example:
        >>> kl_ctl = FixedKLController(0.05)
        >>> kl_ctl.update(current_kl=10.0, n_steps=256)
        >>> kl_ctl.value
        0.05
    """

    def __init__(self, kl_coef: float) -> None:
        if kl_coef < 0:
            raise ValueError(f"Expected kl_coef >= 0, got {kl_coef}")
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Do nothing; present so both controllers are interchangeable."""


class EntropyController:
    """The entropy bonus's weight: fixed, or steered toward a target entropy after each update.

    With a ``target``, the weight is multiplied by ``2 ** clip((target - entropy) / target, ±1)``
    after each update: doubled at most when the policy's entropy has fallen to 0, halved at most
    when it is twice the target, and kept within ``[1e-4, 10]`` so it can always come back.

    Example:
        >>> ent = EntropyController(0.1, target=0.8)
        >>> ent.update(0.4)  # entropy at half the target: the weight grows by 2 ** 0.5
        >>> round(ent.value, 4)
        0.1414
        >>> ent.update(float("nan")); round(ent.value, 4)  # no update ran: unchanged
        0.1414
        >>> fixed = EntropyController(0.3, target=None)
        >>> fixed.update(0.0); fixed.value
        0.3
    """

    BOUNDS = (1e-4, 10.0)

    def __init__(self, ent_coef: float, target: float | None) -> None:
        if ent_coef < 0 or (target is not None and (target <= 0 or ent_coef <= 0)):
            raise ValueError(
                "Expected ent_coef >= 0, and with a target: target > 0 and ent_coef > 0, got "
                f"ent_coef={ent_coef}, target={target}"
            )
        self.value = ent_coef
        self.target = target

    def update(self, entropy: float) -> None:
        """Steer the weight by the update's mean policy entropy (non-finite: unchanged)."""
        if self.target is None or not math.isfinite(entropy):
            return
        error = min(max((self.target - float(entropy)) / self.target, -1.0), 1.0)
        low, high = self.BOUNDS
        self.value = min(max(self.value * 2.0**error, low), high)


class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. (2019), steering the observed KL to a target.

    The proportional error is clipped to ±0.2 so one noisy batch cannot swing β far, and scaled
    by ``n_steps / horizon`` so the adaptation speed does not depend on the batch size.

    Example:
        >>> kl_ctl = AdaptiveKLController(init_kl_coef=0.1, target=6.0, horizon=10_000)
        >>> kl_ctl.update(current_kl=12.0, n_steps=1_000)  # KL too high: raise β by 2%
        >>> round(kl_ctl.value, 6)
        0.102
        >>> kl_ctl.update(current_kl=float("nan"), n_steps=1_000)
        >>> round(kl_ctl.value, 6)
        0.102
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        if init_kl_coef < 0 or target <= 0 or horizon <= 0:
            raise ValueError(
                "Expected init_kl_coef >= 0, target > 0 and horizon > 0, got "
                f"init_kl_coef={init_kl_coef}, target={target}, horizon={horizon}"
            )
        self.value = init_kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Scale β by ``1 + clip(current_kl / target - 1, ±0.2) * n_steps / horizon``.

        A non-finite KL (from a diverged batch) leaves β unchanged: NaN would stick for good.
        """
        if not math.isfinite(current_kl):
            return
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon
