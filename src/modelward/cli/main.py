"""`modelward` entry point. Each command group lives in its own module exposing ``app`` (a typer.Typer) or, for
single commands, ``register(app)``. ModelwardErrors are printed without a traceback (``--debug`` shows it).

Command modules are imported only when their command runs (:class:`LazyGroup`): ``modelward --help`` and
``modelward --version`` import neither torch nor matplotlib, and one command never pays for the others' imports.
"""

from __future__ import annotations

import importlib
import importlib.util

import click
import typer
from typer.core import TyperGroup

from modelward.cli._errors import run_app

# group name -> (module, help); modules are imported only when present, so areas can grow independently
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
    "trust": ("modelward.cli.trust", "Trust the code (entry points) config files name: your own list."),
    # issue 41 (backdoor)
    "backdoor": ("modelward.cli.backdoor", "Backdoors and poisoning: attack (self-test), detect, scan, mitigate."),
}
# single commands: name -> (module with register(app), help shown in `modelward --help`)
SINGLE: dict[str, tuple[str, str]] = {
    "parts": ("modelward.cli.parts", "Print each part of the model with its parameter count."),
    "train": ("modelward.cli.train", "Train a model with procedure T and save its weights."),
    "demo": ("modelward.cli.demo", "Run the main job on embedded defaults: split training -> completion study -> "
                                   "guarded API."),
    "assess": ("modelward.cli.assess", "Assess a model's robustness, privacy, extraction risk, completion hardness, "
                                       "explanations and bias."),
    "explain": ("modelward.cli.explain", "Explain models with internal influence: input attributions and top "
                                         "internal units per class."),
    "bias": ("modelward.cli.bias", "Bias amplification and its mitigations (feature parity, experts, l1)."),
    "cost": ("modelward.cli.cost", "Measure latency, throughput, bytes on the wire and agreement of every "
                                   "cryptographic backend."),
    "scan": ("modelward.cli.scan", "Examine model files (pickle, zip, safetensors) for code without loading them."),
}
COMMANDS = [module for module, _ in SINGLE.values()]  # (kept for callers that listed the modules)


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _load(name: str) -> click.Command | None:
    """Import the module behind command `name` and build its click command."""
    if name in GROUPS:
        module = GROUPS[name][0]
        if not _available(module):
            return None
        group = typer.main.get_group(importlib.import_module(module).app)  # a group even with one command
        group.name = name
        group.help = group.help or GROUPS[name][1]
        return group
    module = SINGLE[name][0]
    if not _available(module):
        return None
    holder = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    importlib.import_module(module).register(holder)
    group = typer.main.get_group(holder)
    return group.commands.get(name)


class LazyGroup(TyperGroup):
    """The root group: lists commands from the tables above and imports a command's module only to run it."""

    _listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [n for n, (m, _) in {**GROUPS, **SINGLE}.items() if _available(m)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in GROUPS and cmd_name not in SINGLE:
            return None
        if self._listing:  # `modelward --help`: the one-line help from the table, nothing imported
            short = (GROUPS.get(cmd_name) or SINGLE[cmd_name])[1]
            return click.Command(cmd_name, help=short, short_help=short)
        return _load(cmd_name)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(cls=LazyGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="modelward: security and governance of trained deep-learning models.")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("modelward")
        except PackageNotFoundError:  # running from a source tree that is not installed
            v = "unknown (not installed)"
        typer.echo(f"modelward {v}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """modelward: security and governance of trained deep-learning models.

    Global switches, anywhere on the command line: --debug (show tracebacks) and --trust-code (let configs run the
    Python entry points they name, e.g. [model] entrypoint: an entry point is code; `modelward trust allow CONFIG`
    trusts one file, MODELWARD_TRUST_CODE=1 the environment).
    """


def main(argv: list[str] | None = None) -> None:
    run_app(app, argv)


if __name__ == "__main__":
    main()
