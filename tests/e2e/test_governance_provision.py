"""Provisioning against real processes (issue #27): three organisations' hosts (folders here) make their own keys,
the provisioner writes signed kits from their certificates, and

- a tampered kit (changed policy, changed pin, swapped certificate, added file, re-signed with another key, a kit of
  another party replayed, no consortium key given, the manifest deleted) is refused by `party serve` before the
  party starts: exit code 2, one line naming the file, no state written;
- the untampered kits start two real party servers and the driver's kit trains over them;
- a server revoked on the client side is refused by the caller within one step: by the driver (its deny-list), and by
  a party dialling its next party (its deny-list), which audits the refusal.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from modelward.core.config import to_toml
from modelward.core.ports import free_port
from modelward.errors import IdentityError
from modelward.governance.driver import SplitDriver, load_split_config
from modelward.governance.driver.config import revoke_party, split_revoked_path
from modelward.governance.party.config import load_party_config, revoke_peer
from modelward.governance.provisioning import provision
from modelward.governance.transport.launch import PartyProcess, stop_parties, wait_ready
from modelward.governance.trust.certs import keygen
from modelward.governance.trust.manifest import write_manifest

DIGITS = {"source": "digits", "seed": 0}


def _free_port() -> int:
    # written into the consortium file and bound only later by `party serve`: outside the ephemeral range, so that
    # no outgoing connection meanwhile (this test's, another xdist worker's) can take it first
    return free_port()


@pytest.fixture(scope="module")
def consortium(tmp_path_factory):
    """Keys made on each 'host', certificates sent to the provisioner, kits unpacked next to each host's keys."""
    root = tmp_path_factory.mktemp("consortium")
    hosts = {n: root / f"host_{n}" for n in ("alice", "bob", "operator")}
    for n, h in hosts.items():
        keygen(n, h / "keys")
    prov = root / "provisioner"
    prov.mkdir()
    cfg = {
        "name": "e2e", "input_shape": [1, 8, 8], "num_classes": 10,
        "model": {"arch": "cnn", "channels": [4, 8], "fc": 16},
        "parties": [
            {"name": "alice", "role": "inputs", "address": f"127.0.0.1:{_free_port()}", "layers": ["conv1"],
             "cert": str(hosts["alice"] / "keys/alice.pem"), "data": {"dataset": DIGITS},
             "policy": {"allow_peers": ["operator"], "training": True}, "settings": {"threads": 1}},
            {"name": "bob", "role": "labels", "address": f"127.0.0.1:{_free_port()}",
             "layers": ["conv2", "fc1", "logits"], "cert": str(hosts["bob"] / "keys/bob.pem"),
             "data": {"dataset": DIGITS}, "policy": {"allow_peers": ["alice", "operator"], "training": True},
             "settings": {"threads": 1}},
            {"name": "operator", "role": "driver", "cert": str(hosts["operator"] / "keys/operator.pem"),
             "settings": {"retry_s": 0.0}},
        ],
        "train": {"steps": 6, "batch_size": 16, "eval_every": 6, "eval_batch_size": 512, "lr": 0.05},
    }
    (prov / "consortium.toml").write_text(to_toml(cfg))
    res = provision(prov / "consortium.toml", prov / "kits")
    for n, h in hosts.items():  # each organisation receives its kit
        shutil.copytree(res.kits[n], h / "kit")
    return root, hosts, res


def _serve(kit: Path, log: Path, *args: str) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "modelward.cli.party", "serve", str(kit), *args],
                                stdout=fh, stderr=subprocess.STDOUT,
                                env={k: v for k, v in os.environ.items() if not k.startswith("MODELWARD_")})


def _tamper(case: str, kit: Path, hosts: dict[str, Path]) -> list[str]:
    """Change a copy of bob's kit as an attacker on the way would; returns extra `party serve` arguments."""
    party = tomllib.loads((kit / "party.toml").read_text())
    if case == "changed policy":  # lift Bob's limits
        (kit / "policy.toml").write_text((kit / "policy.toml").read_text() + "max_steps_total = 100000000\n")
    elif case == "changed pin":  # pin the attacker's certificate as "alice"
        mallory = keygen("alice", kit.parent / "mallory")["cert"].read_bytes()
        from modelward.governance.trust.identity import cert_fingerprint
        party["peers"]["alice"]["fingerprint"] = cert_fingerprint(mallory)
        (kit / "party.toml").write_text(to_toml(party))
    elif case == "swapped certificate":  # the trusted peer certificate replaced by the attacker's
        shutil.copy(keygen("alice", kit.parent / "mallory2")["cert"], kit / "peers/alice.pem")
    elif case == "added file":
        (kit / "peers/mallory.pem").write_bytes((kit / "peers/alice.pem").read_bytes())
    elif case == "re-signed with another key":
        (kit / "policy.toml").write_text((kit / "policy.toml").read_text() + "max_steps_total = 100000000\n")
        write_manifest(kit, Ed25519PrivateKey.generate(), consortium="e2e", party="bob", role="labels")
    elif case == "kit of another party":  # alice's kit, replayed on bob's host
        shutil.rmtree(kit)
        shutil.copytree(hosts["alice"] / "kit", kit)
    elif case == "no consortium key":
        return []
    elif case == "manifest deleted":  # served as a plain PARTY.toml on a host that serves verified kits only
        (kit / "MANIFEST.json").unlink()
    return ["--party", "bob"]


