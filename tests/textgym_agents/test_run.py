import json
import math

import gymnasium as gym
import pytest
import torch

import textgym
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer, evaluate
from textgym_agents.runfiles.checkpoint import latest_checkpoint
from textgym_agents.testing import tiny_model
from textgym_agents.tracking.metrics_log import read_metrics


def make_policy(tmp_path, **overrides):
    base = tmp_path / "base"
    if not base.exists():
        model, tokenizer = tiny_model()
        model.save_pretrained(base)
        tokenizer.save_pretrained(base)
    values = dict(
        num_steps=2,
        max_new_tokens=6,
        minibatch_size=8,
        micro_batch_size=4,
        save_every=1,
        progress=False,
        seed=3,
    )
    values.update(overrides)
    return PPOPolicy.from_pretrained(str(base), config=PPOConfig(**values))


def trainable(policy):
    lora, head = policy.trainable_parameters()
    return [p.detach() for p in [*lora, *head]]


def envs():
    return gym.make_vec("textgym/Blackjack-v1", num_envs=4)


@pytest.mark.slow
def test_learn_writes_the_run_directory(tmp_path):
    policy = make_policy(tmp_path)
    run = tmp_path / "run"
    metrics = policy.learn(envs(), total_episodes=6, output_dir=run)
    lines = read_metrics(run)
    assert len(lines) == metrics["train/update"] >= 1
    for key in [
        "env/return_mean",
        "env/invalid_rate",
        "policy/approx_kl",
        "policy/clip_frac",
        "policy/entropy",
        "loss/policy",
        "loss/value",
        "value/explained_var",
        "time/rollout_s",
        "time/update_s",
        "throughput/turns_per_s",
    ]:
        assert any(key in line for line in lines), key
    assert lines[-1]["env/episodes"] >= 6
    assert (run / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((run / "config.json").read_text())["ppo"]["seed"] == 3
    assert latest_checkpoint(run) is not None
    loaded = PPOPolicy.load(run / "final")
    prompt = [loaded.encode([{"role": "user", "content": "hi"}])]
    with torch.no_grad():
        a = loaded.score(prompt, [[1, 2]]).logps
        b = policy.score(prompt, [[1, 2]]).logps
    assert torch.equal(a, b)


@pytest.mark.slow
def test_checkpoint_is_loadable_as_a_policy(tmp_path):
    policy = make_policy(tmp_path)
    policy.learn(envs(), total_episodes=4, output_dir=tmp_path / "run")
    checkpoint = latest_checkpoint(tmp_path / "run")
    assert PPOPolicy.load(checkpoint).config.seed == 3


# The novelty bonus's visit counts are part of the run's state: FrozenLake revisits states;
# so are the entropy bonus's weight when an entropy target steers it, and self-imitation's
# kept turns.
RESUMED_RUNS = {
    "plain": ({}, envs),
    "entropy target": ({"decoding": "choices", "ent_coef": 0.1, "entropy_target": 2.0}, envs),
    "novelty": (
        {"novelty_bonus": 0.2, "decoding": "choices"},
        lambda: gym.make_vec("textgym/FrozenLake-v1", num_envs=4, max_episode_steps=6),
    ),
    # Self-imitation's kept turns (won hands) and its draws from them.
    "self imitation": ({"self_imitation": 4, "decoding": "choices"}, envs),
    # Without a critic, also the returns per observation its values come from.
    "self imitation, no critic": (
        {
            "self_imitation": 4,
            "decoding": "choices",
            "advantage_estimator": "gigpo",
            "group_size": 2,
        },
        envs,
    ),
}


@pytest.mark.parametrize("name", list(RESUMED_RUNS))
@pytest.mark.slow
def test_resume_continues_the_same_run(tmp_path, name):
    settings, make_envs = RESUMED_RUNS[name]
    straight = make_policy(tmp_path, **settings)
    straight.learn(make_envs(), total_episodes=12, output_dir=tmp_path / "straight")
    updates = read_metrics(tmp_path / "straight")[-1]["train/update"]

    first = make_policy(tmp_path, **settings)
    first.learn(make_envs(), total_episodes=5, output_dir=tmp_path / "resumed")
    done = read_metrics(tmp_path / "resumed")[-1]["train/update"]
    second = make_policy(tmp_path, **settings)
    second.learn(
        make_envs(),
        total_episodes=12,
        output_dir=tmp_path / "resumed",
        resume_from=tmp_path / "resumed",
    )
    lines = read_metrics(tmp_path / "resumed")
    steps = [line["step"] for line in lines]
    assert steps == list(range(1, len(steps) + 1))  # no gap, no repeat
    assert lines[-1]["env/episodes"] >= 12
    assert steps[done] == done + 1  # the resumed run picked up the update count
    assert updates >= 1
    if settings.get("self_imitation"):  # the replay took part after the resume point
        later = read_metrics(tmp_path / "straight")[done:]
        assert any(line["train/replayed_turns"] for line in later)
    # Resumed from its checkpoint, the run is the straight run: same updates, same numbers.
    straight_lines = read_metrics(tmp_path / "straight")
    assert len(lines) == len(straight_lines) == updates > done
    for resumed_line, straight_line in zip(lines, straight_lines, strict=True):
        keys = [k for k in straight_line if not k.startswith(("time", "throughput/"))]
        assert {k: resumed_line[k] for k in keys} == {k: straight_line[k] for k in keys}
    for a, b in zip(trainable(second), trainable(straight), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.slow
def test_resuming_a_finished_run_returns_its_last_metrics(tmp_path):
    run = tmp_path / "run"
    finished = make_policy(tmp_path).learn(envs(), total_episodes=6, output_dir=run)
    again = make_policy(tmp_path).learn(envs(), total_episodes=6, output_dir=run, resume_from=run)
    assert again["env/episodes"] == finished["env/episodes"] >= 6
    assert again["train/update"] == finished["train/update"] == len(read_metrics(run))
    assert again["env/return_mean"] == finished["env/return_mean"]


def test_a_fresh_start_refuses_a_directory_holding_another_runs_checkpoints(tmp_path):
    run = tmp_path / "run"
    make_policy(tmp_path).learn(envs(), total_episodes=4, output_dir=run)
    saved = sorted((run / "checkpoints").iterdir())
    with pytest.raises(ValueError, match=r"already holds checkpoints .* resume_from="):
        make_policy(tmp_path).learn(envs(), total_episodes=4, output_dir=run)
    assert sorted((run / "checkpoints").iterdir()) == saved  # nothing of the first run lost


@pytest.mark.slow
def test_a_fresh_start_drops_the_rows_of_a_start_that_saved_no_checkpoint(tmp_path):
    earlier, run = tmp_path / "earlier", tmp_path / "run"
    make_policy(tmp_path).learn(envs(), total_episodes=4, output_dir=earlier)
    run.mkdir()  # as left by a start killed before its first checkpoint: rows, no checkpoint
    (run / "metrics.jsonl").write_bytes((earlier / "metrics.jsonl").read_bytes())
    metrics = make_policy(tmp_path, seed=4).learn(envs(), total_episodes=8, output_dir=run)
    rows = read_metrics(run)
    assert [row["step"] for row in rows] == list(range(1, metrics["train/update"] + 1))


def test_learn_rejects_bad_total(tmp_path):
    policy = make_policy(tmp_path)
    with pytest.raises(ValueError, match="total_episodes must be an int >= 1, got 0"):
        policy.learn(envs(), total_episodes=0)


def test_evaluate_counts_exact_episodes_and_rates(tmp_path):
    policy = make_policy(tmp_path)
    result = evaluate(policy, gym.make("textgym/Blackjack-v1"), n_episodes=10, num_envs=4)
    assert result["episodes"] == 10
    assert 0.0 <= result["invalid_rate"] <= 1.0
    assert math.isfinite(result["mean_return"]) and result["std_return"] >= 0
    vector = evaluate(policy, envs(), n_episodes=7)
    assert vector["episodes"] == 7


class ScriptedCalculatorPolicy(textgym.PolicyBase):
    """Any textgym Policy (act_batch) can be evaluated: here, a scripted tool user."""

    def __init__(self, replies):
        self.replies = replies

    def act_batch(self, batch, *, choices=None, schemas=None, greedy=False):
        replies = []
        for messages in batch:
            question = messages[1]["content"].removeprefix("What is ").rstrip("?")
            replies.append(self.replies(question, messages[-1]["content"]))
        return replies


def test_evaluate_success_rate_when_env_reports_it():
    def solve(question, last):
        if last.startswith("Observation: "):
            return "Answer: " + last.removeprefix("Observation: ")
        return f"Action: calculator({question})"

    env = gym.make("textgym/Calculator-v0")
    result = evaluate(ScriptedCalculatorPolicy(solve), env, n_episodes=6, num_envs=3)
    assert result == {
        "mean_return": 1.0,
        "std_return": 0.0,
        "mean_length": 2.0,
        "invalid_rate": 0.0,
        "episodes": 6,
        "success_rate": 1.0,
    }
    wrong = evaluate(ScriptedCalculatorPolicy(lambda q, last: "Answer: 0"), env, n_episodes=4)
    assert wrong["success_rate"] == 0.0 and wrong["mean_return"] == -1.0
    # episodes cut short by invalid replies count as failures once the env reports success
    mixed = evaluate(
        ScriptedCalculatorPolicy(lambda q, last: "Answer: 0" if "?" in last else "hmm"),
        env,
        n_episodes=4,
        num_envs=1,
    )
    assert mixed["success_rate"] == 0.0


def test_evaluate_counts_episodes_cut_short_as_failures():
    # Walking left forever: FrozenLake's own 100-step limit ends each episode unsuccessfully,
    # and the tighter limit given to gym.make ends it without any is_success key at all.
    left = ScriptedCalculatorPolicy(lambda q, last: '{"action": "left"}')
    for limit, expected in [(None, 0.0), (5, None)]:
        env = gym.make("textgym/FrozenLake-v1", is_slippery=False, max_episode_steps=limit)
        result = evaluate(left, env, n_episodes=2, num_envs=1)
        assert result.get("success_rate") == expected and result["mean_return"] == 0.0
    # once one episode reports it, those cut short count as failures
    moves = iter(["right", "right", "down", "down", "down", "right"])  # G, then walk left

    def walk(q, last):
        return '{"action": "' + next(moves, "left") + '"}'

    env = gym.make("textgym/FrozenLake-v1", is_slippery=False, max_episode_steps=8)
    result = evaluate(ScriptedCalculatorPolicy(walk), env, n_episodes=2, num_envs=1)
    assert result["success_rate"] == 0.5


# --- exact resume ---------------------------------------------------------------------------


GIGPO = {"advantage_estimator": "gigpo", "group_size": 3}


@pytest.mark.parametrize(
    ("env_id", "env_kwargs", "decoding", "estimator"),
    # the fast tier keeps one GAE run (free decoding) and one group run (choices)
    [
        ("textgym/Blackjack-v1", {}, "free", {}),
        pytest.param("textgym/Blackjack-v1", {}, "choices", {}, marks=pytest.mark.slow),
        # invalid replies do not end CartPole episodes here: they run across checkpoints
        pytest.param(
            "textgym/CartPole-v1", {"max_invalid": 1000}, "free", {}, marks=pytest.mark.slow
        ),
        # seed-shared groups: every checkpoint falls between rounds; the seeds go on
        ("textgym/Blackjack-v1", {}, "choices", GIGPO),
        # annealed learning rates are recomputed from the episodes done, not saved
        pytest.param(
            "textgym/Blackjack-v1",
            {},
            "choices",
            {**GIGPO, "anneal_lr": True},
            marks=pytest.mark.slow,
        ),  # fmt: skip
        pytest.param(
            "textgym/FrozenLake-v1",
            {},
            "free",
            {**GIGPO, "max_new_tokens": 3},
            marks=pytest.mark.slow,
        ),
    ],
    ids=[
        "blackjack",
        "blackjack-choices",
        "cartpole-long-episodes",
        "gigpo",
        "gigpo-annealed",
        "gigpo-free",
    ],
)
@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run_exactly(
    tmp_path, env_id, env_kwargs, decoding, estimator
):
    """N updates straight == N/2 updates, a fresh process-like restart, N/2 more (CPU, seeded)."""
    n = 6

    def trainer(run):
        torch.manual_seed(0)  # the LoRA initialisation draws from torch's global RNG
        settings = {"num_steps": 3, "decoding": decoding, "kl_coef": 0.05, **estimator}
        policy = make_policy(tmp_path, **settings)
        envs = gym.make_vec(env_id, num_envs=3, **env_kwargs)
        return PPOTrainer(policy, envs, output_dir=run)

    def stop_at(update):
        def callback(metrics):
            torch.rand(3)  # a callback may use torch's RNG: checkpoints come after it
            return False if metrics["train/update"] >= update else None

        return callback

    def weights(t):
        return [p.detach().clone() for g in t.optimizer.param_groups for p in g["params"]]

    total = 60 if estimator.get("anneal_lr") else 10**6  # annealing: a budget it reaches
    straight = trainer(tmp_path / "straight")
    initial = weights(straight)
    straight.train(total, callback=stop_at(n))
    trainer(tmp_path / "resumed").train(total, callback=stop_at(n // 2))
    replay = json.loads((latest_checkpoint(tmp_path / "resumed") / "envs.json").read_text())
    if estimator:  # the rounds played, from which the next round's seeds follow
        assert replay["collector"]["group"]["rounds"] >= n // 2
    else:
        assert replay["replay"] is not None  # the envs' state was recorded, not dropped
    resumed = trainer(tmp_path / "resumed")
    resumed.train(total, callback=stop_at(n), resume_from=tmp_path / "resumed")

    after = weights(straight)
    assert not all(torch.equal(a, b) for a, b in zip(after, initial, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), after, strict=True))
    assert (
        resumed.optimizer.state_dict()["state"].keys()
        == straight.optimizer.state_dict()["state"].keys()
    )

    def timeless(lines):
        return [{k: v for k, v in line.items() if not k.startswith(TIMING)} for line in lines]

    assert timeless(read_metrics(tmp_path / "resumed")) == timeless(
        read_metrics(tmp_path / "straight")
    )


TIMING = ("time", "throughput/")


@pytest.mark.slow
def test_anneal_lr_decays_both_learning_rates_linearly_over_the_run(tmp_path):
    policy = make_policy(tmp_path, anneal_lr=True, learning_rate=1e-3, value_learning_rate=2e-3)
    trainer = PPOTrainer(policy, envs(), output_dir=tmp_path / "run")
    seen = []

    def callback(metrics):
        seen.append([g["lr"] for g in trainer.optimizer.param_groups])
        return False if metrics["train/update"] >= 4 else None

    trainer.train(40, callback=callback)
    lines = read_metrics(tmp_path / "run")
    done_before = [0] + [line["env/episodes"] for line in lines[:-1]]
    expected = [1e-3 * (1 - done / 40) for done in done_before]
    assert [line["train/learning_rate"] for line in lines] == pytest.approx(expected)
    assert [lora for lora, _ in seen] == pytest.approx(expected)
    assert [head for _, head in seen] == pytest.approx([2 * e for e in expected])
    assert expected[0] == 1e-3 and expected[-1] < expected[0]  # it decays


@pytest.mark.slow
def test_without_anneal_lr_the_learning_rate_stays(tmp_path):
    policy = make_policy(tmp_path, learning_rate=1e-3)
    trainer = PPOTrainer(policy, envs(), output_dir=None)
    trainer.train(12)
    assert trainer.optimizer.param_groups[0]["lr"] == 1e-3
