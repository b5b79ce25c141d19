import pytest
import torch

from textgym_agents import PPOConfig, PPOPolicy
from textgym_agents.decoding import scoring
from textgym_agents.testing import tiny_model


def scored(policy, prompts, responses):
    policy.model.zero_grad(set_to_none=True)
    scores = policy.score(prompts, responses, with_entropy=True)
    loss = (scores.logps * scores.mask).sum() + (scores.entropy * scores.mask).sum()
    loss.backward()
    grads = [p.grad.clone() for p in policy.model.parameters() if p.requires_grad]
    with torch.no_grad():
        again = policy.score(prompts, responses, with_entropy=True)
    return scores, again, grads


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_reply_logits_in_chunks_change_nothing(monkeypatch, temperature):
    model, tokenizer = tiny_model()
    policy = PPOPolicy(model, tokenizer, config=PPOConfig(temperature=temperature))
    prompts = [
        policy.encode([{"role": "user", "content": f"question {i}" * (i + 1)}]) for i in range(5)
    ]
    responses = [[5 + i] * (3 + 2 * i) for i in range(5)]  # lengths 3..11
    whole, whole_again, whole_grads = scored(policy, prompts, responses)
    monkeypatch.setattr(scoring, "HEAD_CHUNK_POSITIONS", 1)  # one row of logits at a time
    split, split_again, split_grads = scored(policy, prompts, responses)
    torch.testing.assert_close(split.logps, whole.logps)
    torch.testing.assert_close(split.entropy, whole.entropy)
    for a, b in zip(split_grads, whole_grads, strict=True):
        torch.testing.assert_close(a, b)
    # without gradients the same chunks run: scoring and training agree to the bit
    assert torch.equal(split_again.logps, split.logps.detach())
    assert torch.equal(whole_again.logps, whole.logps.detach())
