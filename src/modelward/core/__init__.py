"""Shared building blocks: data, model zoo, parts, init schemes, training, configs, ledger, io, plots."""
