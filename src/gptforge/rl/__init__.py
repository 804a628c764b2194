"""Reinforcement learning on verifiable rewards (GRPO) and the tasks it trains on."""
