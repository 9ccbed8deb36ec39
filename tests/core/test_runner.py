import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
from pydantic import BaseModel

from modelward.core.ledger import RunLedger
from modelward.core.lock import LockedError
from modelward.core.progress import RecordingProgress
from modelward.core.runner import RunSpec, check_plan, run_plan
from modelward.errors import ConfigError, DataError, LedgerError


def execute(log: str, run_id: str, spec: dict, deps: dict) -> dict:
    """Appends the run id to `log` (to count executions) and sums its value with its dependencies' totals."""
    with open(log, "a") as f:
        f.write(run_id + "\n")
    if spec.get("fail_flag") and Path(spec["fail_flag"]).exists():
        raise DataError(f"{run_id}: asked to fail")
    if spec.get("die"):
        os._exit(1)  # the worker process dies abruptly
    if spec.get("sleep_flag") and not Path(spec["sleep_flag"]).exists():  # only the first time
        Path(spec["sleep_flag"]).write_text("started")
        time.sleep(60)
    return {"total": spec["v"] + sum(d["total"] for d in deps.values()), "pid": os.getpid()}


def diamond(tmp: Path, **extra: dict) -> list[RunSpec]:
    return [RunSpec("d", {"v": 1, **extra.get("d", {})}, ("b", "c")),
            RunSpec("b", {"v": 10, **extra.get("b", {})}, ("a",)),
            RunSpec("c", {"v": 100}, ("a",)),
            RunSpec("a", {"v": 1000, **extra.get("a", {})}),
            RunSpec("e", {"v": 5})]


