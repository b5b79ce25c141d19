import copy

import pytest
import torch
from torch import nn

from textgym_agents import PPOConfig, PPOPolicy
from textgym_agents.model.activation_memory import (
    lean_activations_enabled,
    rms_norm,
    swiglu,
    use_lean_activations,
)
from textgym_agents.model.adapters import attach_lora
from textgym_agents.model.precision import mixed_precision
from textgym_agents.testing import tiny_model


def twin_models(dtype):
    """A LoRA model with random adapter weights, and a copy switched to the lean modules."""
    model = attach_lora(tiny_model(dtype=dtype, num_kv_heads=2)[0])
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:  # zero at init: give the adapter's gradients a path
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))
    lean = copy.deepcopy(model)
    assert use_lean_activations(lean) == 2 * 2 + 1 + 2  # two norms and an MLP per layer, a norm
    assert not lean_activations_enabled(model)
    return model, lean


def logits_and_gradients(model, ids, pass_dtype=None):
    model.zero_grad()
    with mixed_precision(model, dtype=pass_dtype):
        logits = model(input_ids=ids).logits
    logits.float().log_softmax(-1)[..., 5].sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logits.detach(), grads


@pytest.mark.parametrize(
    ("dtype", "pass_dtype"),
    [(torch.float32, None), (torch.bfloat16, None), (torch.float32, torch.bfloat16)],
    ids=["float32", "bfloat16", "bfloat16-passes"],
)
def test_lean_modules_give_the_same_values_and_gradients_to_the_bit(dtype, pass_dtype):
    model, lean = twin_models(dtype)
    ids = torch.randint(0, 100, (3, 11), generator=torch.Generator().manual_seed(0))
    logits, grads = logits_and_gradients(model, ids, pass_dtype)
    lean_logits, lean_grads = logits_and_gradients(lean, ids, pass_dtype)
    assert torch.equal(logits, lean_logits)
    assert grads.keys() == lean_grads.keys() and grads
    for name, grad in grads.items():
        assert torch.equal(grad, lean_grads[name]), name
    assert any(grad.abs().sum() > 0 for grad in grads.values())


def saved_bytes(model, ids):
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
    with hooks, mixed_precision(model):
        model(input_ids=ids).logits.float().sum()
    return sum(size for ptr, size in storages.items() if ptr not in parameters)


def test_a_bf16_training_pass_keeps_less_for_the_backward_pass():
    model, lean = twin_models(torch.bfloat16)
    ids = torch.randint(0, 100, (4, 64), generator=torch.Generator().manual_seed(0))
    plain, kept = saved_bytes(model, ids), saved_bytes(lean, ids)
    # Per layer and token: two norms keep their bf16 input (64 x 2 bytes) instead of its
    # float32 copy (64 x 4), and silu(gate) (the MLP's width x 2 bytes) is not kept.
    width = model.get_base_model().config.intermediate_size
    per_token = 2 * 64 * (4 - 2) + width * 2
    assert plain - kept >= per_token * 2 * ids.numel()


def test_without_gradients_the_plain_path_runs():
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    weight = torch.ones(8, dtype=torch.bfloat16, requires_grad=True)
    with torch.no_grad():
        assert rms_norm(x, weight, 1e-5).grad_fn is None
        assert swiglu(x, x).grad_fn is None
    assert rms_norm(x, weight, 1e-5).grad_fn is not None


def test_a_norm_that_computes_otherwise_is_left_alone():
    class OffsetRMSNorm(nn.Module):  # Gemma's kind: weight + 1
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(8))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            wide = x.float()
            normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-6)
            return (1.0 + self.weight) * normed.to(x.dtype)

    class GeluMLP(nn.Module):  # the same module names, another activation
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(8, 16), nn.Linear(8, 16)
            self.down_proj, self.act_fn = nn.Linear(16, 8), nn.GELU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    block = nn.Sequential(OffsetRMSNorm(), GeluMLP())
    assert use_lean_activations(block) == 0
    assert not lean_activations_enabled(block)


def test_switching_twice_changes_nothing_more():
    model = tiny_model()[0]
    count = use_lean_activations(model)
    forwards = [m.forward for m in model.modules() if getattr(m, "_lean_activations", False)]
    assert use_lean_activations(model) == count
    assert forwards == [m.forward for m in model.modules() if getattr(m, "_lean_activations", 0)]


def test_a_module_with_a_forward_of_its_own_is_skipped_alone():
    model = tiny_model()[0]
    norm = model.model.layers[0].input_layernorm  # the first norm the walk meets
    own = norm.forward
    norm.forward = lambda hidden_states: own(hidden_states)
    assert use_lean_activations(model) == 2 * 2 + 1 + 2 - 1  # every other norm, both MLPs
    assert not getattr(norm, "_lean_activations", False)
    assert model.model.layers[1].input_layernorm._lean_activations


@pytest.mark.parametrize("lean", [True, False])
def test_the_policy_uses_them_as_configured(lean):
    model, tokenizer = tiny_model()
    policy = PPOPolicy(model, tokenizer, config=PPOConfig(lean_activations=lean))
    assert lean_activations_enabled(policy.model) is lean
