"""Faults during training: envs that raise, non-finite losses, SIGTERM/Ctrl-C, SIGKILL.

Each fault must stop (or be skipped) cleanly and leave a checkpoint of the last finished update
that loads and resumes. Real envs, a real tiny model, real signals.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import pytest
import torch

import textgym  # noqa: F401
from textgym import TextEnvWrapper
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.exceptions import EnvFault, NonFiniteUpdateError, SIGTERMExit
from textgym_agents.ppo.run import TrainingRun
from textgym_agents.runfiles.checkpoint import latest_checkpoint, list_checkpoints
from textgym_agents.tracking.metrics_log import read_metrics

MANY = 10**6  # episodes: runs here end by a fault, a signal or a callback


class Injector(gym.Wrapper):
    """Misbehaves at the env's ``at``-th step (counting every episode): raises, pays NaN, or
    sends its own process a signal. Transparent otherwise."""

    def __init__(self, env: gym.Env, at: int | None = None, fault: str = "raise"):
        super().__init__(env)
        self.at, self.fault, self.total = at, fault, 0

    def step(self, action):
        self.total += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.fault == "nan-always" or (self.total == self.at and self.fault == "nan"):
            reward = math.nan
        elif self.total == self.at and self.fault == "raise":
            raise RuntimeError("sensor failure")
        elif self.total == self.at and self.fault == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        return obs, reward, terminated, truncated, info


def cartpole(at=None, fault="raise"):
    """CartPole as text; invalid replies take the default action, so every reply steps it."""
    return TextEnvWrapper(
        Injector(gym.make("CartPole-v1"), at, fault),
        action_names=["left", "right"],
        on_invalid="default_action",
        default_action=0,
        invalid_penalty=0.25,  # rewards of 0.75 and 1.0: advantages that differ, gradients
    )


def make_trainer(tiny_dir, run, envs, max_nonfinite_updates=3, **overrides):
    values = dict(
        num_steps=2,
        max_new_tokens=4,
        minibatch_size=4,
        micro_batch_size=4,
        save_every=1000,
        progress=False,
        seed=1,
    )
    values.update(overrides)
    torch.manual_seed(0)  # the LoRA initialisation draws from torch's global RNG
    policy = PPOPolicy.from_pretrained(tiny_dir, config=PPOConfig(**values))
    return PPOTrainer(policy, envs, output_dir=run, max_nonfinite_updates=max_nonfinite_updates)


def weights(trainer):
    return [p.detach().clone() for g in trainer.optimizer.param_groups for p in g["params"]]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def stop_at(update):
    return lambda metrics: False if metrics["train/update"] >= update else None


def assert_resumable(tiny_dir, run, envs):
    """The latest checkpoint loads as a policy and resumes a trainer at its step."""
    checkpoint = latest_checkpoint(run)
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    PPOPolicy.load(checkpoint, trust_code=True)  # its env record names this test's wrapper
    resumed = make_trainer(tiny_dir, None, envs)
    TrainingRun(resumed).resume(run)
    assert resumed.update_step == state["update_step"]
    return state["update_step"]


# --- an env raises ------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::UserWarning")  # AsyncVectorEnv logs the worker's error
@pytest.mark.parametrize("vectorization", ["single", "sync", "async"])
@pytest.mark.slow
def test_env_fault_stops_training_naming_the_env_after_a_checkpoint(
    tiny_dir, tmp_path, vectorization
):
    if vectorization == "single":
        envs, index = cartpole(at=9), 0
    else:
        vector = gym.vector.SyncVectorEnv if vectorization == "sync" else gym.vector.AsyncVectorEnv
        envs, index = vector([cartpole, lambda: cartpole(at=9), cartpole]), 1
    trainer = make_trainer(tiny_dir, tmp_path, envs)
    with pytest.raises(EnvFault) as caught:
        trainer.train(MANY)
    fault = caught.value
    assert re.fullmatch(
        rf"env {index} raised RuntimeError during step (\d+) of its episode (\d+): sensor failure",
        str(fault),
    )
    assert fault.index == index and fault.episode >= 1 and fault.step >= 1
    done = trainer.update_step
    assert done >= 3  # 2 steps per env per update: the 9th step comes in update 5 at the latest
    path = tmp_path / "checkpoints" / f"step_{done:08d}"
    assert fault.__notes__ == [
        f"Training failed after update {done}; checkpoint {path} (resume_from it)"
    ]
    assert latest_checkpoint(tmp_path) == path
    assert len(read_metrics(tmp_path)) == done  # the unfinished rollout is all that is lost
    assert assert_resumable(tiny_dir, tmp_path, cartpole()) == done


def test_env_fault_during_the_first_rollout_still_checkpoints(tiny_dir, tmp_path):
    trainer = make_trainer(tiny_dir, tmp_path, gym.vector.SyncVectorEnv([lambda: cartpole(at=1)]))
    with pytest.raises(EnvFault, match="^env 0 raised RuntimeError during step 1 of its episode 1"):
        trainer.train(MANY)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000000"]
    assert assert_resumable(tiny_dir, tmp_path, cartpole()) == 0


# --- non-finite losses and gradients --------------------------------------------------------------


def test_a_nan_reward_skips_that_update_and_training_goes_on(tiny_dir, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    envs = gym.vector.SyncVectorEnv([cartpole, lambda: cartpole(at=5, fault="nan")])
    trainer = make_trainer(tiny_dir, tmp_path, envs)
    history = []
    trainer.train(MANY, callback=lambda m: (history.append(weights(trainer)), stop_at(6)(m))[1])
    lines = read_metrics(tmp_path)
    skipped = [line["train/nonfinite_steps"] for line in lines]
    bad = next(i for i, n in enumerate(skipped) if n)  # the update whose batch holds the NaN
    assert skipped[bad] == 2  # every step of it: one minibatch (<= 4 turns) x 2 epochs
    assert all(n == 0 for n in skipped[bad + 1 :]) and len(lines) == 6
    assert [line["train/nonfinite_total"] for line in lines][-1] == skipped[bad]
    assert lines[bad]["env/reward_mean"] is None  # NaN is logged as null
    assert same(history[bad], history[bad - 1])  # the NaN update changed nothing
    assert not same(history[-1], history[bad])  # later ones trained
    assert all(torch.isfinite(w).all() for w in history[-1])
    assert (
        "non-finite loss (nan) or gradient norm (nan); skipping this optimizer step" in caplog.text
    )


@pytest.mark.parametrize("limit", [1, 3])
def test_repeated_nonfinite_updates_stop_the_run_with_a_checkpoint(tiny_dir, tmp_path, limit):
    envs = gym.vector.SyncVectorEnv([lambda: cartpole(fault="nan-always")] * 2)
    trainer = make_trainer(tiny_dir, tmp_path, envs, max_nonfinite_updates=limit)
    before = weights(trainer)
    with pytest.raises(NonFiniteUpdateError) as caught:
        trainer.train(MANY)
    steps = 2 * limit  # 4 turns per update, minibatches of 4, 2 epochs
    assert str(caught.value).startswith(
        f"Updates 1-{limit} each had a non-finite loss or gradient ({limit} in a row, "
        f"max_nonfinite_updates={limit}; {steps} optimizer steps skipped in all), so training "
        "stopped. Look for NaN/inf rewards"
    )
    assert [p.name for p in list_checkpoints(tmp_path)] == [f"step_{limit:08d}"]
    assert [line["train/nonfinite_steps"] for line in read_metrics(tmp_path)] == [2] * limit
    assert same(weights(trainer), before) and trainer.optimizer.state_dict()["state"] == {}
    state = json.loads((latest_checkpoint(tmp_path) / "trainer_state.json").read_text())
    assert (state["nonfinite_streak"], state["nonfinite_total"]) == (limit, steps)


def test_non_finite_weights_are_skipped_not_stepped(tiny_dir, tmp_path):
    trainer = make_trainer(tiny_dir, None, gym.make_vec("textgym/Blackjack-v1", num_envs=2))
    with torch.no_grad():
        trainer.policy.value_head.summary.bias.fill_(
            math.inf
        )  # every value, and so the loss, is inf
    before = weights(trainer)
    metrics = trainer.update(trainer.collect())
    assert metrics["train/nonfinite_steps"] == 2 and trainer.nonfinite_streak == 1
    assert same(weights(trainer), before)


def test_max_nonfinite_updates_is_validated(tiny_dir):
    with pytest.raises(ValueError, match="^max_nonfinite_updates must be an int >= 1, got 0$"):
        make_trainer(tiny_dir, None, None, max_nonfinite_updates=0)


# --- SIGTERM and Ctrl-C -------------------------------------------------------------------------


@pytest.mark.parametrize("moment", ["rollout", "scoring"])
@pytest.mark.slow
def test_sigterm_before_the_weights_change_checkpoints_and_resumes_exactly(
    tiny_dir, tmp_path, moment
):
    """N updates straight == SIGTERM in update 3 (its rollout, or its scoring), resume to N."""
    straight = make_trainer(
        tiny_dir, tmp_path / "straight", gym.vector.SyncVectorEnv([cartpole] * 2)
    )
    initial = weights(straight)
    straight.train(MANY, callback=stop_at(4))
    assert not same(weights(straight), initial)

    if moment == "rollout":  # the second env's 5th step: update 3's rollout
        envs = gym.vector.SyncVectorEnv([cartpole, lambda: cartpole(at=5, fault="sigterm")])
        interrupted = make_trainer(tiny_dir, tmp_path / "run", envs)
    else:  # after scoring, which drew the minibatch order from the trainer's RNG
        interrupted = make_trainer(
            tiny_dir, tmp_path / "run", gym.vector.SyncVectorEnv([cartpole] * 2)
        )
        score = interrupted.score

        def score_then_terminate(*args, **kwargs):
            score(*args, **kwargs)
            if interrupted.update_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

        interrupted.score = score_then_terminate
    with pytest.raises(SIGTERMExit) as caught:
        interrupted.train(MANY)
    assert caught.value.code == 143
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
    done = interrupted.update_step
    assert done == 2 and len(read_metrics(tmp_path / "run")) == done
    assert latest_checkpoint(tmp_path / "run").name == f"step_{done:08d}"

    resumed = make_trainer(tiny_dir, tmp_path / "run", gym.vector.SyncVectorEnv([cartpole] * 2))
    resumed.train(MANY, resume_from=tmp_path / "run", callback=stop_at(4))
    assert same(weights(resumed), weights(straight))


def test_sigterm_during_an_update_finishes_it_then_saves(tiny_dir, tmp_path):
    trainer = make_trainer(tiny_dir, tmp_path, gym.make_vec("textgym/Blackjack-v1", num_envs=2))
    kill = lambda *a: (hook.remove(), os.kill(os.getpid(), signal.SIGTERM))  # noqa: E731
    hook = trainer.optimizer.register_step_post_hook(kill)
    with pytest.raises(SIGTERMExit):
        trainer.train(MANY)
    assert trainer.update_step == 1  # the update ran to its end before stopping
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001"]


def test_second_sigterm_stops_at_once_without_saving(tiny_dir, tmp_path):
    trainer = make_trainer(tiny_dir, tmp_path, gym.make_vec("textgym/Blackjack-v1", num_envs=2))

    def twice(*args):
        hook.remove()
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)

    hook = trainer.optimizer.register_step_post_hook(twice)
    with pytest.raises(SIGTERMExit):
        trainer.train(MANY)
    assert trainer.update_step == 0 and list_checkpoints(tmp_path) == []


CHILD = """
import sys, gymnasium as gym, textgym
from textgym_agents import PPOConfig, PPOPolicy
model, run, save_every = sys.argv[1], sys.argv[2], int(sys.argv[3])
config = PPOConfig(num_steps=2, max_new_tokens=4, minibatch_size=4, micro_batch_size=4,
                   save_every=save_every, keep_checkpoints=2, progress=False, seed=1)
