"""Evasion attacks and defenses, adversarial training, GloRo certified robustness, the plasticity study."""
