"""One party of a split model, transport-free, in three layers.

- :mod:`.gate`: the admission path, an ordered list of small checks around the dispatch;
- :mod:`.machine`: :class:`~.machine.Party`, the operations of the two-phase commit in a dispatch table;
- :mod:`.pipeline` (the first party's bounded-staleness window: steps in flight, weight stashing), :mod:`.step`
  (the tentative step: snapshot, late update, check, rollback, settle) and :mod:`.segment` (the segment, the data
  column, shapes, input bounds), which the party holds;
- :mod:`.config`, :mod:`.checkpoints`, :mod:`.backward`, :mod:`.label_protection`, :mod:`.tensors`: its parts.
"""
