"""Self-play on one weight copy: frozen snapshot adapters, the pool, its opponents and ratings."""

from __future__ import annotations

import copy
import pickle
from types import SimpleNamespace

import gymnasium as gym
import pytest
import torch

import textgym  # noqa: F401 (registers the envs)
from textgym.episodes import reply_choices
from textgym_agents import PPOConfig, PPOPolicy
from textgym_agents.ppo.trainer import PPOTrainer
from textgym_agents.selfplay import SelfPlayOpponent, SelfPlayPool, adapter_active

pytest.importorskip("pettingzoo")

PROMPT = [{"role": "user", "content": "Your move?"}]


def make_policy(tiny, **config):
    settings = {"num_steps": 3, "decoding": "choices", "minibatch_size": 8, "seed": 0}
    return PPOPolicy(*tiny, config=PPOConfig(**{**settings, **config}))


def perturb(params, seed=1):
    """Move the learner's weights away from its snapshots (LoRA B starts at zero)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(0.05 * torch.randn(p.shape, generator=generator))


def learner_logps(policy):
    prompt = policy.encode(PROMPT)
    return policy.score([prompt], [[1, 2, 3]], values=False).logps.clone()


def state(params):
    return [p.detach().clone() for p in params]


def test_the_opponent_adapter_does_not_change_during_an_update(tiny):
    policy = make_policy(tiny)
    pool = SelfPlayPool(policy, size=2, every=100)
    learner = pool.adapter_parameters("default")
    snapshot = pool.adapter_parameters("selfplay_0")
    assert learner and len(snapshot) == len(learner)
    trainer = PPOTrainer(policy, gym.make_vec("textgym/TicTacToe-v0", num_envs=2, opponent=pool))
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert {id(p) for p in learner} <= optimised
    assert not {id(p) for p in snapshot} & optimised
    before, learner_before = state(snapshot), state(learner)
    # A zero value head and three moves without a finished game give all-zero advantages and
    # no gradient at all; nonzero values make every GAE advantage nonzero whatever is played.
    perturb(policy.value_head.parameters())
    buffer = trainer.collect()
    trainer.update(buffer, trainer.collector.drain())
    assert all(torch.equal(a, b) for a, b in zip(before, state(snapshot), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(learner_before, state(learner), strict=True))
    assert all(p.grad is None for p in snapshot) and not any(p.requires_grad for p in snapshot)


def test_snapshots_enter_every_n_updates_and_the_pool_is_bounded(tiny):
    policy = make_policy(tiny)
    pool = SelfPlayPool(policy, size=2, every=2)
    learner = pool.adapter_parameters("default")
    seen = []
    for update in range(1, 8):
        perturb(learner, seed=update)
        weights = state(learner)
        pool.on_update(SimpleNamespace(update_step=update), {})
        seen.append([s.name for s in pool.snapshots])
        if update % 2 == 0:  # the new snapshot holds the learner's weights of that update
            copied = pool.adapter_parameters(pool.snapshots[-1].adapter)
            assert all(torch.equal(a, b) for a, b in zip(weights, copied, strict=True))
    assert seen[0] == ["selfplay:0"]
    assert seen[1] == ["selfplay:0", "selfplay:2"]
    assert seen[3] == ["selfplay:2", "selfplay:4"]
    assert seen[6] == ["selfplay:4", "selfplay:6"]
    assert sorted(policy.model.peft_config) == ["default", "selfplay_4", "selfplay_6"]
    assert policy.model.active_adapter == "default"


def test_the_learner_adapter_is_active_after_every_opponent_move(tiny, monkeypatch):
    policy = make_policy(tiny)
    pool = SelfPlayPool(policy, size=2, every=1)
    perturb(pool.adapter_parameters("default"))  # the snapshot now plays differently
    reference = learner_logps(policy)
    with adapter_active(policy.model, "selfplay_0"):
        assert not torch.equal(learner_logps(policy), reference)  # the switch is real
    during, after = [], []
    generate = policy.generate
    act = SelfPlayOpponent.act

    def spy_generate(*args, **kwargs):
        during.append((policy.model.active_adapter, torch.is_grad_enabled()))
        return generate(*args, **kwargs)

    def spy_act(self, observation, info):
        move = act(self, observation, info)
        model = policy.model
        flags = [p.requires_grad for p in pool.adapter_parameters("default")]
        frozen = [p.requires_grad for p in pool.adapter_parameters("selfplay_0")]
        after.append((model.active_adapter, all(flags), any(frozen)))
        return move

    monkeypatch.setattr(policy, "generate", spy_generate)
    monkeypatch.setattr(SelfPlayOpponent, "act", spy_act)
    env = gym.make("textgym/TicTacToe-v0", opponent=pool)
    for seed in range(4):  # both seats
        messages, _ = env.reset(seed=seed)
        done = False
        while not done:
            reply = policy.act(messages, choices=reply_choices(env))
            messages, _, terminated, truncated, info = env.step(reply)
            done = terminated or truncated
        assert info["opponent"] == "selfplay:0"
    assert len(after) >= 8
    assert set(after) == {("default", True, False)}
    # The learner's own moves under its adapter, the opponent's under the snapshot's, no grad.
    assert set(during) == {("default", True), ("selfplay_0", False)}
    assert torch.equal(learner_logps(policy), reference)


def test_adapter_active_restores_on_error(tiny):
    policy = make_policy(tiny)
    pool = SelfPlayPool(policy, size=1, every=1)
    with pytest.raises(KeyError), adapter_active(policy.model, pool.snapshots[0].adapter):
        raise KeyError("boom")
    assert policy.model.active_adapter == "default"
    assert all(p.requires_grad for p in pool.adapter_parameters("default"))


def parameter_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_memory_grows_by_one_adapter_per_snapshot_and_stays_bounded(tokenizer):
    from textgym_agents.testing import tiny_model

    sizes = {}
    for size in (1, 2, 4):
        policy = make_policy(tiny_model(tokenizer))
        model = policy.model
        base = parameter_bytes(model)
        adapter = sum(p.numel() * p.element_size() for p in policy.trainable_parameters()[0])
        base_ids = [p.data_ptr() for n, p in model.named_parameters() if "lora_" not in n]
        pool = SelfPlayPool(policy, size=size, every=1)
        for update in range(1, 3 * size + 1):  # fill the pool, then keep replacing snapshots
            pool.on_update(SimpleNamespace(update_step=update), {})
            assert len(pool.snapshots) == min(size, update + 1)
        sizes[size] = parameter_bytes(model)
        assert sizes[size] == base + size * adapter  # one model, one adapter per snapshot
        assert [p.data_ptr() for n, p in model.named_parameters() if "lora_" not in n] == base_ids
    assert sizes[4] - sizes[2] == 2 * (sizes[2] - sizes[1]) > 0


def test_elo_follows_the_games_against_snapshots(tiny):
    pool = SelfPlayPool(make_policy(tiny), size=2, every=1)
    metrics = {}
    games = [("selfplay:0", "win"), ("random", "loss"), ("selfplay:0", "win")]
    pool.on_update(SimpleNamespace(update_step=1), metrics, games=games)
    # 1000 v 1000 win: +8; then 1008 v 992: expected 0.5230, +7.63
    assert metrics["selfplay/elo"] == pytest.approx(1015.6319, abs=1e-3)
    assert pool.snapshots[0].rating == pytest.approx(2000 - 1015.6319, abs=1e-3)
    assert pool.snapshots[1].rating == metrics["selfplay/elo"]  # taken at the learner's
    assert metrics["selfplay/games"] == 2 and metrics["selfplay/pool_size"] == 2


def test_pool_is_shared_by_copies_and_refuses_pickling(tiny):
    pool = SelfPlayPool(make_policy(tiny), size=1, every=1)
    env = gym.make("textgym/TicTacToe-v0", opponent=pool)
    env.reset(seed=0)
    copied = copy.deepcopy(env)
    opponent = copied.unwrapped.opponent
    assert isinstance(opponent, SelfPlayOpponent) and opponent.pool is pool
    assert opponent is not env.unwrapped.opponent
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(pool)


def test_save_keeps_only_the_learner_adapter(tiny, tmp_path):
    policy = make_policy(tiny)
    policy.base_info = {"name_or_path": "tiny"}
    SelfPlayPool(policy, size=2, every=1)
    path = policy.save(tmp_path / "policy")
    adapter_dir = next(p for p in path.iterdir() if p.is_dir())
    assert not any(p.name.startswith("selfplay") for p in adapter_dir.rglob("*"))


def pool_weights(pool):
    return {s.name: state(pool.adapter_parameters(s.adapter)) for s in pool.snapshots}


@pytest.mark.slow
def test_a_resumed_run_plays_the_same_pool_as_the_one_it_stopped_with(
    tiny, tokenizer, tmp_path, caplog
):
    from textgym_agents.testing import tiny_model

    run = tmp_path / "run"
    policy = make_policy(tiny, keep_checkpoints=5, progress=False)
    policy.base_info = {"name_or_path": "tiny"}
    pool = SelfPlayPool(policy, size=2, every=1, greedy=True)
    envs = gym.make_vec("textgym/TicTacToe-v0", num_envs=2, opponent=pool)
    PPOTrainer(policy, envs, output_dir=run).train(6, callback=pool)
    assert [s.name for s in pool.snapshots][-1] != "selfplay:0"  # it took snapshots
    names = [s.name for s in pool.snapshots]
    ratings = [pool.rating, *(s.rating for s in pool.snapshots)]
    weights = pool_weights(pool)
    assert not all(  # snapshots of different updates differ, so restoring means something
        torch.equal(a, b) for a, b in zip(*weights.values(), strict=True)
    )
    # A fresh process: new policy and pool (snapshot 0 of fresh weights), resumed from the run.
    fresh = make_policy(tiny_model(tokenizer), keep_checkpoints=5)  # its own model
    fresh_pool = SelfPlayPool(fresh, size=2, every=1, greedy=True)
    trainer = PPOTrainer(
        fresh, gym.make_vec("textgym/TicTacToe-v0", num_envs=2, opponent=fresh_pool), output_dir=run
    )
    trainer.add_callback(fresh_pool)
    from textgym_agents.ppo.run_files import restore_checkpoint

    restore_checkpoint(trainer, SimpleNamespace(rank=0, seed=lambda s: s), run)
    assert [s.name for s in fresh_pool.snapshots] == names
    assert [fresh_pool.rating, *(s.rating for s in fresh_pool.snapshots)] == ratings
    restored = pool_weights(fresh_pool)
    for name in names:
        assert all(torch.equal(a, b) for a, b in zip(weights[name], restored[name], strict=True))
    assert sorted(fresh.model.peft_config) == [
        "default",
        *sorted(s.adapter for s in pool.snapshots),
    ]
    assert fresh.model.active_adapter == "default"
    assert not any(
        p.requires_grad
        for s in fresh_pool.snapshots
        for p in fresh_pool.adapter_parameters(s.adapter)
    )
    # A trainer whose callbacks keep no state in the checkpoint: the pool starts afresh, said so.
    checkpoint = sorted((run / "checkpoints").iterdir())[-1]
    other = SelfPlayPool(make_policy(tiny_model(tokenizer)), size=2, every=1)
    other.checkpoint_key = "another"
    bare = PPOTrainer(other.policy, gym.make_vec("textgym/TicTacToe-v0", num_envs=2))
    bare.add_callback(other)
    with caplog.at_level("WARNING"):
        restore_checkpoint(bare, SimpleNamespace(rank=0, seed=lambda s: s), checkpoint)
    assert "holds no callback_another state" in caplog.text
    assert [s.name for s in other.snapshots] == ["selfplay:0"]
