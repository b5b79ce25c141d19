"""Rollout turns/s of the embedded model: batched vs one env at a time, or HF vs a vLLM server.

Both sides generate replies to the same Blackjack prompts with the same model and greedy
decoding (so they produce the same tokens); rounds alternate between the two to share machine
noise.

    python benchmarks/rollout_throughput.py [--envs 16] [--rounds 3] [--max-new-tokens 24]
    python benchmarks/rollout_throughput.py --engine vllm [--vllm-url URL] [--lora-scale 0.02]
        [--decoding free|constrained]

Default: one batched HF call vs one call per prompt; target: batched >= 8x.
``--engine vllm``: one batched HF call vs one batched request to a vLLM server (started from
``.venv-vllm`` / ``$TEXTGYM_VLLM_PYTHON`` unless ``--vllm-url`` is given), both with the
policy's LoRA adapter (its B weights set to noise of ``--lora-scale``, so it changes replies;
0 keeps the freshly initialised adapter, equal to the base model). No target: the
ratio is what this machine gives; the same script is what a GPU run uses.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import torch

import textgym
from textgym_agents import PPOConfig, PPOPolicy

TARGET = 8.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--model", default=None, help="model name or path (default: embedded)")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--vllm-url", default=None, help="a running vLLM server (else start one)")
    parser.add_argument("--lora-scale", type=float, default=0.02)
    parser.add_argument(
        "--decoding",
        choices=["free", "constrained"],
        default="free",
        help="--engine vllm: free text, or replies under Blackjack's JSON schema",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    config = PPOConfig(
        max_new_tokens=args.max_new_tokens, vllm_url=args.vllm_url, decoding=args.decoding
    )
    dtype = "float32" if args.engine == "vllm" else None  # the server serves the fp32 copy
    policy = PPOPolicy.from_pretrained(args.model, dtype=dtype, config=config)
    env = gym.make("textgym/Blackjack-v1")
    prompts = [env.reset(seed=seed)[0] for seed in range(args.envs)]
    if args.engine == "vllm":
        compare_vllm(policy, prompts, args)
    else:
        compare_batching(policy, prompts, args)


def compare_batching(policy: PPOPolicy, prompts: list, args: argparse.Namespace) -> None:
    policy.generate(prompts[:2], greedy=True)  # warm-up
    batched, single = [], []
    for _ in range(args.rounds):
        start = time.perf_counter()
        together = policy.generate(prompts, greedy=True)
        batched.append(time.perf_counter() - start)
        start = time.perf_counter()
        alone = [policy.generate([p], greedy=True) for p in prompts]
        single.append(time.perf_counter() - start)
    same = sum(a.response_ids[0] == b for a, b in zip(alone, together.response_ids, strict=True))
    tokens = sum(len(r) for r in together.response_ids)
    batched_rate = args.envs / statistics.median(batched)
    single_rate = args.envs / statistics.median(single)
    ratio = batched_rate / single_rate
    print(f"{args.envs} Blackjack prompts, {tokens} reply tokens, greedy, median of {args.rounds}")
    print(f"one env at a time: {single_rate:6.2f} turns/s")
    print(f"batched ({args.envs} envs): {batched_rate:6.2f} turns/s")
    verdict = "met" if ratio >= TARGET else "MISSED"
    print(f"speed-up: {ratio:.1f}x (target >= {TARGET:g}x: {verdict})")
    print(f"identical replies: {same}/{args.envs}")


def compare_vllm(policy: PPOPolicy, prompts: list, args: argparse.Namespace) -> None:
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name and args.lora_scale:
                parameter.normal_(0.0, args.lora_scale)
    start = time.perf_counter()
    engine = policy.rollout_engine()  # connects, or starts a server and waits for it
    print(f"vLLM {engine.version} ready in {time.perf_counter() - start:.1f} s")
    schema = textgym.reply_schemas(gym.make("textgym/Blackjack-v1"))
    schemas = [schema] * len(prompts) if args.decoding == "constrained" else None

    def run(name: str) -> tuple[float, list[list[int]]]:
        policy.config.rollout_engine = name
        start = time.perf_counter()
        generation = policy.generate(prompts, greedy=True, schemas=schemas)
        return time.perf_counter() - start, generation.response_ids

    try:
        run("hf")
        run("vllm")  # warm-up: loads the adapter
        timings: dict[str, list[float]] = {"hf": [], "vllm": []}
        replies = {}
        for _ in range(args.rounds):
            for name in ("hf", "vllm"):
                seconds, replies[name] = run(name)
                timings[name].append(seconds)
    finally:
        policy.close_rollout_engine()
    same = sum(a == b for a, b in zip(replies["hf"], replies["vllm"], strict=True))
    tokens = sum(len(r) for r in replies["hf"])
    print(
        f"{args.envs} Blackjack prompts, {tokens} reply tokens, greedy, {args.decoding} decoding, "
        "LoRA adapter, median of"
    )
    print(f"{args.rounds} rounds (one batched call each; HF in this process, vLLM over HTTP)")
    rates = {name: args.envs / statistics.median(times) for name, times in timings.items()}
    print(f"HF generate: {rates['hf']:6.2f} turns/s")
    print(f"vLLM server: {rates['vllm']:6.2f} turns/s")
    print(f"vLLM / HF: {rates['vllm'] / rates['hf']:.2f}x")
    print(f"identical replies: {same}/{args.envs}")


if __name__ == "__main__":
    main()
