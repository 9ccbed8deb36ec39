"""The guard's state under a full disk and crashes: budget, centroids and log row commit together or not at all,
and a restart always succeeds (issue 31, item 2). The write error is injected into the real database: a trigger
makes the insert of a centroid (or of a log row) fail inside the request's transaction, as a full disk would."""

from __future__ import annotations

import os
import sqlite3

import pytest
import torch

from modelward.core.zoo import ModelConfig, build_model
from modelward.extraction.guard.process import write_guard_config
from modelward.extraction.guard.service import build_service

KEY = "state-test-key-unlimited"
SHAPE, K = (1, 4, 4), 5
TABLE = "centroids_tiny_modelguard_s"
#: the shipped configuration: the answer watermark and the detector on, with their defaults (issue #37 item 6)
SHIPPED = {"watermark": {}, "detector": {}}


@pytest.fixture
def guard_path(tmp_path):
    cfg = ModelConfig(arch="mlp", hidden=[16])
    torch.manual_seed(0)
    model = build_model(cfg, SHAPE, K)
    return write_guard_config(tmp_path, model, cfg, SHAPE, K, defense="modelguard_s",
                              defense_params={"epsilon": 0.05}, keys={KEY: 10_000}, name="tiny", ownership=SHIPPED)


def _fail_inserts(path, table: str) -> None:  # noqa: ANN001 - every insert into `table` fails from now on
    db = sqlite3.connect(str(path.parent / "guard_state" / "queries.sqlite"))
    db.execute(f"CREATE TRIGGER fail_{table} BEFORE INSERT ON {table} "
               "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")
    db.commit()
    db.close()


def _free_disk(path, table: str) -> None:  # noqa: ANN001
    db = sqlite3.connect(str(path.parent / "guard_state" / "queries.sqlite"))
    db.execute(f"DROP TRIGGER fail_{table}")
    db.commit()
    db.close()


def _crash(svc) -> None:  # noqa: ANN001 - kill -9: no shutdown snapshot, the lock file stays (stale)
    svc._closed = True
    svc.log.close()
    svc._folder_lock.release()


def _rows(path, sql: str):  # noqa: ANN001, ANN202
    db = sqlite3.connect(str(path.parent / "guard_state" / "queries.sqlite"))
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def test_a_full_disk_charges_nothing_keeps_no_centroid_and_a_restart_succeeds(guard_path):
    g = torch.Generator().manual_seed(5)
    xs = [torch.rand(8, *SHAPE, generator=g) * 4 for _ in range(4)]
    svc = build_service(guard_path)
    key = svc.keys[KEY]
    first = svc.answer(key, xs[0])[0]
    n0, used0 = svc.defense.num_centroids, svc.log.used(key.name)
    logged0 = _rows(guard_path, "SELECT COUNT(*) FROM queries")[0][0]
    assert n0 > 0 and used0 == 8 and logged0 == 1
    # the centroid rows cannot be written (request 1), then the log row cannot (request 2: its centroids were
    # written in the same transaction and must go too)
    for x, table in ((xs[1], TABLE), (xs[2], "queries")):
        _fail_inserts(guard_path, table)
        with pytest.raises(sqlite3.Error, match="full"):
            svc.answer(key, x)
        # nothing of the failed request stays: no charge, no centroid in memory or on disk, no log row
        assert svc.defense.num_centroids == n0 and svc.log.used(key.name) == used0
        assert _rows(guard_path, "SELECT COUNT(*) FROM queries")[0][0] == logged0
        assert _rows(guard_path, f"SELECT COUNT(*) FROM {TABLE}")[0][0] == n0
        _free_disk(guard_path, table)  # the operator frees space; the server goes on
    later = svc.answer(key, xs[3])[0]
    n1 = svc.defense.num_centroids
    assert n1 > n0 and svc.log.used(key.name) == used0 + 8
    _crash(svc)
    svc = build_service(guard_path)  # restarts on what the crash left, every centroid in order
    assert svc.defense.num_centroids == n1
    assert torch.equal(svc.answer(key, xs[0])[0], first) and torch.equal(svc.answer(key, xs[3])[0], later)
    svc.close()


def test_a_gap_left_by_an_older_version_is_repaired_not_refused(guard_path):
    g = torch.Generator().manual_seed(6)
    svc = build_service(guard_path)
    key = svc.keys[KEY]
    svc.answer(key, torch.rand(16, *SHAPE, generator=g) * 4)
    n = svc.defense.num_centroids
    assert n >= 3
    _crash(svc)
    db = sqlite3.connect(str(guard_path.parent / "guard_state" / "queries.sqlite"))
    db.execute(f"DELETE FROM {TABLE} WHERE seq = 1")  # the row a failed append never wrote
    db.commit()
    db.close()
    svc = build_service(guard_path)  # before: "centroid rows are not contiguous ... --reset"
    assert svc.defense.num_centroids == n - 1
    seqs = [r[0] for r in _rows(guard_path, f"SELECT seq FROM {TABLE} ORDER BY seq")]
    assert seqs == list(range(n - 1))  # renumbered: the next append continues the sequence
    svc.answer(key, torch.rand(16, *SHAPE, generator=g) * 4)
    m = svc.defense.num_centroids
    _crash(svc)
    svc = build_service(guard_path)
    assert svc.defense.num_centroids == m
    svc.close()


