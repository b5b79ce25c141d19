"""PPO under ``accelerate launch`` with 2 CPU processes (gloo): a real launch, a tiny model.

One launch runs the worker below, which trains three ways and writes what each process saw
to ``rank{R}.json``; the tests read those files and the run directories. Another launch is
stopped with SIGINT, as Ctrl-C stops it.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from textgym_agents.distributed.collectives import Distributed
from textgym_agents.runfiles.checkpoint import latest_checkpoint, list_checkpoints
from textgym_agents.tracking.metrics_log import read_metrics

WORKER = textwrap.dedent(
    """
    import hashlib, json, random, sys, time
    from pathlib import Path

    import gymnasium as gym
    import torch

    import textgym  # noqa: F401  (registers the envs)
    from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer, RolloutBuffer, Turn
    from textgym_agents.distributed.collectives import Distributed, current

    tiny, out = sys.argv[1], Path(sys.argv[2])
    process = current()
    rank = process.rank
    result = {"rank": rank, "world_size": process.world_size, "device": str(process.device)}
    QUICK = dict(num_steps=2, max_new_tokens=4, minibatch_size=4, micro_batch_size=2)


    def digest(tensors):
        return hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in tensors)).hexdigest()


    def weights(policy):
        lora, head = policy.trainable_parameters()
        return [*lora, *head]


    def build(shift, **config):
        # float32 whatever "auto" picks here: the gradients are compared to float32 rounding.
        config = PPOConfig(progress=False, **config)
        policy = PPOPolicy.from_pretrained(tiny, dtype="float32", config=config)
        with torch.no_grad():  # processes that start apart: the trainer must align them
            for weight in weights(policy):
                weight.add_(shift)
        return policy


    # --- 1. one update on hand-made turns: the all-reduced gradient is the global batch's ---
    def turns(seed, streams):
        rng, buffer = random.Random(seed), RolloutBuffer()
        for stream, length in enumerate(streams):
            for k in range(length):
                prompt = [rng.randrange(10, 2000) for _ in range(rng.randrange(3, 9))]
                reply = [rng.randrange(10, 2000) for _ in range(rng.randrange(1, 5))]
                reward = rng.uniform(-1, 1)
                buffer.add(stream, Turn(prompt, reply, reward, terminated=k == length - 1))
        return buffer


    STREAMS = {0: (3,), 1: (2, 4)}  # process 0: 3 turns, process 1: 6 (more micro-batches)
    exact = dict(num_epochs=1, minibatch_size=64, micro_batch_size=2, max_grad_norm=1e9)
    exact.update(kl_coef=0.05, seed=1)


    def step_gradients(trainer, buffer):
        params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
        seen = []
        hook = trainer.optimizer.register_step_pre_hook(
            lambda *_: seen.append([p.grad.clone() for p in params])
        )
        metrics = trainer.update(buffer)
        hook.remove()
        return seen, metrics


    spread = PPOTrainer(build(0.01 * rank, **exact))  # process 0's weights must win
    reference, alone = PPOTrainer(build(0, **exact)), PPOTrainer(build(0, **exact))
    reference.process = alone.process = Distributed()  # these two train without the other
    result["start"] = digest(weights(spread.policy)) == digest(weights(reference.policy))
    union = RolloutBuffer()  # process 0's streams, then process 1's, as the gather orders them
    for owner in (0, 1):
        for stream in turns(owner, STREAMS[owner]).streams.values():
            union.streams[len(union.streams)] = stream
    local = turns(rank, STREAMS[rank])
    result["local_turns"] = len(local)
    ours, ours_metrics = step_gradients(spread, local)
    theirs, their_metrics = step_gradients(reference, union)
    own, _ = step_gradients(alone, turns(rank, STREAMS[rank]))  # this process's turns only


    def error(grads, truth):  # the largest relative error of a parameter's gradient
        return max(float((a - b).norm() / b.norm()) for a, b in zip(grads, truth) if b.norm())


    result["gradient_steps"] = [len(ours), len(theirs)]
    result["gradient_error"] = error(ours[0], theirs[0])
    result["gradient_error_alone"] = error(own[0], theirs[0])
    keys = ["env/turns", "loss/policy", "loss/value", "policy/approx_kl", "value/mean"]
    result["gradient_metrics"] = [[ours_metrics[k], their_metrics[k]] for k in keys]
    # Uneven minibatch counts (process 0: 1 minibatch of 3 turns, process 1: 2 of 6).
    spread.config.minibatch_size = 4
    spread.update(turns(rank + 10, STREAMS[rank]))
    result["uneven"] = digest(weights(spread.policy))

    # --- 2. learn(): global batch, episodes and checkpoint ---
    started = time.perf_counter()
    records = []
    original_update = PPOTrainer.update


    def update(self, buffer, episodes=None):
        local = buffer.turns()
        ids = [t.prompt_ids + [-1] + t.response_ids for t in local]
        seen = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
        records.append({"turns": len(local), "episodes": len(episodes or []), "data": seen})
        return original_update(self, buffer, episodes)


    PPOTrainer.update = update
    policy = build(0.01 * rank, seed=3, save_every=0, **QUICK)
    result["initial"] = digest(weights(policy))


    def callback(metrics):
        records[-1]["weights"] = digest(weights(policy))
        records[-1]["global_turns"] = metrics["env/turns"]
        records[-1]["global_episodes"] = metrics["env/episodes"]


    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=2)
    policy.learn(envs, total_episodes=10, output_dir=out / "run", callback=callback)
    PPOTrainer.update = original_update
    result["updates"] = records
    result["learn_s"] = time.perf_counter() - started

    # --- 3. N updates straight == N/2, resume, N/2 (on both processes) ---
    started = time.perf_counter()


    def train(run, stop, resume=False, **extra):
        settings = dict(seed=4, decoding="choices", kl_coef=0.05, save_every=1, **QUICK)
        policy = build(0, **{**settings, **extra})
        policy.learn(
            gym.make_vec("textgym/Blackjack-v1", num_envs=2),
            total_episodes=10**6,
            output_dir=out / run,
            resume_from=out / run if resume else None,
            callback=lambda m: False if m["train/update"] >= stop else None,
        )
        return digest(weights(policy))


    result["straight"] = train("straight", 4)
    train("resumed", 2)
    result["resumed"] = train("resumed", 4, resume=True)
    result["resume_s"] = time.perf_counter() - started

    # --- 4. seed-shared groups (GRPO, G = 2, 2 envs per process: one group each) ---
    starts = []


    def group_update(self, buffer, episodes=None):
        for turns in buffer.episodes():  # the first prompt of each member of each group
            prompt = json.dumps(turns[0].prompt_ids).encode()
            starts.append([turns[0].group, hashlib.sha256(prompt).hexdigest()])
        return original_update(self, buffer, episodes)


    GROUPS = dict(advantage_estimator="grpo", group_size=2)
    PPOTrainer.update = group_update
    result["groups_straight"] = train("g-straight", 3, **GROUPS)
    PPOTrainer.update = original_update
    result["group_starts"] = starts
    train("g-resumed", 2, **GROUPS)
    result["groups_resumed"] = train("g-resumed", 3, resume=True, **GROUPS)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    """
)

# `--cpu --num_processes 2` would start one process: accelerate's --cpu launcher spawns several
# only through MPI. The torchrun-based launcher (--multi_gpu) with ACCELERATE_USE_CPU starts 2
# CPU processes in a gloo group.
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes"]
LAUNCH += ["2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
LAUNCH += ["--main_process_port", "0"]


def launch_env(tmp_path):
    # CPU processes and gloo, whatever GPUs the machine has; no user accelerate config.
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "true",
        "CUDA_VISIBLE_DEVICES": "",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
    }


def worker_errors(output):
    """What the workers wrote, without the launcher's log lines (``W1130 06:47:18 ...``)."""
    lines = [line for line in output.splitlines() if not re.match(r"[WIE]\d{4} ", line)]
    return "\n".join(lines)[-6000:]


