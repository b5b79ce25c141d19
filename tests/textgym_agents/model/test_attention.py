import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa
from transformers import LlamaConfig, LlamaForCausalLM

from textgym_agents.model import attention
from textgym_agents.model.attention import grouped_attention, use_gqa_attention


def qkv(dtype=torch.float32, length=5, kv_length=9, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(3, 6, length, 8), (3, 2, kv_length, 8), (3, 2, kv_length, 8)]
    return [torch.randn(s, generator=generator).to(dtype).requires_grad_() for s in shapes]


def random_mask(length=5, kv_length=9, seed=0):
    mask = torch.rand(3, 1, length, kv_length, generator=torch.Generator().manual_seed(seed)) > 0.4
    mask[..., 0] = True  # every query attends to something (sdpa gives NaN otherwise)
    return mask


@pytest.mark.parametrize("kind", ["bool", "additive", "causal", "none"])
def test_grouped_attention_equals_sdpa_with_gqa(kind):
    length = kv_length = 5 if kind == "causal" else 9
    q, k, v = qkv(length=length, kv_length=kv_length)
    mask = random_mask(length, kv_length) if kind in ("bool", "additive") else None
    if kind == "additive":
        mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    ours = grouped_attention(q, k, v, mask, scaling=0.3, causal=kind == "causal")
    theirs = sdpa(q, k, v, attn_mask=mask, scale=0.3, is_causal=kind == "causal", enable_gqa=True)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    ours_grads = torch.autograd.grad(ours.square().sum(), (q, k, v))
    theirs_grads = torch.autograd.grad(theirs.square().sum(), (q, k, v))
    for a, b in zip(ours_grads, theirs_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_grouped_attention_in_bf16_is_within_bf16_rounding_of_float32():
    q, k, v = qkv(torch.bfloat16)
    mask = random_mask()
    exact = sdpa(q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True)
    ours = grouped_attention(q, k, v, mask)
    flash = sdpa(q, k, v, attn_mask=mask, enable_gqa=True)  # the kernel it replaces
    assert ours.dtype is torch.bfloat16
    ours_error = (ours.float() - exact).abs().max().item()
    assert ours_error < 0.02
    assert ours_error <= 2 * (flash.float() - exact).abs().max().item() + 1e-3


@pytest.mark.parametrize("additive", [False, True])
def test_a_query_that_sees_nothing_stays_finite(additive):
    q, k, v = qkv()
    mask = random_mask()
    mask[1, :, 2] = False  # a padding query: nothing to attend to
    if additive:
        mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    out = grouped_attention(q, k, v, mask)
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def gqa_model(dtype):
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval().to(dtype)
    model.set_attn_implementation("sdpa")
    return model


@pytest.fixture
def calls(monkeypatch):
    seen = []
    original = attention.grouped_attention

    def spy(*args, **kwargs):
        seen.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(attention, "grouped_attention", spy)
    return seen


BATCH = {
    "input_ids": torch.tensor([[1, 2, 3, 4], [0, 5, 6, 7]]),
    "attention_mask": torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]]),  # left padding
}


@pytest.mark.parametrize(
    ("dtype", "limit", "grouped"),
    [(torch.bfloat16, attention.EAGER_MAX_SCORES, True), (torch.bfloat16, 8, False)]
    + [(torch.float32, attention.EAGER_MAX_SCORES, False)],
)
def test_sdpa_gqa_uses_grouped_attention_for_small_bf16_passes_only(
    dtype, limit, grouped, calls, monkeypatch
):
    monkeypatch.setattr(attention, "EAGER_MAX_SCORES", limit)
    model = gqa_model(dtype)
    before = model(**BATCH).logits.float()
    assert use_gqa_attention(model)
    after = model(**BATCH).logits.float()
    assert bool(calls) is grouped
    assert len(calls) == (2 if grouped else 0)  # one per layer
    # Only the padded row's real positions (a padding position attends to nothing).
    real = BATCH["attention_mask"].bool()
    tolerance = 0.05 if dtype is torch.bfloat16 else 1e-5
    torch.testing.assert_close(after[real], before[real], atol=tolerance, rtol=0)


def test_grouped_attention_trains_a_bf16_model_with_padding(calls):
    model = gqa_model(torch.bfloat16)
    use_gqa_attention(model)
    model(**BATCH).logits.float().logsumexp(-1).sum().backward()
    assert calls
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
