"""Model-extraction attacks: query strategies × attack strategies (seed 003 §4.1).

Entry point: ``make_attack(query, strategy, ...)`` → :class:`ExtractionAttack`, then
``attack.run(victim, transfer_set, budget, substitute_factory, seed, eval_set, knowledge) -> ExtractionResult``.
"""

from __future__ import annotations

from typing import Any

from modelward.extraction.attacks.base import (
    AttackError,
    AttackKnowledge,
    AttackStrategy,
    EvalSet,
    ExtractionAttack,
    ExtractionResult,
    QueryStrategy,
    SubstituteConfig,
    TransferSet,
    VictimLike,
    knowledge_from_defense,
)
from modelward.extraction.attacks.ddae import DDAE, DDAEPlus
from modelward.extraction.attacks.jbda import JBDA, JBDATR
from modelward.extraction.attacks.knockoff import KnockoffAdaptive, KnockoffRandom
from modelward.extraction.attacks.naive import Naive
from modelward.extraction.attacks.pbayes import PBayes
from modelward.extraction.attacks.qpi import MQPI
from modelward.extraction.attacks.s4l import S4L
from modelward.extraction.attacks.smoothing import Smoothing
from modelward.extraction.attacks.top1 import Top1

QUERY_STRATEGIES: dict[str, type[QueryStrategy]] = {
    "knockoff": KnockoffRandom,
    "knockoff_adaptive": KnockoffAdaptive,
    "jbda": JBDA,
    "jbda_tr": JBDATR,
}
ATTACK_STRATEGIES: dict[str, type[AttackStrategy]] = {
    "naive": Naive,
    "top1": Top1,
    "s4l": S4L,
    "smoothing": Smoothing,
    "ddae": DDAE,
    "ddae_plus": DDAEPlus,
    "pbayes": PBayes,
    "mqpi": MQPI,
}
ADAPTIVE = tuple(k for k, v in ATTACK_STRATEGIES.items() if v.needs_knowledge)


def _build(kind: str, registry: dict[str, type], name: str, params: dict[str, Any]) -> Any:
    if name not in registry:
        raise AttackError(f"{kind} {name!r} is unknown; valid choices: {sorted(registry)}")
    try:
        return registry[name](**params)
    except TypeError as e:
        raise AttackError(f"{kind} {name!r}: bad parameters {sorted(params)} ({e})") from None


def make_attack(query: str = "knockoff", strategy: str = "naive", query_params: dict[str, Any] | None = None,
                strategy_params: dict[str, Any] | None = None, substitute: SubstituteConfig | None = None
                ) -> ExtractionAttack:
    """Build an attack by name, e.g. ``make_attack("jbda_tr", "pbayes", {"seed_size": 50})``."""
    return ExtractionAttack(_build("query strategy", QUERY_STRATEGIES, query, query_params or {}),
                            _build("attack strategy", ATTACK_STRATEGIES, strategy, strategy_params or {}),
                            substitute or SubstituteConfig())


__all__ = [
    "ADAPTIVE", "ATTACK_STRATEGIES", "DDAE", "JBDA", "JBDATR", "MQPI", "QUERY_STRATEGIES", "S4L", "AttackError",
    "AttackKnowledge", "AttackStrategy", "DDAEPlus", "EvalSet", "ExtractionAttack", "ExtractionResult",
    "KnockoffAdaptive", "KnockoffRandom", "Naive", "PBayes", "QueryStrategy", "Smoothing", "SubstituteConfig",
    "Top1", "TransferSet", "VictimLike", "knowledge_from_defense", "make_attack",
]
