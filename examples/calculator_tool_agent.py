"""Tool use with LoRA PPO: train the embedded SmolLM2 on textgym/Calculator-v0, save, reload.

    python examples/calculator_tool_agent.py [--episodes 64] [--out runs/calculator]

The model must call ``calculator(<expr>)``, read the observation, then answer. The script plays
a few questions, trains a LoRA adapter by PPO (metrics, checkpoints, learning curve and the final
policy go to --out), reloads the saved adapter with ``peft.PeftModel.from_pretrained`` on a
freshly loaded base model and plays the same questions with plain ``transformers`` (greedy
``generate``). Offline; 313 s in one run on one CPU core (OMP_NUM_THREADS=1; AVX-512 BF16,
bf16). On a CPU shared with other jobs, set ``OMP_NUM_THREADS=1``: OpenMP threads fighting for
the cores can make it several times slower.
Prompted with a worked episode and JSON instructions, the base model already calls the tool and
answers from the observation on most questions; PPO (64 episodes, about 7 updates) raises the
share it solves. Output (trimmed; numbers vary):

    before training:
      Q: What is 521 + 601?
         {"tool": "calculator", "expression": "521 + 601"}
           -> Observation: 1122
         {"answer": "1122"}
           -> Result: correct, the answer is 1122.
      ...
      solved 2/2
    before: solved 62.5%, mean return +0.65, invalid replies 0.0%
     after: solved 87.5%, mean return +0.90, invalid replies 0.0%
    reloaded runs/calculator/final/adapter onto ~/.cache/textgym/models/SmolLM2-135M-Instruct
    after training (reloaded):
      ... (the same two questions, played by the reloaded adapter)
      solved 2/2
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from peft import PeftConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

import textgym  # noqa: F401  (registers textgym/Calculator-v0)
from textgym.envs.calculator import DIFFICULTIES
from textgym_agents import PPOConfig, PPOPolicy, evaluate

SEED = 10_000  # evaluation and demo questions


def play(model: Any, tokenizer: Any, env: gym.Env, seed: int, config: PPOConfig) -> bool:
    """Play one question greedily with plain transformers, print it, return is_success."""
    messages, info = env.reset(seed=seed)
    print(f"  Q: {info['question']}")
    while True:
        # The same tokens PPOPolicy generates from: the chat prompt, then the reply prefix.
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        prefix = config.reply_prefix
        ids = list(ids["input_ids"]) + tokenizer.encode(prefix, add_special_tokens=False)
        with torch.no_grad():
            output = model.generate(
                input_ids=torch.tensor([ids]),
                max_new_tokens=config.max_new_tokens,
                do_sample=False,
                stop_strings=config.stop_strings,
                tokenizer=tokenizer,
                pad_token_id=tokenizer.eos_token_id,
            )
        reply = prefix + tokenizer.decode(output[0, len(ids) :], skip_special_tokens=True)
        messages, _, terminated, truncated, info = env.step(reply)
        seen = info.get("parse_error", messages[-1]["content"])
        print(f"     {reply.strip()}\n       -> {seen[:100]}")
        if terminated or truncated:
            return bool(info.get("is_success", False))


def play_all(
    model: Any, tokenizer: Any, env: gym.Env, n: int, label: str, config: PPOConfig
) -> None:
    """Play ``n`` questions and print how many were solved."""
    print(f"{label}:")
    solved = sum(play(model, tokenizer, env, SEED + i, config) for i in range(n))
    print(f"  solved {solved}/{n}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64, help="training episodes")
    parser.add_argument("--eval-episodes", type=int, default=8)
    parser.add_argument("--questions", type=int, default=2, help="questions shown before/after")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--difficulty", default="mixed", choices=DIFFICULTIES)
    parser.add_argument("--out", default="runs/calculator")
    parser.add_argument("--model", default=None, help="model dir or HF id (default: embedded)")
    args = parser.parse_args()
    env_kwargs = {"difficulty": args.difficulty}
    # What `textgym train` uses here: the env's replies are flat JSON objects, so the model
    # continues '{"' and stops at '}' (temperature 0.7: at 1.0 most sampled replies are not
    # valid JSON), 4 steps per env per rollout, no KL penalty, and the calculator's measured
    # learning rate (5e-4). Print it to see every value.
    env = gym.make("textgym/Calculator-v0", **env_kwargs)
    config = PPOConfig.for_env(env)
    policy = PPOPolicy.from_pretrained(args.model, config=config)  # LoRA attached
    # A fresh LoRA adapter changes nothing yet: this is the base model.
    play_all(policy.model, policy.tokenizer, env, args.questions, "before training", config)
    before = evaluate(policy, env, n_episodes=args.eval_episodes, seed=SEED)

    envs = gym.make_vec("textgym/Calculator-v0", num_envs=args.num_envs, **env_kwargs)
    policy.learn(envs, total_episodes=args.episodes, output_dir=args.out)
    after = evaluate(policy, env, n_episodes=args.eval_episodes, seed=SEED)
    for name, result in [("before", before), ("after", after)]:
        print(
            f"{name:>6}: solved {result.get('success_rate', 0.0):.1%}, mean return "
            f"{result['mean_return']:+.2f}, invalid replies {result['invalid_rate']:.1%}"
        )

    # learn() ended with policy.save(out / "final"): the adapter is in peft format there.
    # Its adapter_config.json names the base model: --model, or for the embedded model its
    # float32 copy in textgym's cache (textgym_agents.model.loading.embedded_model_dir()).
    adapter_dir = Path(args.out) / "final" / "adapter"
    base_dir = PeftConfig.from_pretrained(adapter_dir).base_model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    print(f"reloaded {adapter_dir} onto {base_dir}")
    play_all(model, tokenizer, env, args.questions, "after training (reloaded)", config)


if __name__ == "__main__":
    main()
