"""Mitigation: fine-pruning (:mod:`.fine_pruning`) and unlearning the reverse-engineered trigger
(:mod:`.unlearning`); both return the repaired model with its clean accuracy and attack success before and
after (:class:`~.base.Mitigation`)."""
