"""The public API: every area's exports resolve lazily, the main classes document themselves, and their examples run."""

from __future__ import annotations

import doctest
import importlib
import inspect
import subprocess
import sys

import pytest

AREAS = ("assess", "backdoor", "bias", "completion", "cost", "explain", "extraction", "governance", "privacy",
         "robustness")
EVASION = ("FGSM", "BIM", "ILCM", "PGD", "CarliniWagnerL2", "LBFGS", "JSMA", "TransferAttack")
DEFENSES = ("ModelGuardW", "ModelGuardS", "MAD", "ReverseSigmoid", "AdaptiveMisinformation", "TopOne", "Rounding",
            "GaussianNoise")
MORE = {"modelward.robustness": ("NonLocalMeans", "TransformedModel", "FeatureSqueezingDetector", "GloroNet"),
        "modelward.extraction": ("LocalVictim", "HttpVictim", "ExtractionAttack", "ExtractionResult"),
        "modelward.privacy": ("AttackData", "MembershipAttack", "AuditConfig", "DPConfig", "PropertyConfig"),
        "modelward.governance": ("AuditLog", "Policy", "ConsentChecker", "PartyConfig", "SplitPlan", "SplitConfig",
                                 "LeakageAuditConfig"),
        "modelward.cost": ("CostConfig",), "modelward.assess": ("AssessConfig", "SplitConfig"),
        "modelward.backdoor": ("BadNets", "Blend", "WaNet", "CleanLabel", "NeuralCleanse", "MMBD",
                               "ActivationClustering", "SpectralSignature", "Spectre", "STRIP"),
        "modelward.bias": ("GaussianSetting", "LinearModel", "SGDSchedule"),
        "modelward.explain": ("InternalInfluence", "Slice", "ClassQoI", "ComparativeQoI", "MaxClassQoI", "UnitQoI",
                              "ChannelQoI", "LambdaQoI", "PointDoI", "LinearDoI", "GaussianDoI", "DatasetDoI",
                              "MixtureDoI")}
STRATEGIES = ("KnockoffRandom", "KnockoffAdaptive", "JBDA", "JBDATR", "Naive", "Top1", "S4L", "Smoothing", "DDAE",
              "DDAEPlus", "PBayes", "MQPI")


@pytest.mark.parametrize("area", AREAS)
def test_area_exports_resolve(area: str) -> None:
    mod = importlib.import_module(f"modelward.{area}")
    assert mod.__all__, area
    for name in mod.__all__:
        assert getattr(mod, name) is not None, f"modelward.{area}.{name}"
    assert set(mod.__all__) <= set(dir(mod))
    with pytest.raises(AttributeError, match="no attribute"):
        mod.NoSuchThing  # noqa: B018


def test_top_level_exposes_the_areas_lazily() -> None:
    code = "import sys, modelward; assert 'torch' not in sys.modules; print(modelward.robustness.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "modelward.robustness"
    light = subprocess.run([sys.executable, "-c", "import sys, modelward.robustness, modelward.extraction, "
                            "modelward.completion; print('torch' in sys.modules)"],
                           capture_output=True, text=True, check=True)
    assert light.stdout.strip() == "False"  # area packages import nothing heavy until a name is used


def test_from_family_import_class() -> None:
    from modelward.extraction.attacks import PBayes
    from modelward.extraction.defenses import ModelGuardS
    from modelward.robustness.attacks import PGD

    assert PGD.name == "pgd" and ModelGuardS.name == "modelguard_s" and PBayes.needs_knowledge


def _public(names: tuple[str, ...], module: str) -> list[object]:
    mod = importlib.import_module(module)
    return [getattr(mod, n) for n in names]


@pytest.mark.parametrize("obj", _public(EVASION, "modelward.robustness.attacks")
                         + _public(DEFENSES, "modelward.extraction.defenses")
                         + _public(STRATEGIES, "modelward.extraction.attacks")
                         + [o for m, names in MORE.items() for o in _public(names, m)], ids=lambda o: o.__name__)
def test_main_classes_document_args_returns_example(obj: type) -> None:
    doc = inspect.getdoc(obj) or ""
    assert obj.__dict__.get("__doc__"), f"{obj.__name__} has no docstring of its own"
    for section in ("Args:", "Returns:", "Example:"):
        assert section in doc, f"{obj.__name__}: no {section}"
    finder, runner = doctest.DocTestFinder(recurse=False), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(obj, obj.__name__, globs=vars(sys.modules[obj.__module__]).copy()):
        assert test.examples, obj.__name__
        runner.run(test)
    assert runner.failures == 0, f"{obj.__name__}: its Example fails"
