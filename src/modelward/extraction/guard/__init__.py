"""The guarded prediction service in three layers (KServe's codec / data plane / routes):

- :mod:`.config`   — ``GuardConfig`` and its sections, :func:`~.config.load_guard_config`, the state fingerprint;
- :mod:`.oip`      — the Open Inference Protocol codec (parse a request body, encode an answer; no HTTP);
- :mod:`.querylog` — the SQLite query log and per-key budgets (raises :class:`~.errors.BudgetExceeded`; no HTTP);
- :mod:`.service`  — :class:`~.service.GuardService`: authenticate, answer (budget → model → defense → log), state;
- :mod:`.http`     — the FastAPI routes (status codes live here only), :func:`~.http.serve`, ``bind_socket``;
- :mod:`.process`  — run ``modelward guard serve`` in a subprocess and write its config (tests, demo, benchmarks).

Nothing is imported here, so ``import modelward.extraction.guard.oip`` does not load FastAPI.
"""
