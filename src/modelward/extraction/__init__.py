"""Model-extraction attacks, prediction-perturbation defenses (ModelGuard and baselines), guarded serving."""
