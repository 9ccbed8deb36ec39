"""Model-extraction attacks: query strategies × attack strategies (seed 003 §4.1).

Entry point: ``make_extraction_attack(query, strategy, ...)`` → :class:`ExtractionAttack`, then
``attack.run(victim, transfer_set, budget, substitute_factory, seed, eval_set, knowledge) -> ExtractionResult``.
The strategies are chosen by name from :data:`QUERY_STRATEGIES` and :data:`ATTACK_STRATEGIES`
(:class:`~modelward.core.registry.Registry`), and exported lazily by class name
(``from modelward.extraction.attacks import KnockoffRandom, PBayes``).
"""

from __future__ import annotations

from typing import Any

from modelward.core.registry import Registry, lazy_exports
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

_M = "modelward.extraction.attacks"
_QUERY = {"knockoff": "knockoff:KnockoffRandom", "knockoff_adaptive": "knockoff:KnockoffAdaptive",
          "jbda": "jbda:JBDA", "jbda_tr": "jbda:JBDATR"}
_STRATEGY = {"naive": "naive:Naive", "top1": "top1:Top1", "s4l": "s4l:S4L", "smoothing": "smoothing:Smoothing",
             "ddae": "ddae:DDAE", "ddae_plus": "ddae:DDAEPlus", "pbayes": "pbayes:PBayes", "mqpi": "qpi:MQPI"}
#: query-strategy name -> class (how the attacker picks its queries)
QUERY_STRATEGIES = Registry("query strategy")
#: attack-strategy name -> class (how the attacker trains on the answers)
ATTACK_STRATEGIES = Registry("attack strategy")
for _name, _target in _QUERY.items():
    QUERY_STRATEGIES.add(_name, f"{_M}.{_target}")
for _name, _target in _STRATEGY.items():
    ATTACK_STRATEGIES.add(_name, f"{_M}.{_target}")
del _name, _target
#: attack strategies that need the defense (``needs_knowledge``; tests check this against the classes)
ADAPTIVE: tuple[str, ...] = ("ddae", "ddae_plus", "pbayes")

__getattr__, __dir__ = lazy_exports(__name__, {
    t.split(":")[1]: f"{_M}.{t}" for t in (*_QUERY.values(), *_STRATEGY.values())})


def _build(registry: Registry, name: str, params: dict[str, Any]) -> Any:
    try:
        return registry.create(name, **params)
    except TypeError as e:
        raise AttackError(f"{registry.kind} {name!r}: bad parameters {sorted(params)} ({e})") from None


def make_extraction_attack(query: str = "knockoff", strategy: str = "naive",
                           query_params: dict[str, Any] | None = None,
                           strategy_params: dict[str, Any] | None = None,
                           substitute: SubstituteConfig | None = None) -> ExtractionAttack:
    """Build an extraction attack by name.

    Args:
        query: query strategy, one of ``QUERY_STRATEGIES.names()`` (knockoff, knockoff_adaptive, jbda, jbda_tr).
        strategy: attack strategy, one of ``ATTACK_STRATEGIES.names()`` (naive, top1, s4l, smoothing, ddae,
            ddae_plus, pbayes, mqpi; those in :data:`ADAPTIVE` need the defense as ``knowledge``).
        query_params: keyword parameters of the query strategy (e.g. ``{"seed_size": 50}`` for JBDA).
        strategy_params: keyword parameters of the attack strategy (e.g. ``{"k": 10}`` for PBayes).
        substitute: how the substitute model is trained (epochs, batch size, learning rate).

    Returns:
        The attack; ``attack.run(victim, transfer_set, budget, substitute_factory, ...)`` returns an
        :class:`ExtractionResult`.

    Raises:
        ConfigError: unknown strategy name or parameter (the message lists the valid ones).

    Example:
        >>> attack = make_extraction_attack("jbda_tr", "pbayes", {"seed_size": 50}, {"k": 10})
        >>> type(attack.query).__name__, type(attack.strategy).__name__
        ('JBDATR', 'PBayes')
    """
    return ExtractionAttack(_build(QUERY_STRATEGIES, query, query_params or {}),
                            _build(ATTACK_STRATEGIES, strategy, strategy_params or {}),
                            substitute or SubstituteConfig())


__all__ = [
    "ADAPTIVE", "ATTACK_STRATEGIES", "DDAE", "JBDA", "JBDATR", "MQPI", "QUERY_STRATEGIES", "S4L", "AttackError",
    "AttackKnowledge", "AttackStrategy", "DDAEPlus", "EvalSet", "ExtractionAttack", "ExtractionResult",
    "KnockoffAdaptive", "KnockoffRandom", "Naive", "PBayes", "QueryStrategy", "Smoothing", "SubstituteConfig",
    "Top1", "TransferSet", "VictimLike", "knowledge_from_defense", "make_extraction_attack",
]
