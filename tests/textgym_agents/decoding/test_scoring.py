import pytest
import torch

from textgym_agents import PPOConfig, PPOPolicy
from textgym_agents.decoding import scoring
from textgym_agents.testing import perturb_adapter, tiny_model


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
    monkeypatch.setattr(scoring, "HEAD_CHUNK_POSITIONS", 1)  # one position at a time
    split, split_again, split_grads = scored(policy, prompts, responses)
    torch.testing.assert_close(split.logps, whole.logps)
    torch.testing.assert_close(split.entropy, whole.entropy)
    for a, b in zip(split_grads, whole_grads, strict=True):
        # summed in another order: with several OpenMP threads the sums differ by ~4e-5
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # without gradients the same chunks run: scoring and training agree to the bit
    assert torch.equal(split_again.logps, split.logps.detach())
    assert torch.equal(whole_again.logps, whole.logps.detach())


def test_padding_after_a_shorter_reply_is_not_scored():
    model, tokenizer = tiny_model()
    policy = PPOPolicy(model, tokenizer, config=PPOConfig())
    perturb_adapter(policy)
    prompts = [policy.encode([{"role": "user", "content": f"q{i}"}]) for i in range(3)]
    responses = [[5, 6], [7, 8, 9, 10, 11], [12]]
    scores = policy.score(prompts, responses, with_entropy=True)
    padding = scores.mask == 0
    assert padding.sum() == 3 + 4
    assert torch.all(scores.logps[padding] == 0) and torch.all(scores.entropy[padding] == 0)
    assert torch.all(scores.logps[~padding] < 0) and torch.all(scores.entropy[~padding] > 0)
    # each reply's own tokens score as when the row is scored with no padding after it
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        alone = policy.score([prompt], [response], with_entropy=True)
        torch.testing.assert_close(
            scores.logps[row, : len(response)], alone.logps[0], atol=1e-5, rtol=0
        )


def conversation_rows(policy):
    """Three turns of one episode that keeps its conversation, and one turn of another."""
    chat = [{"role": "user", "content": "What is 2 + 3?"}]
    prompts, responses = [], []
    for reply, observation in [("call 2+3", "Observation: 5"), ("answer", "ok"), ("done", "")]:
        prompts.append(policy.encode(chat))
        responses.append(policy.tokenizer.encode(reply, add_special_tokens=False))
        chat = chat + [{"role": "assistant", "content": reply}]
        chat = chat + [{"role": "user", "content": observation}]
    other = policy.encode([{"role": "user", "content": "What is 7 * 6?"}])
    return prompts + [other], responses + [[7, 8, 9]]


def decoder_rows(policy):
    """Rows of every decoder forward pass (a hook on the first decoder layer)."""
    rows = []
    layer = policy._decoder().layers[0]
    layer.register_forward_hook(lambda m, a, out: rows.append(a[0].shape[0]))
    return rows


@pytest.mark.parametrize("with_grad", [False, True])
def test_packed_turns_score_as_their_own_rows_do(with_grad):
    """A turn that begins another turn's prompt is read from that turn's row, same scores."""
    packed = perturb_adapter(PPOPolicy(*tiny_model(), config=PPOConfig()))
    apart = perturb_adapter(PPOPolicy(*tiny_model(), config=PPOConfig(pack_turns=False)))
    prompts, responses = conversation_rows(packed)
    for a, b in zip(prompts, prompts[1:3], strict=False):
        assert b[: len(a)] == a  # the prompts extend each other (the chat template's turns)
    results = []
    for policy in (packed, apart):
        rows = decoder_rows(policy)
        if with_grad:
            scores, again, grads = scored(policy, prompts, responses)
        else:
            with torch.no_grad():
                scores, grads = policy.score(prompts, responses, with_entropy=True), []
        results.append((scores, grads, rows))
    (a, a_grads, a_rows), (b, b_grads, b_rows) = results
    # 4 turns: the first two ride in the third's row; the other episode has its own
    assert max(a_rows) == 2 and max(b_rows) == 4
    torch.testing.assert_close(a.logps * a.mask, b.logps * b.mask, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.entropy * a.mask, b.entropy * b.mask, atol=1e-5, rtol=1e-5)
    assert torch.equal(a.mask, b.mask) and a.values.abs().min() > 0
    assert not with_grad or any(g.abs().sum() > 0 for g in a_grads)
    for x, y in zip(a_grads, b_grads, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)
