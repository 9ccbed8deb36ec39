"""Reinforcement learning: environments, agents and their completion-hardness problems."""
