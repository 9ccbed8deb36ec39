"""An ML bill of materials (CycloneDX 1.6 JSON, through ``cyclonedx-python-lib``) for an assessed model:
``bom.cdx.json`` next to the report.

Components: the model (``machine-learning-model``) with its weights file's SHA-256 and the assessment's
configuration as properties; the data (``data``) with the files' SHA-256 where the data are files (the bundled
or synthetic source and its seed otherwise); the libraries the assessment ran with (``library``, from installed
package metadata). Nothing is downloaded; the BOM is validated against CycloneDX's bundled JSON schema in the tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelward.core.records import atomic_write_text
from modelward.scan.scanner import sha256_file as _sha256


def build_bom(report: dict[str, Any]) -> Any:
    """The CycloneDX ``Bom`` of an assessment (see the module docstring).

    Args:
        report: the assessment's report (``report.json`` as :func:`modelward.assess.report.build_report` gives).

    Returns:
        A ``cyclonedx.model.bom.Bom``.

    Example:
        >>> bom = build_bom(json.load(open("assess-out/report.json")))  # doctest: +SKIP
    """
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType

    cfg = report["config"]
    model = Component(name=report["name"], type=ComponentType.MACHINE_LEARNING_MODEL, bom_ref="model",
                      description=str(report.get("model", "")))
    props = [Property(name="modelward:profile", value=report["profile"]),
             Property(name="modelward:seed", value=str(cfg.get("seed"))),
             Property(name="modelward:config", value=json.dumps(cfg, sort_keys=True))]
    if report.get("clean_accuracy") is not None:
        props.append(Property(name="modelward:clean_test_accuracy", value=f"{report['clean_accuracy']:.6f}"))
    for f in report.get("findings", []):
        if f.get("headline"):
            props.append(Property(name=f"modelward:finding:{f['id']}", value=f"{f['severity']} {f['value']}"))
    model.properties.update(props)
    ckpt = cfg.get("checkpoint")
    if ckpt and Path(ckpt).is_file():
        model.hashes.add(HashType(alg=HashAlgorithm.SHA_256, content=_sha256(Path(ckpt))))
        model.properties.add(Property(name="modelward:weights_file", value=str(ckpt)))
    bom = Bom()
    bom.metadata.component = model
    data_cfg = cfg.get("data") or {}
    data = Component(name=f"data:{data_cfg.get('source', 'from the checkpoint metadata')}", type=ComponentType.DATA,
                     bom_ref="data")
    data.properties.add(Property(name="modelward:data_config", value=json.dumps(data_cfg, sort_keys=True)))
    for key in ("path", "test_path", "labels_path", "test_labels_path", "train_index"):
        p = data_cfg.get(key)
        if p and Path(p).is_file():
            data.properties.add(Property(name=f"modelward:{key}:sha256", value=_sha256(Path(p))))
            data.properties.add(Property(name=f"modelward:{key}", value=str(p)))
    if report.get("membership"):
        data.properties.add(Property(name="modelward:membership", value=report["membership"]))
    bom.components.add(data)
    libs = [Component(name=name, version=version, type=ComponentType.LIBRARY, bom_ref=f"lib:{name}")
            for name, version in report.get("versions", {}).items() if name not in ("python", "platform")]
    for lib in libs:
        bom.components.add(lib)
    bom.register_dependency(model, [data, *libs])
    return bom


def write_bom(out: str | Path, report: dict[str, Any]) -> Path:
    """Write ``bom.cdx.json`` (CycloneDX 1.6 JSON) into the assessment folder `out`; returns its path."""
    from cyclonedx.output.json import JsonV1Dot6

    path = Path(out) / "bom.cdx.json"
    atomic_write_text(path, JsonV1Dot6(build_bom(report)).output_as_string(indent=2))
    return path