policy = PPOPolicy.from_pretrained(model, config=config)
envs = gym.make_vec("textgym/Blackjack-v1", num_envs=2)
resume = run if len(sys.argv) > 4 else None
policy.learn(envs, 10**6, output_dir=run, resume_from=resume)
"""


def start_child(tmp_path, tiny_dir, save_every, resume=False):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    args = [sys.executable, str(script), tiny_dir, str(tmp_path / "run"), str(save_every)]
    return subprocess.Popen(
        args + (["resume"] if resume else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        # A shell's background jobs ignore SIGINT; Python then never installs its handler.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def wait_for_updates(tmp_path, child, count):
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and metrics.read_text().count("\n") >= count):
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_from_outside_exits_cleanly_with_a_checkpoint(tiny_dir, tmp_path, signum):
    child = start_child(tmp_path, tiny_dir, save_every=1000)
    wait_for_updates(tmp_path, child, 1)
    time.sleep(random.Random(signum).uniform(0.0, 0.5))  # somewhere in a rollout or an update
    child.send_signal(signum)
    _, stderr = child.communicate(timeout=120)
    if signum == signal.SIGTERM:
        assert child.returncode == 143 and "Traceback" not in stderr, stderr
    else:  # an uncaught KeyboardInterrupt: Python's usual exit
        assert child.returncode in (-signal.SIGINT, 1) and "KeyboardInterrupt" in stderr
    assert "Training interrupted after update" in stderr
    done = assert_resumable(tiny_dir, tmp_path / "run", gym.make_vec("textgym/Blackjack-v1", 2))
    assert done == len(read_metrics(tmp_path / "run")) >= 1


# --- SIGKILL at any moment ------------------------------------------------------------------------


@pytest.mark.slow
def test_sigkill_at_any_moment_leaves_a_resumable_checkpoint(tiny_dir, tmp_path):
    """Kill -9 a run that checkpoints every update, at random moments; resume each time."""
    rng = random.Random(0)
    last = -1
    for attempt in range(4):
        child = start_child(tmp_path, tiny_dir, save_every=1, resume=attempt > 0)
        wait_for_updates(tmp_path, child, last + 2)  # one more update than last time
        time.sleep(rng.uniform(0.0, 1.0))
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
        child.communicate()
        done = assert_resumable(tiny_dir, tmp_path / "run", gym.make_vec("textgym/Blackjack-v1", 2))
        assert done > last
        last = done
        steps = [line["step"] for line in read_metrics(tmp_path / "run")]
        assert steps[:done] == list(range(1, done + 1))  # at most a partial last line more
