"""`modelward` entry point. Each command group lives in its own module exposing ``app`` (a typer.Typer) or, for
single commands, ``register(app)``. ModelwardErrors are printed without a traceback (``--debug`` shows it)."""

from __future__ import annotations

import importlib

import typer

from modelward.cli._errors import run_app

# group name -> module; modules are imported only when present, so areas can grow independently
GROUPS: dict[str, tuple[str, str]] = {
    "complete": ("modelward.cli.complete", "Model-completion hardness studies (supervised and RL)."),
    "party": ("modelward.cli.party", "Run a party of a split model: certificates and the gRPC party server."),
    "split": ("modelward.cli.split", "Train or predict with a model split across parties."),
    "audit": ("modelward.cli.audit", "Verify hash-chained audit logs."),
    "extract": ("modelward.cli.extract", "Model-extraction attacks against defended victims."),
    "guard": ("modelward.cli.guard", "Serve a model behind a guarded prediction API."),
    "robust": ("modelward.cli.robust", "Evasion attacks, adversarial training and GloRo certification."),
    "study": ("modelward.cli.study", "Research studies (plasticity)."),
    "privacy": ("modelward.cli.privacy", "Membership inference, model inversion and property inference audits."),
}
COMMANDS = ["modelward.cli.parts", "modelward.cli.train", "modelward.cli.demo", "modelward.cli.assess",
            "modelward.cli.explain", "modelward.cli.bias",
            "modelward.cli.cost", "modelward.cli.scan"]

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="modelward: security and governance of trained deep-learning models.")


@app.callback()
def _root() -> None:
    """modelward: security and governance of trained deep-learning models."""


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


for _name, (_module, _help) in GROUPS.items():
    if _available(_module):
        app.add_typer(importlib.import_module(_module).app, name=_name, help=_help)
for _module in COMMANDS:
    if _available(_module):
        importlib.import_module(_module).register(app)


def main(argv: list[str] | None = None) -> None:
    run_app(app, argv)


if __name__ == "__main__":
    main()
