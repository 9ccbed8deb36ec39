"""Backdoors and poisoning (OWASP ML02, ML10): find them in a model, in its training data and at its API.

The main verbs, imported lazily (``from modelward.backdoor import BadNets, NeuralCleanse``):

- attacks (:mod:`.attacks`), for self-tests and calibrating detectors: ``BadNets``, ``Blend``, ``WaNet``,
  ``CleanLabel``, or by name ``make_backdoor_attack("blend", rate=0.05)``; ``backdoor_effect`` measures clean
  accuracy and the attack success rate;
- model-level detection without the training data (:mod:`.detect.model`): ``NeuralCleanse`` (trigger
  reverse-engineering, MAD anomaly index), ``MMBD`` (data-free maximum-margin statistic); ``CleanReference`` calibrates
  either against clean reference models, class by class; ``MNTD`` (a meta-classifier on shadow models that
  ``train_shadows`` trains, jumbo-backdoored at random); ``BatchNormShift`` (the BatchNorm running statistics
  against the defender's clean data, a simulated null, no references);
- data-level detection when the training data is given (:mod:`.detect.data`): ``ActivationClustering``,
  ``SpectralSignature``, ``Spectre``;
- input-level detection at the API (:mod:`.detect.input`): ``STRIP`` (and its ``guard serve`` monitor);
- mitigation (:mod:`.mitigate`): ``unlearn`` (the reversed trigger), ``fine_prune``;
- the ``modelward backdoor`` jobs (:mod:`.experiment`) and the benchmark study (:mod:`.study`).
"""

from modelward.core.registry import lazy_exports

_B = "modelward.backdoor"
_EXPORTS = {
    "BadNets": f"{_B}.attacks.badnets:BadNets", "Blend": f"{_B}.attacks.blend:Blend",
    "WaNet": f"{_B}.attacks.wanet:WaNet", "CleanLabel": f"{_B}.attacks.clean_label:CleanLabel",
    "ATTACKS": f"{_B}.attacks:ATTACKS", "make_backdoor_attack": f"{_B}.attacks:make_backdoor_attack",
    "BackdoorAttack": f"{_B}.attacks.base:BackdoorAttack", "PoisonedSet": f"{_B}.attacks.base:PoisonedSet",
    "backdoor_effect": f"{_B}.attacks.base:backdoor_effect",
    "PatchTrigger": f"{_B}.triggers:PatchTrigger", "BlendTrigger": f"{_B}.triggers:BlendTrigger",
    "WarpTrigger": f"{_B}.triggers:WarpTrigger", "MaskTrigger": f"{_B}.triggers:MaskTrigger",
    "NeuralCleanse": f"{_B}.detect.model.neural_cleanse:NeuralCleanse", "MMBD": f"{_B}.detect.model.mmbd:MMBD",
    "ModelVerdict": f"{_B}.detect.model.base:ModelVerdict",
    "CleanReference": f"{_B}.detect.model.reference:CleanReference",
    "BatchNormShift": f"{_B}.detect.model.bn_shift:BatchNormShift",
    "MNTD": f"{_B}.detect.model.mntd:MNTD", "train_shadows": f"{_B}.detect.model.shadows:train_shadows",
    "ActivationClustering": f"{_B}.detect.data.activation_clustering:ActivationClustering",
    "SpectralSignature": f"{_B}.detect.data.spectral:SpectralSignature", "Spectre": f"{_B}.detect.data.spectre:Spectre",
    "DataScan": f"{_B}.detect.data.base:DataScan",
    "STRIP": f"{_B}.detect.input.strip:STRIP", "StripMonitor": f"{_B}.detect.input.strip:StripMonitor",
    "unlearn": f"{_B}.mitigate.unlearning:unlearn", "fine_prune": f"{_B}.mitigate.fine_pruning:fine_prune",
    "BackdoorConfig": f"{_B}.experiment:BackdoorConfig", "run_attack": f"{_B}.experiment:run_attack",
    "run_detect": f"{_B}.experiment:run_detect", "run_scan": f"{_B}.experiment:run_scan",
    "run_mitigate": f"{_B}.experiment:run_mitigate",
    "BackdoorStudyConfig": f"{_B}.study:BackdoorStudyConfig", "run_backdoor_study": f"{_B}.study:run_backdoor_study",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
