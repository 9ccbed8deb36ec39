"""examples/deploy (issue 40 item 3): the compose file and the Kubernetes manifests parse, their guard configs are
valid guard configs in proxy mode with the settings the README promises, and the files they mount exist. (They are
not run: neither Docker nor a cluster is available where the tests run.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from modelward.core.config import read_toml
from modelward.extraction.guard.config import GuardConfig, ServerSection

DEPLOY = Path(__file__).resolve().parents[2] / "examples" / "deploy"


@pytest.mark.parametrize("name", ["guard_proxy.toml", "k8s/guard.toml", "k8s/transformer.toml"])
def test_the_guard_configs_are_valid_proxy_configs(name):
    data = read_toml(DEPLOY / name)
    if "store_url" not in ServerSection.model_fields:  # (the PostgreSQL store is guard-state's, merged separately)
        assert data["server"].pop("store_url").startswith("postgresql://")
    cfg = GuardConfig.model_validate(data)
    assert cfg.upstream is not None and cfg.model.checkpoint is None
    assert cfg.ownership.watermark.enabled and cfg.ownership.detector.enabled
    assert not cfg.server.metrics_public and cfg.server.reserve > 0
    assert any(k.operator for k in cfg.keys)


def test_compose_and_manifests_parse_and_name_what_exists():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "digits-model", "guard-1", "guard-2", "nginx"} <= set(services)
    assert services["guard-2"]["command"] == services["guard-1"]["command"]  # the same replica twice
    for svc in services.values():
        build = svc.get("build")
        if build:
            assert (DEPLOY.parents[1] / build["dockerfile"]).is_file()
    assert (DEPLOY / compose["secrets"]["guard_toml"]["file"]).is_file()
    docs = [d for f in ("k8s/guard.yaml", "k8s/inferenceservice.yaml")
            for d in yaml.safe_load_all((DEPLOY / f).read_text()) if d]
    kinds = {d["kind"]: d for d in docs}
    assert kinds["Deployment"]["spec"]["replicas"] == 2
    assert {"StatefulSet", "Service", "ServiceMonitor", "InferenceService"} <= set(kinds)
    isvc = kinds["InferenceService"]["spec"]
    assert isvc["transformer"]["containers"][0]["args"][:3] == ["modelward", "guard", "serve"]
    assert read_toml(DEPLOY / "k8s/transformer.toml")["upstream"]["url"] == "http://digits-predictor"