def test_a_damaged_snapshot_is_rebuilt_from_the_centroid_rows(guard_path):
    g = torch.Generator().manual_seed(7)
    x = torch.rand(16, *SHAPE, generator=g) * 4
    svc = build_service(guard_path)
    first = svc.answer(svc.keys[KEY], x)[0]
    n = svc.defense.num_centroids
    svc.close()
    snap = next((guard_path.parent / "guard_state").glob("*.state.safetensors"))
    snap.write_bytes(snap.read_bytes()[: 40])  # torn write of the shutdown snapshot
    svc = build_service(guard_path)
    assert svc.defense.num_centroids == n
    assert torch.equal(svc.answer(svc.keys[KEY], x)[0], first)
    svc.close()


def test_non_finite_weights_are_refused_by_guard_check_and_at_start(guard_path, capsys):
    from modelward.cli.main import main
    from modelward.core.io import load_state_dict, save_state_dict
    from modelward.errors import ConfigError

    ckpt = guard_path.parent / "model.safetensors"
    state, meta = load_state_dict(ckpt)
    state = dict(state)
    first = sorted(state)[0]
    state[first] = state[first].clone()
    state[first].view(-1)[0] = float("nan")
    save_state_dict(ckpt, state, meta)
    with pytest.raises(SystemExit) as e:
        main(["guard", "check", str(guard_path)])
    err = " ".join(capsys.readouterr().err.split())
    assert e.value.code == 2 and "non-finite weights" in err and first in err and "1 NaN" in err
    with pytest.raises(ConfigError, match="non-finite"):
        build_service(guard_path)


def test_the_event_loop_path_never_waits_for_a_locked_store(guard_path):
    import json
    import time

    from modelward.extraction.guard.errors import WouldBlock

    svc = build_service(guard_path)
    key = svc.keys[KEY]
    x = torch.rand(3, *SHAPE, generator=torch.Generator().manual_seed(8)) * 4
    body = json.dumps({"inputs": [{"name": "input", "shape": [3, *SHAPE], "datatype": "FP32",
                                   "data": x.flatten().tolist()}]}).encode()
    lock = sqlite3.connect(str(guard_path.parent / "guard_state" / "queries.sqlite"), isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        t0 = time.monotonic()
        with pytest.raises(WouldBlock):
            svc.handle(key, body, None, wait=False)
        assert time.monotonic() - t0 < 1.0  # not the 5 s busy timeout
        assert svc.defense.num_centroids == 0 and svc.log.used(key.name) == 0
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    ans = svc.handle(key, body, None, wait=False)
    assert ans.rows == 3 and svc.log.used(key.name) == 3 and svc.defense.num_centroids > 0
    svc.close()


@pytest.fixture
def small_disk(tmp_path):
    """A 384 KiB tmpfs (a real full disk: ENOSPC); skipped where mounting is not allowed (needs root)."""
    import subprocess

    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=384k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_really_full_disk_loses_nothing_and_a_restart_after_freeing_space_succeeds(tmp_path, small_disk):
    cfg = ModelConfig(arch="mlp", hidden=[16])
    torch.manual_seed(0)
    model = build_model(cfg, SHAPE, K)
    path = write_guard_config(tmp_path / "cfg", model, cfg, SHAPE, K, defense="modelguard_s",
                              defense_params={"epsilon": 0.02}, keys={KEY: None}, name="tiny",
                              server={"state_dir": str(small_disk / "state")}, ownership=SHIPPED)
    svc = build_service(path)
    key = svc.keys[KEY]
    filler = small_disk / "filler"
    free = small_disk / "free"
    free.write_bytes(b"\0" * 64 * 1024)  # what the operator will delete to free space
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # fill the disk, then leave the guard 160 KiB (watermark and detector rows take room too)
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - 160 * 1024))
    g = torch.Generator().manual_seed(9)
    answered: list[torch.Tensor] = []
    failures = 0
    for _ in range(400):  # distinct inputs: every request adds centroids until the disk is full
        x = torch.rand(16, *SHAPE, generator=g) * 6
        try:
            svc.answer(key, x)
            answered.append(x)
        except (sqlite3.Error, OSError):
            failures += 1
            if failures >= 3:
                break
    assert failures >= 3, "the disk never filled up"
    n, used = svc.defense.num_centroids, svc.log.used(key.name)
    assert used == 16 * len(answered)  # the failed requests were not charged
    db = sqlite3.connect(str(small_disk / "state" / "queries.sqlite"))
    assert db.execute("SELECT COUNT(*), MAX(seq) FROM centroids_tiny_modelguard_s").fetchone() == (n, n - 1)
    assert db.execute("SELECT COUNT(*), SUM(rows) FROM queries WHERE code='ok'").fetchone() == (len(answered), used)
    db.close()
    svc.close()  # the snapshot cannot be written on the full disk: logged, not raised; the rows are the record
    free.unlink()  # the operator frees space
    svc = build_service(path)
    assert svc.defense.num_centroids == n and svc.log.used(key.name) == used
    svc.answer(key, torch.rand(4, *SHAPE, generator=g) * 6)
    svc.close()


