"""A ledger or a disk that cannot be trusted gives one line naming the file and what to do (issue 31 item 8)."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from modelward.core.ledger import RunLedger
from modelward.core.records import atomic_write_text
from modelward.core.runner import DamagedDependency, RunSpec, run_plan
from modelward.errors import LedgerError

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_a_zero_byte_ledger_beside_results_is_refused_not_restarted(tmp_path):
    (tmp_path / "ledger.sqlite").write_bytes(b"")
    (tmp_path / "results.csv").write_text("part,mc\nfc1,0.5\n")
    with pytest.raises(LedgerError, match=r"ledger.sqlite: the ledger is empty \(0 bytes\) but this folder holds "
                                          r"results \(results.csv\)"):
        RunLedger(tmp_path / "ledger.sqlite")
    fresh = tmp_path / "new"
    fresh.mkdir()
    (fresh / "ledger.sqlite").write_bytes(b"")  # nothing to lose: a new study starts
    assert RunLedger(fresh / "ledger.sqlite").counts()["done"] == 0


def test_a_damaged_or_foreign_ledger_is_named(tmp_path):
    (tmp_path / "ledger.sqlite").write_bytes(b"this is not a database, it is a text file" * 100)
    with pytest.raises(LedgerError, match="ledger.sqlite: the ledger is damaged or not a modelward ledger"):
        RunLedger(tmp_path / "ledger.sqlite")
    other = tmp_path / "other.sqlite"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE customers (id INTEGER)")
    db.commit()
    db.close()
    with pytest.raises(LedgerError, match=r"other.sqlite: this is not a modelward run ledger .*customers"):
        RunLedger(other)
    assert {r[0] for r in sqlite3.connect(other).execute("SELECT name FROM sqlite_master")} == {"customers"}


FULL_DISK = """
import resource, signal, sys
from modelward.core.ledger import RunLedger
from modelward.errors import LedgerError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
ledger = RunLedger(sys.argv[1])
ledger.add("r", {"v": 1})
ledger.start("r")
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
try:
    ledger.finish("r", {"blob": "x" * 1_000_000})
except LedgerError as e:
    print("LedgerError:", e)
"""


def test_a_full_disk_while_recording_is_one_line_and_loses_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC}
    r = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path / "ledger.sqlite")], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.stdout.startswith("LedgerError: ") and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert "ledger.sqlite: cannot write the ledger" in r.stdout and "run the same command again" in r.stdout
    assert len(r.stdout.strip().splitlines()) == 1
    assert RunLedger(tmp_path / "ledger.sqlite").status("r") == "running"  # nothing half-recorded


def test_the_cli_reports_a_full_disk_in_one_line(tmp_path):

    (tmp_path / "m.toml").write_text("input_shape = [4]\nnum_classes = 2\n[model]\narch = \"mlp\"\nhidden = [3]\n")

    # the file-size limit is set by a launcher that then execs the CLI, not by preexec_fn: a fork of this worker,
    # which may hold gRPC's threads from earlier tests, runs gRPC's fork handlers and can abort the child before
    # its exec (seen in a shuffled run); a limit and an ignored SIGXFSZ survive exec
    launcher = ("import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
                "resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16)); "
                "os.execv(sys.executable, [sys.executable, '-m', 'modelward.cli.main', *sys.argv[1:]])")
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONDONTWRITEBYTECODE": "1"}
    r = subprocess.run([sys.executable, "-c", launcher, "parts", "--model", "m.toml", "--csv", "parts.csv"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "cannot write" in r.stderr and "parts.csv" in r.stderr and "Free some space" in r.stderr
    assert not (tmp_path / "parts.csv").exists() and not list(tmp_path.glob(".parts.csv.*"))


def _produce(folder: str, run_id: str, spec: dict, deps: dict) -> dict:
    """'orig' writes a checkpoint; 're' reads it and reports DamagedDependency when it is not what was written."""
    ckpt = Path(folder, "orig.ckpt")
    with open(Path(folder, "calls.log"), "a") as f:
        f.write(run_id + "\n")
    if run_id == "orig":
        ckpt.write_text("weights")
        return {"ok": True}
    if not ckpt.is_file() or ckpt.read_text() != "weights":
        raise DamagedDependency("orig", f"{ckpt}: not a valid checkpoint")
    return {"read": ckpt.read_text()}


def test_a_damaged_dependency_output_is_recreated_then_its_dependents_run(tmp_path):
    plan = [RunSpec("orig", {}), RunSpec("re1", {}, ("orig",)), RunSpec("re2", {}, ("orig",))]
    ledger = RunLedger(tmp_path / "ledger.sqlite")
    run_plan(ledger, plan[:1], partial(_produce, str(tmp_path)))
    (tmp_path / "orig.ckpt").write_text("garbage")  # the finished original's checkpoint is damaged
    out = run_plan(ledger, plan, partial(_produce, str(tmp_path)))
    assert out.complete and out.failed == {}, out.failed
    calls = (tmp_path / "calls.log").read_text().split()
    assert calls.count("orig") == 2 and calls.count("re1") == 2 and calls.count("re2") == 1, calls
    assert ledger.results()["re1"] == {"read": "weights"}


def _always_damaged(folder: str, run_id: str, spec: dict, deps: dict) -> dict:
    if run_id == "orig":
        return {"ok": True}
    raise DamagedDependency("orig", f"{folder}/orig.ckpt: not a valid checkpoint")


def test_a_dependency_damaged_again_after_recreating_is_reported_as_it_is(tmp_path):
    ledger = RunLedger(tmp_path / "ledger.sqlite")
    out = run_plan(ledger, [RunSpec("orig", {}), RunSpec("re", {}, ("orig",))], partial(_always_damaged,
                                                                                         str(tmp_path)))
    assert list(out.failed) == ["re"]
    assert "orig.ckpt: not a valid checkpoint" in out.failed["re"] and "still damaged" in out.failed["re"]


def test_result_files_get_the_users_umask_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "report.html", "<html></html>")
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
    old = os.umask(0o077)
    try:
        p = atomic_write_text(tmp_path / "private.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_a_garbled_result_is_a_clear_error_and_loses_nothing(tmp_path):
    import sqlite3

    from modelward.core.ledger import RunLedger
    from modelward.errors import LedgerError

    led = RunLedger(tmp_path / "ledger.sqlite")
    for r in ("a", "b"):
        led.add(r, {"i": r})
        led.start(r)
        led.finish(r, {"acc": 0.5})
    db = sqlite3.connect(tmp_path / "ledger.sqlite")
    db.execute("UPDATE runs SET result = '{\"acc\": 0.' WHERE run_id = 'b'")  # a torn write
    db.commit()
    db.close()
    with pytest.raises(LedgerError, match=r"run\(s\) 'b' is damaged .*nothing was changed"):
        led.results()
    assert led.status("a") == "done" and led.status("b") == "done"  # nothing changed
    assert led.reopen("b") and led.results() == {"a": {"acc": 0.5}}
