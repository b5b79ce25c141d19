"""Credit every valid reply (PPOConfig.all_choices): the returns table, the choice losses."""

import gymnasium as gym
import pytest
import torch

import textgym  # noqa: F401
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer, Turn
from textgym_agents.ppo import core
from textgym_agents.ppo.choice_credit import ChoiceReturns
from textgym_agents.ppo.steps import behaviour_weight
from textgym_agents.testing import tiny_model

LOGITS = [2.0, -1.0, 0.5, -3.0]
ADVANTAGES = [1.0, -0.5, 2.0, 0.25]


def sampled_gradient(logits, old_logps, action, advantage):
    """Gradient of PPO's clipped loss for one sampled reply, as the update computes it."""
    turn = Turn([1], [2], reward=0.0)
    turn.old_logps = old_logps[action : action + 1]
    weighted = torch.tensor([advantage * behaviour_weight(turn)], dtype=torch.float64)
    logps = logits.log_softmax(0)[action].reshape(1, 1)
    loss, _ = core.policy_loss(logps, turn.old_logps[None], weighted, torch.ones(1, 1), 0.2)
    (gradient,) = torch.autograd.grad(loss, logits)
    return gradient


def test_expected_surrogate_gradient_is_the_expected_sampled_gradient():
    """One-state bandit, enumerated: ∇ of the all-replies loss = E_π[sampled PPO gradient]."""
    logits = torch.tensor(LOGITS, dtype=torch.float64, requires_grad=True)
    old = logits.detach().log_softmax(0)
    advantages = torch.tensor(ADVANTAGES, dtype=torch.float64)
    loss = core.expected_policy_loss([logits.log_softmax(0)], [old], [advantages], 0.2)
    (every,) = torch.autograd.grad(loss, logits)
    expected = sum(
        old[a].exp() * sampled_gradient(logits, old, a, ADVANTAGES[a]) for a in range(len(old))
    )
    torch.testing.assert_close(every, expected)
    # ... which is the policy gradient -∇ Σ_a π(a) A(a) (REINFORCE's, in expectation)
    (exact,) = torch.autograd.grad(-(logits.softmax(0) * advantages).sum(), logits)
    torch.testing.assert_close(every, exact)


def test_expected_surrogate_clips_each_reply_as_ppo_does():
    old = torch.tensor([0.5, 0.5]).log()
    far = torch.tensor([0.9, 0.1]).log().requires_grad_()  # ratios 1.8 and 0.2: both clipped
    loss = core.expected_policy_loss([far], [old], [torch.tensor([1.0, -1.0])], 0.2)
    assert loss.item() == pytest.approx(-(0.5 * 1.2 - 0.5 * 0.8))
    (gradient,) = torch.autograd.grad(loss, far)
    assert gradient.abs().max().item() == 0.0  # past the clip nothing pulls further


@pytest.mark.parametrize(
    ("loss_fn", "setting"), [(core.expected_policy_loss, 0.2), (core.mirror_descent_loss, 1.0)]
)
def test_a_baseline_changes_nothing_when_every_reply_is_credited(loss_fn, setting):
    logits = torch.tensor(LOGITS, dtype=torch.float64, requires_grad=True)
    old = logits.detach().log_softmax(0)
    advantages = torch.tensor(ADVANTAGES, dtype=torch.float64)
    gradients = []
    for shift in (0.0, 5.0):
        loss = loss_fn([logits.log_softmax(0)], [old], [advantages + shift], setting)
        gradients.append(torch.autograd.grad(loss, logits)[0])
    torch.testing.assert_close(*gradients)


def test_mirror_descent_loss_is_minimised_by_the_mirror_descent_policy():
    """Its minimum over a free distribution is π_old · exp(step · A), renormalised."""
    old = torch.tensor(LOGITS, dtype=torch.float64).log_softmax(0)
    advantages = torch.tensor(ADVANTAGES, dtype=torch.float64)
    step = 0.7
    target = (old + step * advantages).log_softmax(0)
    assert core.mirror_descent_loss([target], [old], [advantages], step).item() < 1e-20
    logits = old.clone().requires_grad_()
    optimizer = torch.optim.SGD([logits], lr=2.0)
    for _ in range(200):
        optimizer.zero_grad()
        core.mirror_descent_loss([logits.log_softmax(0)], [old], [advantages], step).backward()
        optimizer.step()
    torch.testing.assert_close(logits.detach().log_softmax(0), target)


