"""Evasion attacks and defenses, adversarial training, GloRo certified robustness, the plasticity study.

The main verbs, imported lazily (``from modelward.robustness import PGD, certify``):

- attacks (:mod:`.attacks`): ``FGSM``, ``BIM``, ``ILCM``, ``PGD``, ``CarliniWagnerL2``, ``LBFGS``, ``JSMA``,
  ``TransferAttack``, AutoAttack (``AutoAttack``, ``APGD``, ``APGDT``, ``FAB``, ``Square``), or by name
  ``make_attack("pgd", model, eps=0.1)``; ``robust_accuracy`` sweeps ε;
- certificates: randomized smoothing (:mod:`.smoothing`: ``SmoothedClassifier``, ``train_gaussian``), IBP / CROWN
  (:mod:`.bounds`: ``certify_bounds``, ``output_bounds``), GloRo (below);
- one status per point and the robust-accuracy sandwich (:mod:`.evaluation`: ``evaluate_points``,
  ``robustness_sandwich``) with gradient-masking diagnostics;
- defenses (:mod:`.defenses`): ``defensive_distillation``, ``FeatureSqueezingDetector``, ``NonLocalMeans``;
- training procedures (:mod:`.training`): ``pgd_adversarial_training`` (Madry), ``trades_training``;
- GloRo (:mod:`.gloro`): ``GloroNet``, ``build_gloro_model``, ``train_gloro``, ``certify``, ``certified_radius``;
- the ``modelward robust`` jobs (:mod:`.experiment`) and the plasticity study (:mod:`.plasticity`);
- text classifiers (:mod:`.text`): ``HotFlip`` token substitution, ``token_substitution_curve``,
  ``embedding_curves`` (FGSM/PGD on the token embeddings).
"""

from modelward.core.registry import lazy_exports

_A = "modelward.robustness.attacks"
_EXPORTS = {
    "FGSM": f"{_A}.fgsm:FGSM", "BIM": f"{_A}.bim:BIM", "ILCM": f"{_A}.ilcm:ILCM", "PGD": f"{_A}.pgd:PGD",
    "CarliniWagnerL2": f"{_A}.cw:CarliniWagnerL2", "LBFGS": f"{_A}.lbfgs:LBFGS", "JSMA": f"{_A}.jsma:JSMA",
    "TransferAttack": f"{_A}.transfer:TransferAttack",
    "APGD": f"{_A}.apgd:APGD", "APGDT": f"{_A}.apgdt:APGDT", "FAB": f"{_A}.fab:FAB", "Square": f"{_A}.square:Square",
    "AutoAttack": f"{_A}.autoattack:AutoAttack",
    "SmoothedClassifier": "modelward.robustness.smoothing:SmoothedClassifier",
    "train_gaussian": "modelward.robustness.smoothing:train_gaussian",
    "certify_bounds": "modelward.robustness.bounds:certify_bounds",
    "output_bounds": "modelward.robustness.bounds:output_bounds",
    "evaluate_points": "modelward.robustness.evaluation:evaluate_points",
    "robustness_sandwich": "modelward.robustness.evaluation:robustness_sandwich",
    "ATTACKS": f"{_A}:ATTACKS", "make_attack": f"{_A}:make_attack", "EvasionAttack": f"{_A}.base:EvasionAttack",
    "AttackResult": f"{_A}.base:AttackResult",
    "robust_accuracy": "modelward.robustness.metrics:robust_accuracy",
    "defensive_distillation": "modelward.robustness.defenses.distillation:defensive_distillation",
    "FeatureSqueezingDetector": "modelward.robustness.defenses.squeeze:FeatureSqueezingDetector",
    "NonLocalMeans": "modelward.robustness.defenses.nlm:NonLocalMeans",
    "TransformedModel": "modelward.robustness.defenses.nlm:TransformedModel",
    "AdversarialConfig": "modelward.robustness.training:AdversarialConfig",
    "pgd_adversarial_training": "modelward.robustness.training:pgd_adversarial_training",
    "trades_training": "modelward.robustness.training:trades_training",
    "GloroNet": "modelward.robustness.gloro.net:GloroNet",
    "build_gloro_model": "modelward.robustness.gloro.layers:build_gloro_model",
    "certify": "modelward.robustness.gloro.certify:certify",
    "certified_radius": "modelward.robustness.gloro.certify:certified_radius",
    "GloroTrainConfig": "modelward.robustness.gloro.train:GloroTrainConfig",
    "train_gloro": "modelward.robustness.gloro.train:train_gloro",
    "RobustConfig": "modelward.robustness.experiment:RobustConfig",
    "train_experiment": "modelward.robustness.experiment:train_experiment",
    "certify_experiment": "modelward.robustness.experiment:certify_experiment",
    "attack_experiment": "modelward.robustness.experiment:attack_experiment",
    "PlasticityConfig": "modelward.robustness.plasticity:PlasticityConfig",
    "run_plasticity_study": "modelward.robustness.plasticity:run_study",
    # text models (issue 39): token substitution and embedding-space attacks
    "HotFlip": f"{_A}.hotflip:HotFlip",
    "token_substitution_curve": "modelward.robustness.text:token_substitution_curve",
    "embedding_curves": "modelward.robustness.text:embedding_curves",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
