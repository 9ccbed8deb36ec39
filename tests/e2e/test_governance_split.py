"""The documented quick start, as a user runs it: example configs from another folder, free ports written to
address files, CLI train/predict, audit verify against the other party's log, certificate mistakes fail fast."""

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from modelward.governance.transport.launch import spawn_party, stop_parties, wait_ready

EX = Path(__file__).resolve().parents[2] / "examples"
STEPS = 6


def _mw(*args, cwd, timeout=300):
    """The CLI as a user runs it from `cwd` (in this process: the parties are the subprocesses that matter)."""
    from modelward.cli.main import app

    old = os.getcwd()
    os.chdir(cwd)
    try:
        r = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    finally:
        os.chdir(old)
    return SimpleNamespace(returncode=r.exit_code, stdout=r.output, stderr="" if r.exception is None or
                           isinstance(r.exception, SystemExit) else repr(r.exception))


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory, exact_policy):
    """Both parties started from the shipped examples, run from an unrelated folder; state under `root`."""
    root = tmp_path_factory.mktemp("quick")
    r = _mw("party", "certs", "--out", root / "certs", "--parties", "alice,bob,operator", cwd=root)
    assert r.returncode == 0, r.stderr
    sets = {}
    for p, other in (("alice", "bob"), ("bob", "alice")):
        sets[p] = [f"checkpoint_dir={root / p / 'ckpt'}", f"audit_db={root / p / 'audit.db'}",
                   f"address_file={root / p / 'address'}", f"tls.ca={root / 'certs/ca.pem'}",
                   f"tls.cert={root / f'certs/{p}.pem'}", f"tls.key={root / f'certs/{p}.key'}",
                   f"peers.{other}.cert={root / f'certs/{other}.pem'}",
                   f"peers.operator.cert={root / 'certs/operator.pem'}", "init.test_seed=0", "threads=1",
                   # bounded influence scales some honest steps (BatchNorm's first running statistics, clipped
                   # rows): a run compared with monolithic training turns it off, as label protection below
                   "integrity.influence.enabled=false"]
    sets["bob"] += [exact_policy(root), "label_protection.method=none"]  # exact gradients: the run is compared with monolithic
    spawned = {p: spawn_party(EX / f"party_{p}.toml", root / f"{p}.log", sets[p]) for p in sets}
    procs = {p: wait_ready(proc, EX / f"party_{p}.toml", root / f"{p}.log", off) for p, (proc, off) in spawned.items()}
    yield root, procs
    stop_parties(list(procs.values()))


def _split_sets(root, steps=STEPS):
    out = []
    for i, p in enumerate(("alice", "bob")):
        out += ["--set", f"parties.{i}.address_file={root / p / 'address'}",
                "--set", f"parties.{i}.cert={root / f'certs/{p}.pem'}"]
    return out + ["--set", f"out_dir={root / 'driver'}", "--set", f"tls.ca={root / 'certs/ca.pem'}",
                  "--set", f"tls.cert={root / 'certs/operator.pem'}",
                  "--set", f"tls.key={root / 'certs/operator.key'}", "--set", f"train.steps={steps}",
                  "--set", "train.eval_every=3", "--set", "timeout_s=30"]


def test_quick_start_trains_like_monolithic_predicts_and_verifies(quickstart, assert_split_equals_monolithic):
    root, procs = quickstart
    r = _mw("split", "train", EX / "split_digits.toml", *_split_sets(root), cwd=root)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "alice<->bob" in r.stdout and ".." not in r.stdout.split("outputs in")[-1]
    assert (root / "driver/steps.csv").read_text().count("\n") == STEPS + 1
    summary = json.loads((root / "driver/summary.json").read_text())
    r = _mw("split", "predict", EX / "split_digits.toml", *_split_sets(root), cwd=root)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # bob's shipped policy keeps his outputs (issue 26): nothing reaches the driver, bob has them in his folder
    assert "bob keeps its outputs" in r.stdout and not (root / "driver/predictions.csv").exists(), r.stdout
    kept = sorted((root / "bob/ckpt/predictions").glob("*.csv"))
    lines = [ln for f in kept for ln in f.read_text().splitlines()[1:]]
    assert len(lines) == 360 and kept[0].read_text().startswith("index,prediction,logit_0")
    # the published heads (summary.json) and the cross-anchors: both verify
    head = summary["audit_heads"]["bob"][1]
    for extra in (["--head", head], ["--against", root / "alice/audit.db"]):
        r = _mw("audit", "verify", root / "bob/audit.db", *extra, cwd=root)
        assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    # monolithic equivalence through the test-only public seed (refused off loopback)
    assert_split_equals_monolithic(root, STEPS, 3)


def test_a_certificate_mistake_fails_fast_naming_the_certificate(quickstart):
    root, _ = quickstart
    r = _mw("party", "certs", "--out", root / "stranger", "--parties", "alice", cwd=root)
    assert r.returncode == 0, r.stderr
    t0 = time.monotonic()
    r = _mw("split", "train", EX / "split_digits.toml", *_split_sets(root),
            "--set", f"tls.ca={root / 'stranger/ca.pem'}", cwd=root)  # the driver trusts the wrong CA
    assert r.returncode != 0 and time.monotonic() - t0 < 60
    assert "stranger/ca.pem" in r.stdout + r.stderr and "Traceback" not in r.stdout + r.stderr
    r = _mw("split", "train", EX / "split_digits.toml", *_split_sets(root),
            "--set", f"tls.cert={root / 'stranger/alice.pem'}", "--set", f"tls.key={root / 'stranger/alice.key'}",
            cwd=root)  # a certificate the parties' CA did not sign
    assert r.returncode != 0 and "stranger/alice.pem" in r.stdout + r.stderr, r.stdout + r.stderr
