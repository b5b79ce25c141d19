"""Gradient checkpointing that works in eval mode and with a shared-prefix key/value cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = [
    "disable_gradient_checkpointing",
    "enable_gradient_checkpointing",
    "gradient_checkpointing_enabled",
]


class _Checkpointed:
    """A decoder layer's ``forward`` that keeps no activations and replays itself in backward.

    The layer may extend a key/value cache (the shared-prefix cache of PPO scoring, or a cache
    later continued by choice rows). The backward replay must see the cache as the forward saw
    it and must not extend it again, so the cache's layer entries are rewound for the replay and
    restored after it. Cache layers replace their tensors rather than write into them
    (``DynamicCache``), so the rewind only swaps references.
    """

    def __init__(self, forward: Callable[..., Any], shadowed: bool) -> None:
        self.forward = forward
        self.shadowed = shadowed  # the layer already had an instance-level forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.forward(*args, **kwargs)
        from torch.utils.checkpoint import checkpoint

        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        layers = getattr(cache, "layers", None)
        before = _cache_state(layers)
        replaying = False

        def run(*args: Any, **kwargs: Any) -> Any:
            nonlocal replaying
            if not replaying:
                replaying = True
                return self.forward(*args, **kwargs)
            after = _cache_state(layers)
            _set_cache_state(layers, before)
            try:
                return self.forward(*args, **kwargs)
            finally:
                _set_cache_state(layers, after)

        return checkpoint(run, *args, use_reentrant=False, **kwargs)


def _cache_state(layers: list[Any] | None) -> tuple[list[Any], list[dict[str, Any]]] | None:
    return None if layers is None else (list(layers), [dict(vars(layer)) for layer in layers])


def _set_cache_state(
    layers: list[Any] | None, state: tuple[list[Any], list[dict[str, Any]]] | None
) -> None:
    if layers is None or state is None:
        return
    layers[:] = state[0]
    for layer, attributes in zip(*state, strict=True):
        vars(layer).clear()
        vars(layer).update(attributes)


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The outermost transformers ``GradientCheckpointingLayer`` modules (the decoder layers)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        inside = any(name.startswith(f"{outer}.") for outer, _ in found)
        if isinstance(module, GradientCheckpointingLayer) and not inside:
            found.append((name, module))
    if not found:
        raise ValueError(
            "Expected a transformers model with decoder layers, found none in "
            f"{type(model).__name__}"
        )
    return [module for _, module in found]


def enable_gradient_checkpointing(model: nn.Module) -> nn.Module:
    """Recompute each decoder layer's activations in the backward pass instead of keeping them.

    Memory for activations drops to one layer's worth plus each layer's input, for about one
    more forward pass of compute. Unlike transformers' own checkpointing, this also works in
    eval mode (PPO keeps the model in eval mode, where transformers' does nothing) and with a
    key/value cache (PPO scoring runs the shared prefix once and passes its cache to every row,
    which transformers' checkpointing drops). Gradients are the same as without it; without
    gradients (generation, rollout scoring) the layers run as usual. Works through a peft
    ``PeftModel``; :func:`disable_gradient_checkpointing` undoes it.

    Example:
        >>> from textgym_agents.testing import tiny_model
        >>> model, _ = tiny_model()
        >>> model = enable_gradient_checkpointing(model)
        >>> gradient_checkpointing_enabled(model)
        True
        >>> loss = model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum()
        >>> loss.backward()  # the layers run again here
        >>> gradient_checkpointing_enabled(disable_gradient_checkpointing(model))
        False
    """
    for layer in _decoder_layers(model):
        if not isinstance(vars(layer).get("forward"), _Checkpointed):
            layer.forward = _Checkpointed(layer.forward, "forward" in vars(layer))
    return model


def disable_gradient_checkpointing(model: nn.Module) -> nn.Module:
    """Undo :func:`enable_gradient_checkpointing` (a no-op where it is not enabled)."""
    for layer in _decoder_layers(model):
        wrapper = vars(layer).get("forward")
        if isinstance(wrapper, _Checkpointed):
            if wrapper.shadowed:
                layer.forward = wrapper.forward
            else:
                del layer.forward
    return model


def gradient_checkpointing_enabled(model: nn.Module) -> bool:
    """Whether :func:`enable_gradient_checkpointing` is active on ``model``'s decoder layers."""
    return any(isinstance(vars(m).get("forward"), _Checkpointed) for m in _decoder_layers(model))
