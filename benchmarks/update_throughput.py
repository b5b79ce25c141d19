"""Executed FLOP/s of each phase of one default training update, as a share of the matmul peak.

Trains the embedded model on textgym/Blackjack-v1 with the settings `textgym train` picks
(choice decoding), and counts what really runs: forward hooks on the decoder and the LM head
record every token that passes through them (padding included, the shared system prompt once
per pass, as executed). FLOPs counted (matmuls only; attention scores are left out, which
undercounts slightly):

- forward: 2 x (decoder linear parameters, LoRA included) per decoder token, plus
  2 x (LM head parameters) per LM-head row;
- backward (LoRA only): the frozen matrices need input gradients only, another 2 x P per token;
  the LoRA weight gradients are negligible (r=16) and left out.

The peak is the larger of two matmuls in the same dtype as the model, measured in the same
run: 2048 x 2048 square and (512, 576) x (576, 1536) at the model's MLP shape.

    python benchmarks/update_throughput.py [--updates 2] [--dtype auto] [--before]

Targets: optimise phase >= 50% of the same-dtype peak; whole loop >= 40%.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import gymnasium as gym
import numpy as np
import torch

import textgym  # noqa: F401
from textgym.cli_common import reply_choices
from textgym_agents import PPOConfig, PPOPolicy, PPOTrainer
from textgym_agents.model.precision import matmul_gflops
from textgym_agents.ppo.defaults import env_defaults

ENV = "textgym/Blackjack-v1"
TARGETS = {"optimise": 0.5, "loop": 0.4}


def square_gflops(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e9


class FlopCounter:
    """Counts decoder tokens and LM-head rows as they run, split by phase and by grad mode."""

    def __init__(self, policy: PPOPolicy) -> None:
        lm = policy.model.get_base_model()
        decoder, head = getattr(lm, lm.base_model_prefix), lm.get_output_embeddings()
        head_ids = {id(p) for p in head.parameters()}
        linears = [m for m in decoder.modules() if isinstance(m, torch.nn.Linear)]
        self.decoder_params = sum(m.weight.numel() for m in linears if id(m.weight) not in head_ids)
        self.head_params = head.weight.numel()
        self.phase = "rollout"
        self.flops: dict[str, float] = defaultdict(float)
        self.tokens: dict[str, int] = defaultdict(int)
        decoder.register_forward_pre_hook(self._decoder, with_kwargs=True)
        head.register_forward_pre_hook(self._head)

    def _count(self, flops: float) -> None:
        grad = torch.is_grad_enabled()
        self.flops[self.phase] += flops * (2 if grad else 1)  # backward: input gradients

    def _decoder(self, module, args, kwargs):  # noqa: ANN001
        ids = kwargs.get("input_ids", args[0] if args else None)
        tokens = int(ids.numel())
        self.tokens[self.phase] += tokens
        self._count(2 * self.decoder_params * tokens)

    def _head(self, module, args):  # noqa: ANN001
        rows = int(np.prod(args[0].shape[:-1]))
        self._count(2 * self.head_params * rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=2, help="timed updates (after a warm-up)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument(
        "--before", action="store_true", help="the loop as it was: rescoring pass, plain sdpa"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    probe = gym.make(ENV)
    before = {"reuse_rollout_scores": False, "gqa_attention": False} if args.before else {}
    config = PPOConfig(**env_defaults(reply_choices(probe), {}), **before, progress=False)
    probe.close()
    policy = PPOPolicy.from_pretrained(None, dtype=args.dtype, config=config)
    dtype = next(policy.model.parameters()).dtype
    trainer = PPOTrainer(policy, gym.make_vec(ENV, num_envs=args.num_envs))
    trainer.step()  # warm-up
    peak = max(square_gflops(dtype), matmul_gflops(dtype))  # again after the updates: the max
    counter = FlopCounter(policy)
    seconds: dict[str, float] = defaultdict(float)
    for _ in range(args.updates):
        counter.phase = "rollout"
        start = time.perf_counter()
        buffer = trainer.collect()
        seconds["rollout"] += time.perf_counter() - start
        turns = buffer.turns()
        order = trainer.rng.permutation(len(turns))
        counter.phase = "score"
        start = time.perf_counter()
        trainer.score(turns, order)
        trainer.compute_advantages(buffer)
        seconds["score"] += time.perf_counter() - start
        counter.phase = "optimise"
        start = time.perf_counter()
        trainer.optimise(turns, order)
        seconds["optimise"] += time.perf_counter() - start
        buffer.clear()
        trainer.collector.drain()
    peak = max(peak, square_gflops(dtype), matmul_gflops(dtype)) * 1e9
    name = str(dtype).removeprefix("torch.")
    threads = torch.get_num_threads()
    print(f"dtype {name}, {threads} threads, {args.updates} updates after a warm-up")
    print(f"same-dtype matmul peak {peak / 1e9:.0f} GFLOP/s (padding tokens count as executed)")
    print(f"{'phase':9} {'seconds':>8} {'tokens':>8} {'GFLOP':>8} {'GFLOP/s':>8} {'of peak':>8}")
    seconds["loop"] = sum(seconds.values())
    counter.flops["loop"] = sum(counter.flops.values())
    counter.tokens["loop"] = sum(counter.tokens.values())
    for phase in ("rollout", "score", "optimise", "loop"):
        rate = counter.flops[phase] / max(seconds[phase], 1e-9)
        target = TARGETS.get(phase)
        note = "" if target is None else f"  (target >= {target:.0%}: "
        note += "" if target is None else ("met)" if rate / peak >= target else "NOT met)")
        print(
            f"{phase:9} {seconds[phase]:8.1f} {counter.tokens[phase]:8d} "
            f"{counter.flops[phase] / 1e9:8.0f} {rate / 1e9:8.1f} {rate / peak:8.0%}{note}"
        )


if __name__ == "__main__":
    main()
