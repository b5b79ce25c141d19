"""Free-text decode speed of the embedded model, as a share of this machine's bandwidth bound.

At batch 1 a decode step reads every weight from memory once, so (weight bytes) / (read
bandwidth) bounds the steps per second; both are measured in this run, with the same threads.
A decode step is what follows the prompt's pass: every arm runs once for ``--tokens`` new
tokens and once for one, and the steps per second are the extra steps over the extra time
(the prompt's pass, tokenization and set-up cancel out; on a 42-token prompt in float32 on one
AVX2 core they took ~0.25 s, a tenth of a 32-token reply). The rate with them is printed too.
Arms, on the same prompt, greedy, the same number of new tokens:

- ``policy``: ``PPOPolicy.generate`` (the rollout path: LoRA adapter attached, the decoding
  steps in textgym's lean loop, ``PPOConfig.lean_decoding``, our cut),
- ``generate()``: the same policy with ``lean_decoding=False``: its decoding steps run through
  transformers ``generate`` and peft's adapter layers (what the rollout did before the loop),
- ``plain HF``: transformers ``generate`` on the same base weights without peft, as a
  reference for what the adapter's layers cost,
- ``matmuls``: the model's matrix products alone (every ``nn.Linear`` of the base model, the
  LM head included, one ``F.linear`` each on a ``batch x 1`` input per step, nothing else):
  what torch's CPU kernels allow before any attention, norm, Python or sampling work. A
  decode step cannot beat it, so it says whether the target is reachable with these kernels.

    python benchmarks/decode_speed.py [--tokens 32] [--batches 1 16] [--rounds 3] [--model M]
        [--dtype auto|float32|bfloat16] [--context 0]

Targets: the policy >= 50% of the bound, or, where torch's kernels cannot reach that, >= 0.8
of the matrix products' steps/s. Rounds alternate the arms, so machine noise falls on all.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from textgym_agents import PPOConfig, PPOPolicy
from textgym_agents.model.loading import embedded_model_dir

TARGET = 0.5
PRODUCTS_TARGET = 0.8
STORY = "Tell me a long story about a dragon and a knight."
CONTEXT = "The knight rode through the valley, past the river and the old mill, at dusk. "


class NoEOS(LogitsProcessor):
    """Keeps ``generate`` going for exactly ``max_new_tokens`` (EOS never wins)."""

    def __init__(self, eos: list[int]) -> None:
        self.eos = eos

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores[:, self.eos] = float("-inf")
        return scores


def read_bandwidth(gib: float = 1.0, rounds: int = 5) -> float:
    """Best-of-``rounds`` bytes/s of summing a ``gib``-GiB float32 tensor (a pure stream)."""
    data = torch.ones(int(gib * 2**30 / 4))
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the distinct parameters and buffers a forward reads (tied weights once)."""
    seen, total = set(), 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per reply")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=None, help="model name or path (default: embedded)")
    parser.add_argument("--dtype", default="auto", help="auto (this machine's choice) or a dtype")
    parser.add_argument(
        "--context",
        type=int,
        default=0,
        help="sentences of context before the request (about 17 tokens each): the calculator's "
        "prompts run to ~500 tokens, and attention's cost grows with them",
    )
    args = parser.parse_args()
    prompt = [{"role": "user", "content": CONTEXT * args.context + STORY}]
    torch.manual_seed(0)
    config = PPOConfig(max_new_tokens=args.tokens, decoding="free", reply_prefix="")
    policy = PPOPolicy.from_pretrained(args.model, config=config, dtype=args.dtype)
    unlean = PPOPolicy(
        policy.model,
        policy.tokenizer,
        config=dataclasses.replace(config, lean_decoding=False),
        value_head=policy.value_head,
        base_info=policy.base_info,
    )
    dtype = next(policy.model.parameters()).dtype
    path = args.model or embedded_model_dir()
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    eos = sorted(policy.eos_ids)
    processors = LogitsProcessorList([NoEOS(eos)])
    pad = policy.tokenizer.pad_token_id

    def timed(which: PPOPolicy) -> Callable[[int, int], tuple[float, int]]:
        def run(batch: int, tokens: int) -> tuple[float, int]:
            start = time.perf_counter()
            generation = which.generate([prompt] * batch, greedy=True, max_new_tokens=tokens)
            seconds = time.perf_counter() - start
            return seconds, max(len(r) for r in generation.response_ids)  # steps actually run

        return run

    def reference(batch: int, tokens: int) -> tuple[float, int]:
        ids = torch.tensor([policy.encode(prompt)] * batch)
        start = time.perf_counter()
        with torch.no_grad():
            output = plain.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=tokens,
                do_sample=False,
                top_k=None,
                logits_processor=processors,
                pad_token_id=pad,
                eos_token_id=eos,
            )
        return time.perf_counter() - start, output.shape[1] - ids.shape[1]

    linears = [m.weight for m in plain.modules() if isinstance(m, torch.nn.Linear)]

    @torch.no_grad()
    def matmuls(batch: int, tokens: int) -> tuple[float, int]:
        inputs = {w.shape[1]: torch.randn(batch, 1, w.shape[1], dtype=dtype) for w in linears}
        start = time.perf_counter()
        for _ in range(tokens):
            for weight in linears:
                F.linear(inputs[weight.shape[1]], weight)
        return time.perf_counter() - start, tokens

    bandwidth = read_bandwidth()
    size = weight_bytes(plain)
    bound = bandwidth / size
    print(
        f"{dtype}, {torch.get_num_threads()} threads; read bandwidth {bandwidth / 1e9:.1f} GB/s, "
        f"weights {size / 1e9:.3f} GB: bound {bound:.1f} decode steps/s at batch 1"
    )
    print(f"prompt: {len(policy.encode(prompt))} tokens")
    arms = {
        "policy": timed(policy),
        "generate()": timed(unlean),
        "plain HF": reference,
        "matmuls": matmuls,
    }
    for batch in args.batches:
        for arm in arms.values():
            arm(batch, args.tokens)  # warm-up
        runs: dict[str, dict[int, list[tuple[float, int]]]] = {name: {} for name in arms}
        for _ in range(args.rounds):
            for name, arm in arms.items():
                for tokens in (args.tokens, 1):
                    runs[name].setdefault(tokens, []).append(arm(batch, tokens))
        rates = {name: decode_rate(runs[name], args.tokens) for name in arms}
        print(f"batch {batch}, {args.tokens} new tokens, median of {args.rounds}:")
        for name, (rate, steps, whole) in rates.items():
            print(
                f"  {name:10s} {rate:6.1f} steps/s = {rate * batch:7.1f} tokens/s "
                f"({steps} steps), {rate / bound:5.1%} of the batch-1 bound; "
                f"{whole:5.1f} steps/s with the prompt's pass"
            )
        share = rates["policy"][0] / bound
        verdict = "met" if share >= TARGET else "MISSED"
        target = f"target >= {TARGET:.0%}: {verdict}"
        print(f"  policy at batch {batch}: {share:.1%} of the bound ({target})")
        floor = rates["policy"][0] / rates["matmuls"][0]
        verdict = "met" if floor >= PRODUCTS_TARGET else "MISSED"
        print(
            f"  policy / matrix products alone: {floor:.2f} "
            f"(target >= {PRODUCTS_TARGET}: {verdict})"
        )


def decode_rate(runs: dict[int, list[tuple[float, int]]], tokens: int) -> tuple[float, int, float]:
    """An arm's decode steps/s: the extra steps over the extra time, long runs against short.

    Returns that rate (from the medians of the runs of ``tokens`` new tokens and of one), the
    steps of a long run, and a long run's steps/s with its prompt's pass and set-up.
    """
    seconds = {n: statistics.median(t for t, _ in runs[n]) for n in runs}
    steps = {n: max(s for _, s in runs[n]) for n in runs}
    extra = seconds[tokens] - seconds[1]
    rate = (steps[tokens] - steps[1]) / extra if extra > 0 else float("nan")
    return rate, steps[tokens], steps[tokens] / seconds[tokens]


if __name__ == "__main__":
    main()
