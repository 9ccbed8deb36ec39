"""What `modelward assess` reads: the model, its data, the training recipe, a profile and optional split.

A model is given as a safetensors checkpoint written by ``modelward train`` (its metadata carries ``[model]`` and
``[data]``, so ``checkpoint = "model.safetensors"`` alone is enough), by ``modelward robust train`` (a GloRo net:
certified accuracy is then reported), or by ``[model] arch = "entrypoint"`` (a factory of yours, with or without
a checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from modelward.core.config import StrictModel
from modelward.core.data import DataConfig
from modelward.core.device import DeviceSetting
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig

Profile = Literal["quick", "standard", "thorough"]
SectionName = Literal["robustness", "privacy", "extraction", "completion", "explanations", "backdoor"]
SECTIONS: tuple[SectionName, ...] = ("robustness", "privacy", "extraction", "completion", "explanations", "backdoor")


class SplitConfig(StrictModel):
    """The parts a split would hand to each party, e.g. ``alice = ["conv1"]``, ``bob = ["conv2", "fc1", "logits"]``
    (names, globs and ``a+b`` unions as ``modelward parts`` prints them).

    Args:
        parties: party name -> the part names it holds (at least 2 parties, each with at least one part).
        study: an existing completion study folder with these parts (read, not rerun).

    Returns:
        A strict config, the ``[split]`` table of :class:`AssessConfig`.

    Example:
        >>> SplitConfig(parties={"alice": ["conv1"], "bob": ["conv2", "fc1", "logits"]}).study is None
        True
    """

    parties: dict[str, list[str]] = Field(min_length=2)
    study: str | None = None  # an existing completion study folder with these parts (e.g. the demo's): read, not rerun

    @field_validator("parties")
    @classmethod
    def _non_empty(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        empty = [p for p, parts in v.items() if not parts]
        if empty:
            raise ValueError(f"party/parties {empty} hold no part; give each party at least one part name")
        return v


class ExtractionOptions(StrictModel):
    budget: int | None = Field(None, ge=10)  # queries; None = the profile's
    epsilon: float = Field(1.0, gt=0.0, le=2.0)  # ℓ1 budget of ModelGuard-S/-W (the service's configured value)


class RobustnessOptions(StrictModel):
    linf_eps: list[float] | None = None  # None = the profile's (for inputs in [0, 1])
    l2_eps: list[float] | None = None


class BackdoorOptions(StrictModel):
    """``[backdoor]`` (issue 41): clean reference models for the backdoor section, as ``[detect] reference`` of
    ``modelward backdoor detect``: each a ``detect.json`` (or the folder holding one: a ``modelward backdoor detect``
    output, or the ``backdoor`` folder of an assessment of a clean model) of a model trained on the same data with the
    same recipe; with ≥ 3 of them the section's verdict is the class-wise calibrated one, p < ``reference_alpha``."""

    reference: list[str] = Field(default_factory=list)
    reference_alpha: float = Field(0.05, gt=0.0, lt=1.0)
    #: a trained MNTD meta-classifier (``mntd.safetensors``, written by ``modelward backdoor detect`` with
    #: ``[detect.mntd] enabled``) for a model of the same data, architecture and recipe; its verdict joins the card's
    mntd: str | None = None

    @model_serializer(mode="wrap")
    def _omit_no_mntd(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # left out while unset: assessments recorded with references before it existed keep their fingerprint
        data = handler(self)
        if data.get("mntd") is None:
            data.pop("mntd", None)
        return data

    @field_validator("reference")
    @classmethod
    def _enough(cls, v: list[str]) -> list[str]:
        if 0 < len(v) < 3:
            raise ValueError(f"give at least 3 clean reference models (got {len(v)}): the calibration's spread is "
                             "estimated from them (docs/backdoor.md recommends 10)")
        return v


class AssessConfig(StrictModel):
    """A `modelward assess` file (see examples/assess_digits.toml).

    Args:
        name: the model's name in the report.
        checkpoint: the safetensors checkpoint to assess (or give ``model`` with ``arch = "entrypoint"``).
        model / data: the model and data (None: from the checkpoint's metadata; data else ``digits``).
        train: the recipe for shadow models and completion originals.
        profile: ``"quick"``, ``"standard"`` or ``"thorough"``; seed; device.
        sections: the threat areas to run (distinct; default all).
        split: an optional :class:`SplitConfig` (the parts each party would hold).
        extraction: ``budget`` and ModelGuard ``epsilon``; robustness: ``linf_eps`` / ``l2_eps`` lists (default:
            the field's radii per modality, see :func:`modelward.assess.sections.robustness.threat_models`).
        expected_accuracy: the model's own test accuracy, if known: 10 points below it, no verdict is given.
        sizes: overrides of the profile's counts (points, steps, shadow models; see
            :data:`modelward.assess.profiles.COUNT_FIELDS`), stated in the report.
        code_dir: the folder entry points are imported from (:meth:`resolve_paths` sets the config's folder).

    Returns:
        A strict config for :func:`~modelward.assess.run.run_assessment`.

    Example:
        >>> cfg = AssessConfig(checkpoint="model.safetensors", profile="quick")
        >>> cfg.profile, cfg.seed
        ('quick', 0)
    """

    name: str = "model"
    checkpoint: str | None = None
    model: ModelConfig | None = None  # None: from the checkpoint's metadata
    data: DataConfig | None = None  # None: from the checkpoint's metadata, else digits
    train: TrainConfig = Field(default_factory=TrainConfig)  # recipe for shadow models and completion originals
    profile: Profile = "quick"
    seed: int = 0
    device: DeviceSetting = "cpu"
    sections: list[SectionName] = Field(default_factory=lambda: list(SECTIONS))
    split: SplitConfig | None = None
    extraction: ExtractionOptions = Field(default_factory=ExtractionOptions)
    robustness: RobustnessOptions = Field(default_factory=RobustnessOptions)
    backdoor: BackdoorOptions = Field(default_factory=BackdoorOptions)  # clean references of the backdoor section
    expected_accuracy: float | None = Field(None, gt=0.0, le=1.0)  # the model's own test accuracy, if known
    # overrides of the profile's counts (modelward.assess.profiles.COUNT_FIELDS), e.g. {n_eval = 100, shadows = 2}
    sizes: dict[str, int] = Field(default_factory=dict)
    code_dir: str | None = None  # where entry points are imported from (set to the config file's folder)

    @model_serializer(mode="wrap")
    def _omit_no_sizes(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # left out of dumps while empty: the fingerprints of assessments recorded before it existed still match
        data = handler(self)
        if not data.get("sizes"):
            data.pop("sizes", None)
        if data.get("backdoor") == BackdoorOptions().model_dump():  # likewise while at its default
            data.pop("backdoor", None)
        return data

    @model_validator(mode="after")
    def _needs_a_model(self) -> AssessConfig:
        if self.checkpoint is None and (self.model is None or self.model.resolved_source == "zoo"):
            raise ValueError("give the model to assess: checkpoint = \"model.safetensors\" (from `modelward train` or "
                             "`modelward robust train`), or [model] arch = \"entrypoint\" with entrypoint = "
                             "\"package.module:factory\", or [model] source = \"torchvision\" | \"timm\" | \"hf\" "
                             "(docs/assess.md, models from torchvision, timm and Hugging Face)")
        if len(set(self.sections)) != len(self.sections):
            raise ValueError(f"sections must be distinct, got {self.sections}")
        return self

    def resolve_paths(self, base: Path) -> AssessConfig:
        """Every relative path (checkpoint, data files, split study) relative to the config file's folder, and
        entry points importable from it (so a config works from any folder, without ``PYTHONPATH=.``)."""
        upd: dict = {"code_dir": self.code_dir or str(base.resolve())}

        def rel(p: str | None) -> str | None:
            return p if p is None or Path(p).is_absolute() else str((base / p).resolve())

        if self.checkpoint and not Path(self.checkpoint).is_absolute():
            upd["checkpoint"] = str((base / self.checkpoint).resolve())
        if self.model is not None and self.model.path and not Path(self.model.path).is_absolute():
            upd["model"] = self.model.model_copy(update={"path": str((base / self.model.path).resolve())})
        if self.data is not None:
            keys = ("path", "labels_path", "test_path", "test_labels_path", "train_index", "tokenizer")
            upd["data"] = self.data.model_copy(update={k: rel(getattr(self.data, k)) for k in keys})
        if self.split is not None and self.split.study and not Path(self.split.study).is_absolute():
            upd["split"] = self.split.model_copy(update={"study": str((base / self.split.study).resolve())})
        if self.backdoor.reference or self.backdoor.mntd:  # the references' detect.json and MNTD's file, likewise
            upd["backdoor"] = self.backdoor.model_copy(update={"reference": [rel(p) for p in self.backdoor.reference],
                                                               "mntd": rel(self.backdoor.mntd)})
        return self.model_copy(update=upd)
