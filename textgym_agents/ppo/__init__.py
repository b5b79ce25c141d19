"""PPO for multi-turn text agents: config, math, rollout buffer, trainer."""
