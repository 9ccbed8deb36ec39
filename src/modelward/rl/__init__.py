"""Reinforcement learning: environments and agents (their completion problem is modelward.completion.rl)."""
