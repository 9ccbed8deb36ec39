"""One party of a split model, transport-free, in layers.

- :mod:`.machine`: :class:`~.machine.Party`, the wiring and the dispatch table;
- :mod:`.training` (the training step, phase 1) and :mod:`.inference` (evaluation, prediction, fetch): the
  operations;
- :mod:`.commits` (the committed step, carried commits, votes, aborts) and :mod:`.state` (checkpoints);
- :mod:`.pipeline`: the first party's bounded-staleness window (steps in flight, weight stashing);
- :mod:`.gate` (the admission path, an ordered list of small checks around the dispatch), :mod:`.step` (the
  tentative step: snapshot, late update, check, rollback, settle), :mod:`.segment` (the segment, the data column,
  shapes, input bounds), :mod:`.release` (what leaves the party: every outgoing value, its mechanism and its cost)
  and :mod:`.link` (the link to the next party);
- :mod:`.config`, :mod:`.checkpoints`, :mod:`.backward`, :mod:`.label_protection`, :mod:`.tensors`: its parts.
"""
