"""Model-extraction attacks, prediction-perturbation defenses (ModelGuard and baselines), guarded serving.

The main verbs, imported lazily (``from modelward.extraction import ModelGuardS, make_extraction_attack``):

- defenses (:mod:`.defenses`): ``ModelGuardW``, ``ModelGuardS``, ``MAD``, ``ReverseSigmoid``,
  ``AdaptiveMisinformation``, ``TopOne``, ``Rounding``, ``GaussianNoise``, or by name ``make_defense(name, ...)`` / from a config section ``build_defense(spec, models)``;
- attacks (:mod:`.attacks`): ``make_extraction_attack(query, strategy)`` over the query strategies (Knockoff, JBDA)
  and attack strategies (naive, top-1, S4L, smoothing, DDAE, PBayes, MQPI); the victim is a ``LocalVictim`` (an
  ``nn.Module`` behind a defense) or an ``HttpVictim`` (a guarded prediction API);
- the ``modelward extract run`` study: ``ExtractionConfig`` and ``run_evaluation(cfg, out)``;
- the guarded prediction API (:mod:`.guard`): ``serve(config_path)`` (KServe v2 / Open Inference Protocol), or in
  process ``build_service(config_path)`` → ``GuardService.answer(key, x)``.
"""

from modelward.core.registry import lazy_exports

_D = "modelward.extraction.defenses"
_EXPORTS = {
    "ModelGuardW": f"{_D}.modelguard_w:ModelGuardW", "ModelGuardS": f"{_D}.modelguard_s:ModelGuardS",
    "MAD": f"{_D}.mad:MAD", "ReverseSigmoid": f"{_D}.reverse_sigmoid:ReverseSigmoid",
    "AdaptiveMisinformation": f"{_D}.adaptive_misinformation:AdaptiveMisinformation",
    "TopOne": f"{_D}.simple:TopOne", "Rounding": f"{_D}.simple:Rounding", "GaussianNoise": f"{_D}.simple:GaussianNoise",
    "NoDefense": f"{_D}.base:NoDefense", "PredictionDefense": f"{_D}.base:PredictionDefense",
    "DEFENSES": f"{_D}:DEFENSES", "make_defense": f"{_D}:make_defense",
    "QUERY_STRATEGIES": "modelward.extraction.attacks:QUERY_STRATEGIES",
    "ATTACK_STRATEGIES": "modelward.extraction.attacks:ATTACK_STRATEGIES",
    "make_extraction_attack": "modelward.extraction.attacks:make_extraction_attack",
    "TransferSet": "modelward.extraction.attacks.base:TransferSet",
    "EvalSet": "modelward.extraction.attacks.base:EvalSet",
    "SubstituteConfig": "modelward.extraction.attacks.base:SubstituteConfig",
    "ExtractionResult": "modelward.extraction.attacks.base:ExtractionResult",
    "ExtractionAttack": "modelward.extraction.attacks.base:ExtractionAttack",
    "knowledge_from_defense": "modelward.extraction.attacks.base:knowledge_from_defense",
    "LocalVictim": "modelward.extraction.victim:LocalVictim",
    "HttpVictim": "modelward.extraction.victim:HttpVictim",
    "ExtractionConfig": "modelward.extraction.config:ExtractionConfig",
    "run_evaluation": "modelward.extraction.study:run_evaluation",
    "build_defense": f"{_D}:build_defense", "IncrementalState": f"{_D}.base:IncrementalState",
    "serve": "modelward.extraction.guard.http:serve",
    "GuardConfig": "modelward.extraction.guard.config:GuardConfig",
    "load_guard_config": "modelward.extraction.guard.config:load_guard_config",
    "GuardService": "modelward.extraction.guard.service:GuardService",
    "build_service": "modelward.extraction.guard.service:build_service",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