ATTACKS = {
    "changed policy": "file policy.toml was changed",
    "changed pin": "file party.toml was changed",
    "swapped certificate": "file peers/alice.pem was changed",
    "added file": "extra file peers/mallory.pem is not in MANIFEST.json",
    "re-signed with another key": "MANIFEST.json is signed by consortium key spki-sha256:[0-9a-f]+, not the expected",
    "kit of another party": "this kit is for party 'alice', not 'bob'",
    "no consortium key": "give the consortium key to check it against",
    "manifest deleted": "not a kit \\(no MANIFEST.json next to it\\), but a consortium key is given",
}


def test_a_tampered_kit_is_refused_before_the_party_starts(consortium):
    root, hosts, res = consortium
    procs = {}
    for i, case in enumerate(ATTACKS):
        kit = hosts["bob"] / f"attack{i}" / "kit"  # beside bob's keys as ../keys: only the kit is at fault
        shutil.copytree(hosts["bob"] / "kit", kit)
        shutil.copytree(hosts["bob"] / "keys", kit.parent / "keys")
        extra = _tamper(case, kit, hosts)
        key = ["--consortium-key", res.key_fingerprint] if case != "no consortium key" else []
        target = kit / "party.toml" if case == "manifest deleted" else kit
        procs[case] = (kit, _serve(target, kit.parent / "serve.log", *key, *extra))
    for case, (kit, proc) in procs.items():  # (they run in parallel: ~1.5 s each, no torch imported)
        assert proc.wait(timeout=120) == 2, case
        out = (kit.parent / "serve.log").read_text()
        lines = [ln for ln in out.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (case, out)
        assert re.search(ATTACKS[case], lines[0]), (case, lines[0])
        assert "READY" not in out
        assert not (kit.parent / "bob-state").exists(), case  # nothing started, nothing written


@pytest.mark.slow
def test_kits_start_two_parties_and_train_and_a_revoked_server_is_refused_by_its_caller(consortium):
    root, hosts, res = consortium
    key = ["--consortium-key", res.key_fingerprint]
    logs = {n: hosts[n] / "serve.log" for n in ("alice", "bob")}
    started = {n: _serve(hosts[n] / "kit", logs[n], *key, "--party", n) for n in ("bob", "alice")}
    procs: list[PartyProcess] = []
    try:
        for n, p in started.items():
            procs.append(wait_ready(p, hosts[n] / "kit", logs[n], 0, timeout=120))
        assert "kit verified: alice (inputs) of consortium e2e" in logs["alice"].read_text()
        cfg = load_split_config(hosts["operator"] / "kit/split.toml")
        assert cfg.retry_s == 0.0 and split_revoked_path(cfg) == hosts["operator"] / "operator-state/revoked.txt"

        # the driver's kit trains over the two parties started from kits (the happy path: steps 1-3); then the driver revokes bob: before the next step the driver checks every party of the chain
        # against its deny-list and refuses (no request sent, although a step goes only to alice)
        done: list[tuple[int, float]] = []

        def revoke_bob(step, loss, links):
            done.append((step, loss))
            if step == 3:
                revoke_party(cfg, "bob")

        with SplitDriver(cfg, pipeline=False) as drv:
            with pytest.raises(IdentityError, match=r"party bob at 127\.0\.0\.1:\d+ is refused by this side: its "
                                                    r"certificate sha256:[0-9a-f]+ is revoked \(bob, "):
                drv.train(on_step=revoke_bob)
        # (no step's own loss leaves bob: the hook sees the last released window, none yet; issue 36)
        assert [s for s, _ in done] == [1, 2, 3] and all(loss != loss for _, loss in done)

        # bob re-admitted by the driver; alice's organisation revokes bob: alice's client refuses to call him
        split_revoked_path(cfg).unlink()
        revoke_peer(load_party_config(hosts["alice"] / "kit/party.toml"), "bob")
        with SplitDriver(cfg, pipeline=False) as drv:
            with pytest.raises(IdentityError, match="party bob at .* is refused by this side: its certificate "
                                                    "sha256:[0-9a-f]+ is revoked"):
                drv.train()
            steps = {n: int(drv.call(n, "status").meta["step"]) for n in drv.names}
        # the refused steps were applied nowhere; nor was step 3, whose commit was due (travelling with step 4)
        # when the driver stopped talking to bob: every party holds the same step
        assert steps == {"alice": 2, "bob": 2}
    finally:
        stop_parties(procs)
        for p in started.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    db = sqlite3.connect(hosts["alice"] / "alice-state/audit.db")
    rows = db.execute("SELECT op, decision, reason FROM audit WHERE reason LIKE '%refused by this side%'").fetchall()
    db.close()
    assert rows and all(d == "error" for _, d, _ in rows), rows  # alice audited her refusal