def executions(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_dependencies_results_and_exactly_once_resume(tmp_path) -> None:
    ledger = RunLedger(tmp_path / "ledger.sqlite")
    log = tmp_path / "calls.log"
    rec = RecordingProgress()
    seen: list[str] = []
    out = run_plan(ledger, diamond(tmp_path), partial(execute, str(log)), progress=rec,
                   on_result=lambda rid, res: seen.append(rid) or f"{rid} done")
    assert (out.done, out.total, out.failed, out.blocked) == (5, 5, {}, [])
    res = ledger.results()
    assert res["d"]["total"] == 1 + (10 + 1000) + (100 + 1000)
    calls = executions(log)
    assert sorted(calls) == ["a", "b", "c", "d", "e"]
    assert calls.index("a") < calls.index("b") < calls.index("d") and calls.index("c") < calls.index("d")
    assert calls[0] == "a"  # runs others depend on go first
    assert seen == calls and rec.completed("runs") == 5 and rec.events[-1][0] == "done"
    again = run_plan(ledger, diamond(tmp_path), partial(execute, str(log)))
    assert again.done == 5 and executions(log) == calls  # nothing re-executed


def test_failure_blocks_dependents_and_retries_on_the_next_call(tmp_path) -> None:
    ledger = RunLedger(tmp_path / "ledger.sqlite")
    log, flag = tmp_path / "calls.log", tmp_path / "fail"
    flag.write_text("x")
    plan = diamond(tmp_path, b={"fail_flag": str(flag)})
    out = run_plan(ledger, plan, partial(execute, str(log)))
    assert out.failed["b"] == "b: asked to fail"
    assert out.blocked == ["d"] and "blocked" in out.failed["d"]
    assert out.done == 3 and ledger.status("b") == "failed" and "Traceback" in ledger.errors()["b"]
    assert "d" not in executions(log)
    flag.unlink()
    out = run_plan(ledger, plan, partial(execute, str(log)))
    assert out.complete and out.failed == {}
    assert executions(log).count("b") == 2 and executions(log).count("a") == 1


def test_fail_fast_reraises_the_original_error(tmp_path) -> None:
    ledger = RunLedger(tmp_path / "ledger.sqlite")
    flag = tmp_path / "fail"
    flag.write_text("x")
    with pytest.raises(DataError, match="asked to fail"):
        run_plan(ledger, diamond(tmp_path, a={"fail_flag": str(flag)}), partial(execute, str(tmp_path / "l")),
                 fail_fast=True)
    assert ledger.status("a") == "failed"


def test_malformed_plans_are_refused() -> None:
    with pytest.raises(ConfigError, match="duplicate"):
        check_plan([RunSpec("a", {}), RunSpec("a", {})])
    with pytest.raises(ConfigError, match="unknown run"):
        check_plan([RunSpec("a", {}, ("zz",))])
    check_plan([RunSpec("a", {}, ("zz",))], done={"zz"})  # a dependency finished earlier is fine
    with pytest.raises(ConfigError, match="cycle"):
        check_plan([RunSpec("a", {}, ("c",)), RunSpec("b", {}, ("a",)), RunSpec("c", {}, ("b",))])


def test_process_pool_runs_in_other_processes_and_survives_a_dying_worker(tmp_path) -> None:
    ledger = RunLedger(tmp_path / "ledger.sqlite")
    plan = [*diamond(tmp_path), RunSpec("x", {"v": 0, "die": True}, ("a",))]
    out = run_plan(ledger, plan, partial(execute, str(tmp_path / "calls.log")), workers=2)
    assert "x" in out.failed and ledger.status("x") == "failed" and "a" in ledger.results()
    # a run in flight next to the dying worker may fail with it (it is retried): a second call finishes the rest
    out = run_plan(ledger, plan[:-1], partial(execute, str(tmp_path / "calls.log")), workers=2)
    assert out.complete
    res = ledger.results()
    assert res["d"]["total"] == 2111 and all(r["pid"] != os.getpid() for r in res.values())


class Cfg(BaseModel):
    lr: float
    threads: int = 1


def test_bind_config_is_the_one_fingerprint(tmp_path) -> None:
    ledger = RunLedger(tmp_path / "ledger.sqlite")
    fp = ledger.bind_config(Cfg(lr=0.1), exclude={"threads"})
    assert ledger.bind_config(Cfg(lr=0.1, threads=4), exclude={"threads"}) == fp
    with pytest.raises(LedgerError, match="different 'config'"):
        ledger.bind_config(Cfg(lr=0.2), exclude={"threads"})
    old = RunLedger(tmp_path / "old.sqlite")
    old.check_meta("config", "legacy-fingerprint")  # a folder written before bind_config existed
    with pytest.raises(LedgerError):
        old.bind_config(Cfg(lr=0.1))
    assert old.bind_config(Cfg(lr=0.1), legacy=("legacy-fingerprint",)) == old.get_meta("config")
    with pytest.raises(LedgerError):  # a legacy value of another config is not upgraded
        RunLedger(tmp_path / "old.sqlite").bind_config(Cfg(lr=0.5), legacy=("something-else",))


DRIVER = """
import sys
from functools import partial
sys.path.insert(0, sys.argv[2])
from test_runner import diamond, execute
from modelward.core.ledger import RunLedger
from modelward.core.runner import run_plan
from pathlib import Path
tmp = Path(sys.argv[1])
plan = diamond(tmp, b={"sleep_flag": str(tmp / "sleeping")})
run_plan(RunLedger(tmp / "ledger.sqlite"), plan, partial(execute, str(tmp / "calls.log")))
"""


def test_kill_9_mid_run_resumes_without_redoing_finished_runs(tmp_path) -> None:
    plan = diamond(tmp_path, b={"sleep_flag": str(tmp_path / "sleeping")})
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), str(Path(__file__).parent)])
    try:
        deadline = time.time() + 60
        while not (tmp_path / "sleeping").exists():
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.05)
        ledger = RunLedger(tmp_path / "ledger.sqlite")
        with pytest.raises(LockedError, match=f"pid {proc.pid}"):
            run_plan(ledger, plan, partial(execute, str(tmp_path / "calls.log")))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert ledger.status("a") == "done" and ledger.status("b") == "running"
    before = executions(tmp_path / "calls.log")
    out = run_plan(ledger, plan, partial(execute, str(tmp_path / "calls.log")))
    assert out.complete
    after = executions(tmp_path / "calls.log")
    assert after.count("a") == 1 and after.count("b") == 2  # finished run kept, interrupted one redone
    assert len(after) - len(before) == 5 - before.count("a")