def test_mirror_descent_gradient_does_not_vanish_where_the_policy_is_saturated():
    """In log-prob space the pull is step · (A - mean A) / K whatever π_old is."""
    advantages = torch.tensor([-1.0, 1.0], dtype=torch.float64)
    for probabilities in ([0.5, 0.5], [1 - 1e-9, 1e-9]):
        old = torch.tensor(probabilities, dtype=torch.float64).log()
        logps = old.clone().requires_grad_()
        loss = core.mirror_descent_loss([logps], [old], [advantages], step=2.0)
        (gradient,) = torch.autograd.grad(loss, logps)
        torch.testing.assert_close(gradient, torch.tensor([1.0, -1.0], dtype=torch.float64))
    # the clipped surrogate's pull on the same saturated logits is nil
    logits = torch.tensor([0.0, -20.7], dtype=torch.float64, requires_grad=True)
    old = logits.detach().log_softmax(0)
    loss = core.expected_policy_loss([logits.log_softmax(0)], [old], [advantages], 0.2)
    assert torch.autograd.grad(loss, logits)[0].abs().max().item() < 1e-8


def test_mirror_descent_updates_leave_a_saturated_wrong_choice():
    """A two-armed bandit, logits fitted for a few steps per update: the better arm takes over."""
    logits = torch.tensor([0.0, -12.0], requires_grad=True)  # arm 1 (the better) at ~6e-6
    advantages = torch.tensor([-0.5, 0.5])
    optimizer = torch.optim.Adam([logits], lr=0.5)
    for _update in range(10):
        old = logits.detach().log_softmax(0)
        for _ in range(5):
            optimizer.zero_grad()
            loss = core.mirror_descent_loss([logits.log_softmax(0)], [old], [advantages], 2.0)
            loss.backward()
            optimizer.step()
    assert logits.softmax(0)[1].item() > 0.99


def test_mirror_descent_loss_is_zero_without_advantages_at_the_rollouts_weights():
    logits = torch.tensor(LOGITS, dtype=torch.float64, requires_grad=True)
    old = logits.detach().log_softmax(0)
    zero = core.mirror_descent_loss([logits.log_softmax(0)], [old], [torch.zeros(4)], 1.0)
    assert zero.item() == 0.0
    assert torch.autograd.grad(zero, logits)[0].abs().max().item() == 0.0


def episode(anchor_replies, rewards):
    turns = []
    for (anchor, reply), reward in zip(anchor_replies, rewards, strict=True):
        turn = Turn([1], [reply], reward, anchor=anchor)
        turn.choice_ids = [[10], [11]]
        turns.append(turn)
    turns[-1].terminated = True
    return turns


def test_returns_table_credits_each_reply_from_its_observation():
    table = ChoiceReturns(window=100)
    first = episode([("s", 10), ("t", 11)], [0.0, 1.0])  # from s: reply 10, return 1
    second = episode([("s", 11)], [-1.0])  # from s: reply 11, return -1
    table.assign([first, second], gamma=1.0, by_std=False)
    assert first[0].choice_advantages == second[0].choice_advantages == [1.0, -1.0]
    assert first[1].choice_advantages == [0.0, 0.0]  # only 11 was played from t: Q = V there


def test_returns_table_forgets_past_its_window_and_discounts():
    table = ChoiceReturns(window=2)
    table.assign([episode([("s", 10)], [1.0])], gamma=1.0, by_std=False)
    later = [episode([("s", 11)], [0.0]), episode([("s", 11)], [0.0])]
    table.assign(later, gamma=1.0, by_std=False)  # the window now holds only the two 11s
    assert later[0][0].choice_advantages == [0.0, 0.0]
    assert len(table.entries) == 2
    discounted = ChoiceReturns(window=10)
    turns = episode([("s", 10), ("t", 10)], [0.0, 1.0])
    discounted.assign([turns], gamma=0.5, by_std=False)
    assert [ret for _, _, ret in discounted.entries] == [0.5, 1.0]


def test_returns_table_skips_unfinished_episodes_and_scales_by_the_spread():
    table = ChoiceReturns(window=100)
    cut = episode([("s", 10)], [5.0])
    cut[-1].terminated = False  # cut by the rollout: no return yet
    done = [episode([("s", 10)], [2.0]), episode([("s", 11)], [0.0])]
    table.assign([cut, *done], gamma=1.0, by_std=True)
    assert cut[0].choice_advantages is None and len(table.entries) == 2
    assert done[0][0].choice_advantages == pytest.approx([1.0, -1.0])  # (±1) / their std 1
    doubled = ChoiceReturns(window=100)
    twice = [episode([("s", 10)], [4.0]), episode([("s", 11)], [0.0])]
    doubled.assign(twice, gamma=1.0, by_std=True)
    assert twice[0][0].choice_advantages == pytest.approx([1.0, -1.0])  # the scale is gone


def test_returns_table_state_round_trips():
    table = ChoiceReturns(window=3)
    table.assign([episode([(("s", 1), 10)], [1.0]), episode([(("s", 1), 11)], [0.0])], 1.0, False)
    restored = ChoiceReturns(window=3)
    restored.load_state(table.state())
    assert restored.entries == table.entries
    assert restored.advantages(("s", 1), [[10], [11]]) == table.advantages(("s", 1), [[10], [11]])