@pytest.fixture(scope="module")
def launched(tiny_dir, tmp_path_factory):
    """Both processes' reports and the output directory of one 2-process launch."""
    out = tmp_path_factory.mktemp("distributed")
    script = out / "worker.py"
    script.write_text(WORKER)
    started = time.perf_counter()
    result = subprocess.run(
        [*LAUNCH, str(script), tiny_dir, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=launch_env(out),
    )
    assert result.returncode == 0, worker_errors(result.stderr)
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    reports[0]["launch_s"] = time.perf_counter() - started
    return reports, out


@pytest.mark.slow
def test_two_processes_join_one_gloo_group(launched):
    reports, _ = launched
    assert [r["rank"] for r in reports] == [0, 1]
    assert all(r["world_size"] == 2 and r["device"] == "cpu" for r in reports)


@pytest.mark.slow
def test_gradients_are_those_of_the_global_batch(launched):
    reports, _ = launched
    for report in reports:
        assert report["start"]  # process 1's own starting weights were replaced by process 0's
        assert report["gradient_steps"] == [1, 1]
        # equal up to float32 summation order, unlike the gradient of a process's own turns
        assert report["gradient_error"] < 1e-4 < 0.01 < report["gradient_error_alone"]
        for ours, theirs in report["gradient_metrics"]:
            assert ours == pytest.approx(theirs, rel=1e-4, abs=1e-6)
    assert [r["local_turns"] for r in reports] == [3, 6]
    assert reports[0]["gradient_metrics"][0] == [9, 9]  # env/turns counts both processes
    # 1 vs 2 minibatches: process 0 joined the second optimizer step with zero gradients
    assert reports[0]["uneven"] == reports[1]["uneven"]


@pytest.mark.slow
def test_processes_hold_identical_parameters_after_each_update(launched):
    reports, _ = launched
    first, second = (r["updates"] for r in reports)
    assert len(first) == len(second) >= 2
    assert reports[0]["initial"] != reports[1]["initial"]  # process 1 started elsewhere
    for ours, theirs in zip(first, second, strict=True):
        assert ours["weights"] == theirs["weights"]
    assert first[-1]["weights"] != reports[0]["initial"]  # and they did train


@pytest.mark.slow
def test_global_batch_is_the_sum_of_the_local_batches(launched):
    reports, out = launched
    first, second = (r["updates"] for r in reports)
    total_turns = total_episodes = 0
    for ours, theirs in zip(first, second, strict=True):
        assert ours["data"] != theirs["data"]  # each process plays its own episodes
        total_turns += ours["turns"] + theirs["turns"]
        total_episodes += ours["episodes"] + theirs["episodes"]
        assert ours["global_turns"] == theirs["global_turns"] == total_turns
        assert ours["global_episodes"] == theirs["global_episodes"] == total_episodes
    lines = read_metrics(out / "run")
    assert [line["env/turns"] for line in lines] == [u["global_turns"] for u in first]
    assert lines[-1]["env/episodes"] >= 10 > lines[-2]["env/episodes"]  # global episodes


@pytest.mark.slow
def test_only_the_main_process_writes_the_run(launched):
    reports, out = launched
    run = out / "run"
    assert len(read_metrics(run)) == len(reports[0]["updates"])  # one line per update
    checkpoints = list_checkpoints(run)
    assert [c.name for c in checkpoints] == [f"step_{len(reports[0]['updates']):08d}"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [checkpoints[0].name]
    files = {p.name for p in checkpoints[0].iterdir()}
    assert {"rng_rank1.safetensors", "rank1.json", "envs.json", "adapter"} <= files
    assert json.loads((checkpoints[0] / "trainer_state.json").read_text())["world_size"] == 2
    assert (run / "final" / "policy.json").is_file()
    assert (run / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_resume_on_both_processes_reproduces_the_run_exactly(launched):
    reports, out = launched
    assert reports[0]["straight"] == reports[1]["straight"]
    assert reports[0]["resumed"] == reports[1]["resumed"] == reports[0]["straight"]

    def timeless(run):
        lines = read_metrics(out / run)
        return [{k: v for k, v in line.items() if not k.startswith(TIMING)} for line in lines]

    assert timeless("resumed") == timeless("straight")
    assert len(timeless("straight")) == 4


TIMING = ("time", "throughput/")


@pytest.mark.slow
def test_groups_stay_on_one_process_and_resume_exactly(launched):
    """Each process plays its own groups: members share a start; processes' starts differ."""
    reports, _ = launched
    per_process = []
    for report in reports:
        by_group: dict[int, set[str]] = {}
        for group, start in report["group_starts"]:
            by_group.setdefault(group, set()).add(start)
        assert len(by_group) >= 3 and all(len(s) == 1 for s in by_group.values())
        per_process.append({next(iter(s)) for s in by_group.values()})
    assert per_process[0] != per_process[1]  # other seeds on the other process
    assert reports[0]["groups_straight"] == reports[1]["groups_straight"]  # one model
    assert reports[0]["groups_resumed"] == reports[0]["groups_straight"]


def test_single_process_needs_no_collectives():
    single = Distributed()
    rows = torch.arange(6.0).reshape(3, 2)
    gathered, start = single.gather(rows)
    assert gathered is rows and start == 0
    assert single.stop_check(stop=True) is True and single.stop_check() is False
    assert single.gather_bytes(b"abc") == [b"abc"] and single.broadcast_text("x") == "x"
    with pytest.raises(ValueError, match="Expected 0 <= rank < world_size, got 2 and 2"):
        Distributed(world_size=2, rank=2)


SIGNAL_WORKER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import gymnasium as gym

    import textgym  # noqa: F401
    from textgym_agents import PPOConfig, PPOPolicy

    tiny, out = sys.argv[1], Path(sys.argv[2])
    config = PPOConfig(
        num_steps=2, max_new_tokens=4, minibatch_size=4, micro_batch_size=2, progress=False
    )
    policy = PPOPolicy.from_pretrained(tiny, config=config)
    envs = gym.make_vec("textgym/Blackjack-v1", num_envs=2)
    policy.learn(envs, total_episodes=10**6, output_dir=out / "run")
    """
)


@pytest.mark.slow
def test_ctrl_c_stops_every_process_after_one_checkpoint(tiny_dir, tmp_path):
    """SIGINT to the launcher reaches each worker once; they stop together, nothing hangs."""
    script = tmp_path / "worker.py"
    script.write_text(SIGNAL_WORKER)
    launcher = subprocess.Popen(
        [*LAUNCH, str(script), tiny_dir, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=launch_env(tmp_path),
        # A shell's background jobs ignore SIGINT, and children inherit that: undo it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    try:
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            running = launcher.poll() is None and time.monotonic() < deadline
            assert running, worker_errors(launcher.stdout.read())
            time.sleep(0.2)
        launcher.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal does
        output, _ = launcher.communicate(timeout=60)  # it SIGKILLs the workers after 30 s
    finally:
        if launcher.poll() is None:  # SIGTERM: the launcher then stops its workers too
            launcher.terminate()
            launcher.wait(60)
    assert "SIGKILL" not in output and "forcefully" not in output, worker_errors(output)
    for rank in (0, 1):  # each worker raised it (torch prefixes their tracebacks)
        assert f"[rank{rank}]: KeyboardInterrupt" in output, worker_errors(output)
    updates = len(read_metrics(tmp_path / "run"))
    checkpoint = latest_checkpoint(tmp_path / "run")
    assert checkpoint is not None and checkpoint.name == f"step_{updates:08d}"
    assert (checkpoint / "rank1.json").is_file()  # process 1's state came along


@pytest.mark.slow
def test_cli_train_under_accelerate_launch(tiny_dir, tmp_path):
    args = ["-m", "textgym.cli", "train", "--model", tiny_dir, "--episodes", "8"]
    args += ["--eval-episodes", "2", "--num-envs", "2", "--num-steps", "2"]
    args += ["--minibatch-size", "8", "--no-progress", "--output", "run"]
    result = subprocess.run(
        [*LAUNCH, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=launch_env(tmp_path),
    )
    assert result.returncode == 0, worker_errors(result.stderr)
    assert result.stdout.count("Run directory: run") == 1  # only the main process prints
    assert result.stdout.count("Greedy evaluation") == 1
    assert len(list_checkpoints(tmp_path / "run")) == 1
    assert (tmp_path / "run" / "final").is_dir()
