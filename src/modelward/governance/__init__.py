"""Shared governance by model splitting: split plans, party servers (gRPC + mutual TLS), consent, audit.

The main verbs, imported lazily (``from modelward.governance import make_plan, verify_audit_log``):
``make_plan(model, parties, cuts)`` splits a model between parties; ``serve_party(cfg)`` runs one party's gRPC
server; ``load_split_config`` / ``run_training`` drive split training across the parties (``hosted_party``
runs the driver's own party inside its process: ``run_training(cfg, host=party)``); ``AuditLog`` /
``verify_audit_log`` are the tamper-evident audit trail; ``Policy`` / ``ConsentChecker`` decide per-pass
consent; ``make_certs`` / ``keygen`` create the mutual-TLS identities; ``run_split_demo`` does it all on one
machine; ``protect_gradient`` is label protection, ``run_leakage_audit`` measures label leakage (and, with
``[inputs]``, input reconstruction by the next party; ``InputProtectionConfig`` is the first party's defence).
What may leave a party is its flow policy (``FlowPolicy``, ``admit``, ``Release``), and every value that leaves passes
its release path (``ReleasePath``: noise, answer and privacy budgets, ``gdp_epsilon``); ``BoundedInfluence`` bounds
what one step can change and ``TrendDetector`` halts sustained damage (``StepIntegrity`` joins them in a party;
``slow_poisoning`` is the self-audit's attack on them); ``run_extraction_audit`` measures what a neighbour gets for
its budget (``neighbour_audit``).

The package in layers, bottom up: ``wire``, ``plan``, ``audit`` and ``trust/`` (certificates, identities);
``consent`` and ``protocol`` (operations, errors, the client interface); ``party/`` (gate, state machine,
tentative step, holding); ``transport/`` (gRPC server and client, in-process client, launcher); ``driver/``
(config, coordinator, training loop); ``demo``; ``leakage/`` (attacks, study, real-process audit);
``extraction_audit``, ``provision`` (one signed start-up kit per party at a consortium version; ``verify_kit``
checks one, ``start_kit`` verifies one completely and runs its start.sh).
``flow_policy``, ``bounded_influence`` and ``trend_detector`` sit in the bottom layer, ``integrity`` just below the
party, ``neighbour_audit`` beside ``consent``, ``poisoning_audit`` just below ``extraction_audit`` (its registry runs
the slow poisoning).
"""

from modelward.core.registry import lazy_exports

_G = "modelward.governance"
_EXPORTS = {
    "make_plan": f"{_G}.plan:make_plan", "SplitPlan": f"{_G}.plan:SplitPlan",
    "PartyConfig": f"{_G}.party.config:PartyConfig", "load_party_config": f"{_G}.party.config:load_party_config",
    "Party": f"{_G}.party.machine:Party", "serve_party": f"{_G}.transport.server:serve",
    "SplitConfig": f"{_G}.driver.config:SplitConfig", "load_split_config": f"{_G}.driver.config:load_split_config",
    "SplitDriver": f"{_G}.driver.training:SplitDriver",
    "run_training": f"{_G}.driver.training:run_training", "hosted_party": f"{_G}.transport.server:hosted_party",
    "AuditLog": f"{_G}.audit:AuditLog", "verify_audit_log": f"{_G}.audit:verify",
    "Policy": f"{_G}.consent:Policy", "ConsentChecker": f"{_G}.consent:ConsentChecker",
    "make_certs": f"{_G}.trust.certs:make_certs", "keygen": f"{_G}.trust.certs:keygen",
    "run_split_demo": f"{_G}.demo:run_split_demo",
    "protect_gradient": f"{_G}.party.label_protection:protect_gradient",
    "LeakageAuditConfig": f"{_G}.leakage.study:LeakageAuditConfig",
    "run_leakage_audit": f"{_G}.leakage.study:run_audit",
    "FlowPolicy": f"{_G}.flow_policy:FlowPolicy", "admit": f"{_G}.flow_policy:admit",
    "Release": f"{_G}.flow_policy:Release", "StepIntegrity": f"{_G}.integrity:StepIntegrity",
    "BoundedInfluence": f"{_G}.bounded_influence:BoundedInfluence",
    "TrendDetector": f"{_G}.trend_detector:TrendDetector",
    "slow_poisoning": f"{_G}.poisoning_audit:slow_poisoning",
    "ReleasePath": f"{_G}.party.release:ReleasePath", "gdp_epsilon": f"{_G}.party.release:gdp_epsilon",
    "ExtractionAuditConfig": f"{_G}.extraction_audit:ExtractionAuditConfig",
    "load_extraction_config": f"{_G}.extraction_audit:load_extraction_config",
    "run_extraction_audit": f"{_G}.extraction_audit:run_extraction_audit",
    "provision": f"{_G}.provisioning:provision", "ConsortiumConfig": f"{_G}.provisioning:ConsortiumConfig",
    "verify_kit": f"{_G}.trust.manifest:verify_kit", "start_kit": f"{_G}.trust.start:start_kit",
    "InputProtectionConfig": f"{_G}.party.input_protection:InputProtectionConfig",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