def all_choices_policy(**settings):
    values = dict(num_steps=2, minibatch_size=8, micro_batch_size=4, seed=0)
    config = PPOConfig(decoding="choices", all_choices=True, **{**values, **settings})
    torch.manual_seed(0)
    return PPOPolicy(*tiny_model(), config=config)


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_an_update_credits_every_reply_from_the_rollouts_distribution(estimator):
    settings = {"advantage_estimator": estimator, "group_size": 2 if estimator == "grpo" else 1}
    policy = all_choices_policy(**settings)
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    buffer = trainer.collect()
    turns = buffer.turns()
    assert all(t.anchor is not None and t.old_choice_logps is not None for t in turns)
    # the rollout's distribution over the replies is the one training's pass computes
    scores = policy.score(
        [t.prompt_ids for t in turns],
        [t.response_ids for t in turns],
        choices=[t.choice_ids for t in turns],
        values=False,
    )
    for turn, row in zip(turns, scores.choice_logps, strict=True):
        torch.testing.assert_close(turn.old_choice_logps, row.float(), atol=1e-5, rtol=0)
    finished = [t for ep in buffer.episodes() if ep[-1].done for t in ep]
    stats = trainer.update(buffer)
    assert finished and all(t.choice_advantages is not None for t in finished)
    assert stats["train/trained_turns"] > 0
    assert trainer.choice_returns is not None and len(trainer.choice_returns.entries) == len(
        finished
    )


def test_all_choices_needs_choice_decoding():
    with pytest.raises(ValueError, match="all_choices credits every valid reply"):
        PPOConfig(all_choices=True, decoding="free")
    with pytest.raises(ValueError, match="rollout_engine='hf'"):
        PPOConfig(all_choices=True, decoding="choices", rollout_engine="vllm")
    with pytest.raises(ValueError, match="all_choices_window"):
        PPOConfig(all_choices=True, decoding="choices", all_choices_window=0)


@pytest.mark.parametrize(
    ("choice_update", "loss_name"),
    [("clipped", "expected_policy_loss"), ("mirror", "mirror_descent_loss")],
)
def test_the_update_trains_credited_turns_with_the_chosen_loss(
    monkeypatch, choice_update, loss_name
):
    calls = []
    original = getattr(core, loss_name)

    def spy(logps, old_logps, advantages, setting):
        calls.append([a.tolist() for a in advantages])
        return original(logps, old_logps, advantages, setting)

    monkeypatch.setattr(core, loss_name, spy)
    policy = all_choices_policy(
        advantage_estimator="grpo", group_size=2, num_epochs=1, choice_update=choice_update
    )
    trainer = PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4))
    buffer = trainer.collect()
    turns = buffer.turns()
    trainer.update(buffer)
    credited = sorted(t.choice_advantages for t in turns if t.choice_advantages)
    trained = sorted(a for call in calls for a in call)
    # turns without any advantage are left out of the clipped surrogate; the mirror fit
    # keeps them, holding their log-probs in place
    kept = credited if choice_update == "mirror" else [a for a in credited if any(a)]
    assert trained and len(trained) == len(kept)
    assert len(kept) > len([a for a in credited if any(a)]) or choice_update == "clipped"
    for got, want in zip(trained, sorted(kept), strict=True):
        assert got == pytest.approx(want)


def test_the_mirror_update_needs_all_choices_and_a_positive_step():
    with pytest.raises(ValueError, match="needs all_choices=True"):
        PPOConfig(decoding="choices", choice_update="mirror")
    with pytest.raises(ValueError, match="choice_update"):
        PPOConfig(decoding="choices", all_choices=True, choice_update="natural")
    with pytest.raises(ValueError, match="mirror_step"):
        PPOConfig(decoding="choices", all_choices=True, choice_update="mirror", mirror_step=0)


@pytest.mark.slow
def test_a_checkpoint_keeps_the_window_of_returns(tmp_path, tiny_dir):
    from types import SimpleNamespace

    from textgym_agents.ppo.run_files import restore_checkpoint

    def trainer_of_a_saved_model():
        config = PPOConfig(decoding="choices", all_choices=True, num_steps=2, seed=0)
        policy = PPOPolicy.from_pretrained(tiny_dir, dtype="float32", config=config)
        return PPOTrainer(policy, gym.make_vec("textgym/Blackjack-v1", num_envs=4), output_dir=run)

    run = tmp_path / "run"
    trainer = trainer_of_a_saved_model()
    trainer.train(8)
    assert trainer.choice_returns is not None and trainer.choice_returns.entries
    fresh = trainer_of_a_saved_model()
    restore_checkpoint(fresh, SimpleNamespace(rank=0, seed=lambda s: s), run)
    assert fresh.choice_returns is not None
    assert fresh.choice_returns.entries == trainer.choice_returns.entries
