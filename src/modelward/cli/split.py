"""`modelward split`: train or predict with a model split across running parties."""

# lazy-imports: commands import the library on call, so `modelward --help` and this group's --help stay fast
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(no_args_is_help=True)
console = Console()


def _mb(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


@app.command("train")
def train(
    config: Annotated[Path, typer.Argument(help="SPLIT.toml")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override key=value")] = None,
    host: Annotated[Path | None, typer.Option("--host", help="PARTY.toml of a party to run inside this process "
                                              "(your own, normally the first): one network hop less per step; "
                                              "do not also `party serve` it")] = None,
    consortium_key: Annotated[str | None, typer.Option(
        "--consortium-key", help="for a kit: the consortium key (spki-sha256:<hex> or its .pub file), obtained out "
        "of band (default: $MODELWARD_CONSORTIUM_KEY; when set, only verified kits are used)")] = None,
) -> None:
    """Train over the parties; resumable (rerun the same command after an interruption). A SPLIT.toml (or a
    --host PARTY.toml) in a kit is used only once the kit verifies."""
    from contextlib import nullcontext

    from modelward.core.process import keep_freed_memory
    from modelward.core.progress import RichProgress
    from modelward.governance.driver import load_split_config, run_training
    from modelward.governance.party.config import load_party_config
    from modelward.governance.transport.server import hosted_party
    from modelward.governance.trust.manifest import check_kit_of, expected_key_from_env

    driver_kit = check_kit_of(config, consortium_key, None, set_)  # (an older kit than this host's is refused)
    if driver_kit is not None:  # the driver's kit starts: its consortium version is this host's mark from now on
        from modelward.governance.trust.versions import check_kit_version

        check_kit_version(config if config.is_dir() else config.parent, driver_kit, record=True)
    if host is not None and check_kit_of(host, consortium_key) is not None:
        from modelward.governance.provisioning import open_party_kit

        host, _ = open_party_kit(host if host.is_dir() else host.parent, expected_key_from_env(consortium_key))
    cfg = load_split_config(config, set_)
    keep_freed_memory()  # this process handles a batch and its messages per step, like a party server
    hosted = hosted_party(load_party_config(host)) if host is not None else nullcontext()
    with hosted as party, RichProgress(console) as progress:
        res = run_training(cfg, progress, host=party)
    console.print(f"trained {res.steps_run} steps in {res.seconds:.1f}s (resumed {res.resumes}×); test "
                  f"{cfg.train.loss} {res.curve[-1][1]:.4f}")
    for link, s in res.links.items():
        console.print(f"  {link}: sent {_mb(s['sent'])}, received {_mb(s['received'])}, "
                      f"{s['seconds']:.1f}s in calls")
    console.print(f"outputs in {cfg.out_dir} (curve.json, steps.csv, summary.json)")


@app.command("predict")
def predict(
    config: Annotated[Path, typer.Argument(help="SPLIT.toml")],
    split: Annotated[str, typer.Option("--split", help="the data owner's split: test or train")] = "test",
    out: Annotated[Path | None, typer.Option("--out", help="CSV of predictions (default out_dir/predictions.csv)")]
    = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override key=value")] = None,
    host: Annotated[Path | None, typer.Option("--host", help="PARTY.toml of a party to run inside this process "
                                              "(as for split train --host)")] = None,
) -> None:
    """Split inference on the data owner's samples; every party must consent to inference."""
    from contextlib import nullcontext

    from modelward.core.records import write_csv
    from modelward.errors import ConfigError
    from modelward.governance.driver import OutputsKept, SplitDriver, hosted_connect, load_split_config
    from modelward.governance.party.config import load_party_config
    from modelward.governance.transport.server import hosted_party

    if split not in ("train", "test"):
        raise ConfigError(f"--split {split!r}: valid choices: train, test")
    cfg = load_split_config(config, set_)
    out = out or Path(cfg.out_dir) / "predictions.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with hosted_party(load_party_config(host)) if host is not None else nullcontext() as party, \
            SplitDriver(cfg, connect=None if party is None else hosted_connect(party, cfg)) as drv:
        drv.open(train=False)
        try:
            got = drv.predict(split)
        except OutputsKept as e:  # the label holder's default: nothing leaves it
            console.print(f"nothing written here: {e}")
            return
        links = drv.link_summary()
    if got.is_floating_point():  # log-probabilities (logits up to a constant)
        pred = got.argmax(1)
        cols = ["index", "prediction", *[f"logit_{k}" for k in range(got.shape[1])]]
        rows = [[i, p, *[f"{v:.6g}" for v in row]] for i, (p, row) in enumerate(zip(pred.tolist(), got.tolist(),
                                                                                       strict=True))]
    elif got.dim() == 2:  # the k best classes
        pred = got[:, 0]
        cols = ["index", "prediction", *[f"top_{k + 2}" for k in range(got.shape[1] - 1)]]
        rows = [[i, *row] for i, row in enumerate(got.tolist())]
    else:  # labels only
        pred = got
        cols = ["index", "prediction"]
        rows = [[i, p] for i, p in enumerate(got.tolist())]
    write_csv(out, [dict(zip(cols, r, strict=True)) for r in rows], cols)
    (out.with_suffix(".links.json")).write_text(json.dumps(links, indent=2))
    console.print(f"{len(pred)} predictions written to {out}")


@app.command("audit-leakage")
def audit_leakage(
    config: Annotated[Path, typer.Argument(help="LEAKAGE.toml ([data], [model], cut, [train], [audit])")],
    out: Annotated[Path, typer.Option("--out", help="output folder (re-run to resume)")],
    workers: Annotated[int, typer.Option("--workers", help="parallel runs (processes)")] = 1,
    transport: Annotated[str, typer.Option("--transport", help="inprocess (fast) or parties (real party processes "
                                           "with mutual TLS on 127.0.0.1; Alice's server records what it gets)")]
    = "inprocess",
    set_: Annotated[list[str] | None, typer.Option("--set", help="override key=value")] = None,
) -> None:
    """Measure how much of Bob's labels Alice recovers from the gradients he returns (norm and direction attacks,
    Li et al. 2022), without and with Bob's gradient protection; writes results.csv/md/json and tradeoff.png. With
    an [inputs] table, also how well Bob reconstructs Alice's inputs from her activations (decoder, UnSplit, FSHA
    hijacking), without and with Alice's defenses: inputs.csv/md/json and reconstructions_*.png."""
    from modelward.core.progress import RichProgress
    from modelward.core.records import markdown_table
    from modelward.errors import ConfigError
    from modelward.governance.leakage.study import load_audit_config, run_audit

    if transport not in ("inprocess", "parties"):
        raise ConfigError(f"--transport {transport!r}: valid choices: inprocess, parties")
    cfg = load_audit_config(config, set_)
    with RichProgress(console) as progress:
        rows = run_audit(cfg, out, workers=workers, progress=progress, transport=transport)  # type: ignore[arg-type]
    cols = ["method", "scale", "test_accuracy", "norm_auc", "direction_auc", "direction_auc_acc"]
    print(markdown_table(rows, cols, 3), end="")  # plain: a table must not be wrapped
    sfx = "_parties" if transport == "parties" else ""
    console.print(f"results in {out.resolve()} (results{sfx}.md/.csv/.json, runs{sfx}.json, tradeoff{sfx}.png)")
    inputs = out / "inputs.json"
    if transport == "inprocess" and cfg.inputs.attacks and inputs.is_file():  # Bob reconstructing Alice's inputs
        rows = json.loads(inputs.read_text())
        cols = ["defense", "attack", "test_accuracy", "ssim", "mse", "other_ssim", "other_mse", "mean_ssim",
                "mean_mse", "canary_auc"]
        print(markdown_table(rows, [c for c in cols if any(c in r for r in rows)], 3), end="")
        console.print(f"input reconstruction in {out.resolve()} (inputs.md/.csv/.json, reconstructions_*.png)")


@app.command("audit-extraction")
def audit_extraction(
    config: Annotated[Path, typer.Argument(help="EXTRACTION.toml ([data], [model], cut, [train], policy_file, "
                                           "[party], [attacks])")],
    out: Annotated[Path, typer.Option("--out", help="output folder")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override key=value")] = None,
) -> None:
    """What a neighbour gets for its budget: train a split as two real party processes under Bob's policy, then
    run the neighbour attacks (surrogates from predict and eval, labels from answers and gradients) until Bob
    refuses; writes extraction.csv/json/png beside the cost of completing Bob's part from scratch."""
    from modelward.core.progress import RichProgress
    from modelward.core.records import markdown_table
    from modelward.governance.extraction_audit import load_extraction_config, run_extraction_audit

    cfg = load_extraction_config(config, set_)
    with RichProgress(console) as progress:
        summary = run_extraction_audit(cfg, out, progress=progress)
    rows = [{k: p[k] for k in ("attack", "rows", "agreement", "refused", "chance")} for p in summary["points"]]
    print(markdown_table(rows, ["attack", "rows", "agreement", "refused", "chance"], 3), end="")
    for p in summary["points"]:  # (its agreement column is the accuracy Bob lost: the note says what happened)
        if p["attack"] == "slow_poisoning":
            console.print(f"slow poisoning: {p['note']}")
    console.print(f"test accuracy {summary['test_accuracy']:.3f}; completion from scratch with labels: "
                  f"{summary['completion_rows']} rows to agreement {summary['completion_target']:.3f}")
    console.print(f"results in {out.resolve()} (extraction.csv, extraction.json, extraction.png)")


@app.command("revoke")
def revoke(
    name: Annotated[str, typer.Argument(help="the party to revoke, e.g. bob")],
    config: Annotated[Path, typer.Argument(help="SPLIT.toml (the driver's)")],
) -> None:
    """Revoke party NAME at the driver: its pin goes on the driver's deny-list (revoked_file), checked at every
    connection and before every call; a running driver stops calling NAME from its next call on."""
    from modelward.governance.driver.config import load_split_config, revoke_party

    path, fp, added = revoke_party(load_split_config(config), name)
    print(f"{'revoked' if added else 'already revoked'}: {name} {fp} (deny-list {path})")
