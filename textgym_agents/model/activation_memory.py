"""Keep less for the backward pass: RMSNorm and SwiGLU that save their input, not their steps.

In a training forward pass autograd keeps what each operation's backward needs. For the two
element-wise blocks of a Llama-style decoder layer that is more than the block's input:

- ``LlamaRMSNorm`` casts its input to float32 and keeps that copy (twice the bytes of a bf16
  input) for its ``pow`` and its product with the reciprocal root.
- The MLP's ``silu(gate) * up`` keeps ``gate`` (for the SiLU), ``silu(gate)`` and ``up`` (for
  the product): three tensors of the MLP's width (1,536 on SmolLM2-135M, 2.7 times the model's).

:func:`rms_norm` and :func:`swiglu` compute the same forward with the same operations, keep only
their inputs (and the norm's one reciprocal root per row), and in the backward pass recompute
the element-wise steps and apply the same derivative formulas autograd uses, so values and
gradients are identical to the bit (tested). On the embedded model in bf16 this removes the
norms' float32 copies and one of the MLP's three kept tensors (docs/performance.md, "What an
update holds, and keeping less of it").

:func:`use_lean_activations` switches a model's norm and MLP modules to them (the modules
keep their weights; only ``forward`` changes). It finds candidates by their attributes, as
transformers' Llama-family modules name them (a norm with ``weight`` and ``variance_epsilon``;
an MLP with ``gate_proj``, ``up_proj``, ``down_proj`` and ``act_fn``), and switches a module
class only where the lean forward gives the class's own output bit for bit on a random
input, so a norm or MLP that computes something else is left alone.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["lean_activations_enabled", "rms_norm", "swiglu", "use_lean_activations"]


def _widened(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` in float32 and the reciprocal root of its mean square per row, as LlamaRMSNorm."""
    wide = x.to(torch.float32)
    return wide, torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)


class _RMSNorm(torch.autograd.Function):
    """``weight * (x.float() * rsqrt(mean(x.float()²) + eps)).to(x.dtype)``, keeping ``x``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        wide, root = _widened(x, eps)
        ctx.save_for_backward(x, weight, root)
        return weight * (wide * root).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, root = ctx.saved_tensors
        wide = x.to(torch.float32)
        grad_x = grad_weight = None
        if ctx.needs_input_grad[1]:
            normed = (wide * root).to(x.dtype)
            grad_weight = (grad * normed).sum_to_size(weight.shape)
        if ctx.needs_input_grad[0]:
            grad_normed = (grad * weight).to(torch.float32)  # MulBackward, then ToCopyBackward
            grad_root = (grad_normed * wide).sum(-1, keepdim=True)
            grad_variance = -0.5 * grad_root * root.pow(3)  # RsqrtBackward
            grad_squares = grad_variance.expand_as(wide) / wide.shape[-1]  # MeanBackward
            grad_wide = grad_normed * root + grad_squares * (2.0 * wide)  # MulBackward, PowBackward
            grad_x = grad_wide.to(x.dtype)
        return grad_x, grad_weight, None


class _SwiGLU(torch.autograd.Function):
    """``silu(gate) * up``, keeping ``gate`` and ``up`` (``silu(gate)`` is recomputed)."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return nn.functional.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gate, up = ctx.saved_tensors
        grad_gate = grad_up = None
        if ctx.needs_input_grad[1]:
            grad_up = grad * nn.functional.silu(gate)
        if ctx.needs_input_grad[0]:
            grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        return grad_gate, grad_up


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm of ``x`` (in float32, cast back to ``x``'s dtype), times ``weight``.

    The same values and gradients as ``LlamaRMSNorm``. Where ``x`` is not float32 it keeps
    only ``x`` and one reciprocal root per row for the backward pass instead of ``x``'s float32
    copy; a float32 ``x`` is its own copy, so it takes the plain path.

    Example:
        >>> x = torch.randn(2, 3, 8, dtype=torch.bfloat16, requires_grad=True)
        >>> weight = torch.rand(8, dtype=torch.bfloat16)
        >>> wide = x.float()
        >>> root = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-5)
        >>> plain = weight * (wide * root).to(x.dtype)
        >>> torch.equal(rms_norm(x, weight, 1e-5), plain)
        True
    """
    plain = x.dtype == torch.float32 or not torch.is_grad_enabled()
    if plain or not (x.requires_grad or weight.requires_grad):
        wide, root = _widened(x, eps)
        return weight * (wide * root).to(x.dtype)
    return _RMSNorm.apply(x, weight, eps)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, keeping only ``gate`` and ``up`` for the backward pass.

    Example:
        >>> gate, up = torch.randn(4, 6, requires_grad=True), torch.randn(4, 6)
        >>> torch.equal(swiglu(gate, up), torch.nn.functional.silu(gate) * up)
        True
    """
    if not torch.is_grad_enabled() or not (gate.requires_grad or up.requires_grad):
        return nn.functional.silu(gate) * up
    return _SwiGLU.apply(gate, up)


def _norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    return rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


def _is_norm(module: nn.Module) -> bool:
    return isinstance(getattr(module, "weight", None), torch.Tensor) and isinstance(
        getattr(module, "variance_epsilon", None), float
    )


def _is_mlp(module: nn.Module) -> bool:
    parts = ("gate_proj", "up_proj", "down_proj")
    return all(isinstance(getattr(module, name, None), nn.Module) for name in parts) and hasattr(
        module, "act_fn"
    )


def _width(module: nn.Module) -> int | None:
    if _is_norm(module):
        return module.weight.shape[-1]
    return getattr(module.gate_proj, "in_features", None)


@torch.no_grad()
def _computes_the_same(module: nn.Module, forward: Any) -> bool:
    """Whether ``forward`` gives ``module``'s own output, bit for bit, on a random input."""
    width = _width(module)
    parameter = next(module.parameters(), None)
    if width is None or parameter is None:
        return False
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, width, generator=generator).to(parameter.device, parameter.dtype)
    try:
        return torch.equal(type(module).forward(module, x), forward(module, x))
    except Exception:  # noqa: BLE001  (a module of another shape or contract: leave it alone)
        return False


def use_lean_activations(model: nn.Module) -> int:
    """Switch ``model``'s RMSNorm and SwiGLU MLP modules to :func:`rms_norm` / :func:`swiglu`.

    Returns how many modules now use them. Results do not change (values and gradients are
    the same to the bit); a training pass keeps less memory.

    Example:
        >>> from textgym_agents.testing import tiny_model
        >>> model = tiny_model()[0]
        >>> use_lean_activations(model) > 0 and lean_activations_enabled(model)
        True
    """
    switched = 0
    checked: dict[tuple[type, Any], bool] = {}  # one check per module class and forward
    for module in model.modules():
        if getattr(module, "_lean_activations", False):
            switched += 1
            continue
        forward = _norm_forward if _is_norm(module) else _mlp_forward if _is_mlp(module) else None
        if forward is None or "forward" in vars(module):  # someone else's forward: leave it
            continue
        key = (type(module), forward)
        if key not in checked:
            checked[key] = _computes_the_same(module, forward)
        if checked[key]:
            module.forward = forward.__get__(module)
            module._lean_activations = True
            switched += 1
    return switched


def lean_activations_enabled(model: nn.Module) -> bool:
    """Whether :func:`use_lean_activations` switched any of ``model``'s modules."""
    return any(getattr(module, "_lean_activations", False) for module in model.modules())