# ---------------------------------------------------------------------------------------------- issue #37 items 2, 6
def test_a_failed_request_leaves_no_trace_in_the_detector(guard_path):
    """The test that fails without the ownership rollback: a request whose transaction fails after the detector
    judged its batch must leave memory exactly as the store holds it (the detector's update of the failed request
    is dropped; before, the whole detector was rebuilt from every stored row), and the next requests go on from
    there as a restarted server would."""
    import numpy as np

    g = torch.Generator().manual_seed(11)
    svc = build_service(guard_path)
    key = svc.keys[KEY]
    for _ in range(4):
        svc.answer(key, torch.rand(16, *SHAPE, generator=g) * 4)
    det = svc.ownership.detector
    _fail_inserts(guard_path, "queries")  # the answer's own log row fails: after the model, defense and detector
    with pytest.raises(sqlite3.Error, match="full"):
        svc.answer(key, torch.rand(16, *SHAPE, generator=g) * 4)
    _free_disk(guard_path, "queries")
    mem, stored = det.cached(key.name), svc.log.load_detector_state(key.name)
    assert mem.queries == stored.queries == 64 and mem.version == stored.version
    assert mem.nd == stored.nd and mem.member_seq == stored.member_seq and np.array_equal(mem.window, stored.window)
    x = torch.rand(16, *SHAPE, generator=g) * 4
    svc.answer(key, x)
    live = det.cached(key.name)
    _crash(svc)
    svc = build_service(guard_path)
    again = svc.log.load_detector_state(key.name)
    assert again.queries == live.queries == 80 and np.array_equal(again.window, live.window)
    assert again.member_seq == live.member_seq and again.stats == live.stats
    svc.close()


def test_refusals_and_failures_cost_the_same_whatever_the_history(tmp_path):
    """A 429, a refused request on a busy store and a failed transaction do a constant amount of store work: the
    SQLite VM's instruction count (its progress handler, no clock) is the same after 2 and after 60 answered
    requests (before, each error re-read every detector row of every key: ~190k rows after 12 min of traffic)."""
    cfg = ModelConfig(arch="mlp", hidden=[16])
    torch.manual_seed(0)
    model = build_model(cfg, SHAPE, K)
    spent = "state-test-key-budget-8"
    path = write_guard_config(tmp_path, model, cfg, SHAPE, K, defense="modelguard_s",
                              defense_params={"epsilon": 0.05}, keys={KEY: None, spent: 8}, name="tiny",
                              ownership=SHIPPED)
    svc = build_service(path)
    big, small = svc.keys[KEY], svc.keys[spent]
    g = torch.Generator().manual_seed(12)
    svc.answer(small, torch.rand(8, *SHAPE, generator=g))

    def work() -> dict[str, int]:
        ticks = {"n": 0}

        def tick() -> int:
            ticks["n"] += 1
            return 0

        out = {}
        svc.log.db.set_progress_handler(tick, 50)
        try:
            for name, fn in (("429", lambda: svc.answer(small, torch.rand(4, *SHAPE, generator=g))),
                             ("failed", lambda: svc.answer(big, torch.rand(4, *SHAPE, generator=g)))):
                ticks["n"] = 0
                if name == "failed":
                    _fail_inserts(path, "queries")
                try:
                    with pytest.raises(Exception):  # noqa: B017, PT011 - a 429 or the injected failure
                        fn()
                finally:
                    if name == "failed":
                        svc.log.db.set_progress_handler(None, 0)
                        _free_disk(path, "queries")
                        svc.log.db.set_progress_handler(tick, 50)
                out[name] = ticks["n"]
        finally:
            svc.log.db.set_progress_handler(None, 0)
        return out

    svc.answer(big, torch.rand(64, *SHAPE, generator=g) * 4)
    early = work()
    for _ in range(60):  # 3,840 more answered rows: thousands of detector and log rows
        svc.answer(big, torch.rand(64, *SHAPE, generator=g) * 4)
    late = work()
    assert 1000 <= svc.log.detector_rows()["prada_dist"] <= 1008  # the big key's window is full (and bounded)
    for name in early:
        assert late[name] <= early[name] + 20, (early, late)  # constant, not proportional to the history
    svc.close()
