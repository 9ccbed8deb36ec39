"""Revocation that a replay cannot undo (issue 36 item 5), against the real commands.

The provisioner signs kits at consortium version 1, then revokes alice at version 2. Bob's host accepts version 2;
the older kit — validly signed, still trusting alice — replayed on bob's host is refused by `party serve`,
`party start` and the kit's own start.sh, also after bob's state folder is deleted (the mark beside his key
survives). And a kit whose start.sh (or any other file) was changed runs nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modelward.core.config import to_toml
from modelward.errors import ConfigError
from modelward.governance.provisioning import open_party_kit, provision
from modelward.governance.trust.certs import keygen
from modelward.governance.trust.identity import cert_fingerprint
from modelward.governance.trust.versions import KitVersionError

DIGITS = {"source": "digits", "seed": 0}
BIN = str(Path(sys.executable).parent)  # where `modelward` is, for start.sh


def _consortium(hosts: dict[str, Path], revoked: list[str]) -> dict:
    return {
        "name": "versions", "input_shape": [1, 8, 8], "num_classes": 10,
        "model": {"arch": "cnn", "channels": [4, 8], "fc": 16}, "revoked": revoked,
        "parties": [
            {"name": "alice", "role": "inputs", "address": "127.0.0.1:50991", "layers": ["conv1"],
             "cert": str(hosts["alice"] / "keys/alice.pem"), "data": {"dataset": DIGITS},
             "policy": {"allow_peers": ["operator"], "training": True}},
            {"name": "bob", "role": "labels", "address": "127.0.0.1:50992", "layers": ["conv2", "fc1", "logits"],
             "cert": str(hosts["bob"] / "keys/bob.pem"), "data": {"dataset": DIGITS},
             "policy": {"allow_peers": ["alice", "operator"], "training": True}},
            {"name": "operator", "role": "driver", "cert": str(hosts["operator"] / "keys/operator.pem")},
        ],
    }


@pytest.fixture(scope="module")
def kits(tmp_path_factory):
    """Kits of version 1, then of version 2 that revokes alice; bob's host holds both (kit-v1, kit-v2)."""
    root = tmp_path_factory.mktemp("versions")
    hosts = {n: root / f"host_{n}" for n in ("alice", "bob", "operator")}
    for n, h in hosts.items():
        keygen(n, h / "keys")
    prov = root / "provisioner"
    prov.mkdir()
    (prov / "consortium.toml").write_text(to_toml(_consortium(hosts, [])))
    v1 = provision(prov / "consortium.toml", prov / "kits-v1")
    alice_pin = cert_fingerprint((hosts["alice"] / "keys/alice.pem").read_bytes())
    (prov / "consortium.toml").write_text(to_toml(_consortium(hosts, [alice_pin])))
    v2 = provision(prov / "consortium.toml", prov / "kits-v2")
    assert (v1.version, v2.version) == (1, 2) and v1.key_fingerprint == v2.key_fingerprint
    for v, res in (("v1", v1), ("v2", v2)):
        shutil.copytree(res.kits["bob"], hosts["bob"] / f"kit-{v}")
    (prov / "consortium.toml").write_text(to_toml({**_consortium(hosts, [alice_pin]), "version": 2}))
    with pytest.raises(ConfigError, match="version: 2 is not above 2"):  # the provisioner never signs one twice
        provision(prov / "consortium.toml", prov / "kits-again")
    return hosts, v2.key_fingerprint, alice_pin


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELWARD_")}
    return {**env, "PATH": f"{BIN}:{env.get('PATH', '')}", **extra}


def _party(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "modelward.cli.party", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_env())


def _sh(script: Path, key: str) -> subprocess.Popen:
    return subprocess.Popen(["/bin/sh", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(MODELWARD_CONSORTIUM_KEY=key))


def _done(p: subprocess.Popen) -> tuple[int, str]:
    out, _ = p.communicate(timeout=120)
    return p.returncode, out


def test_an_older_validly_signed_kit_is_refused_after_a_newer_one(kits):
    hosts, key, alice_pin = kits
    bob = hosts["bob"]
    open_party_kit(bob / "kit-v1", key, "bob")  # bob started from version 1 once (what `party serve` does first)
    open_party_kit(bob / "kit-v2", key, "bob")  # then from version 2, which revokes alice
    assert alice_pin in (bob / "bob-state/revoked.txt").read_text()
    marks = [bob / "bob-state/kit-versions.json", bob / "keys/bob.key.kit-versions.json"]
    assert all(p.is_file() for p in marks)
    # the old kit, replayed on bob's host: every way to start it is refused before anything runs (the commands
    # run in parallel: no torch is imported on the way to a refusal)
    serve = _party("serve", str(bob / "kit-v1"), "--consortium-key", key, "--party", "bob")
    code, out = _done(serve)
    assert code == 2 and "this kit is version 1, older than version 2 this host has accepted" in out, out
    assert "READY" not in out and not (bob / "bob-state/audit.db").exists()
    # ... also with bob's state folder gone (deleted, or an old backup restored): the mark beside his key holds
    shutil.rmtree(bob / "bob-state")
    with pytest.raises(KitVersionError, match=r"older than version 2 .*bob\.key\.kit-versions\.json"):
        open_party_kit(bob / "kit-v1", key, "bob")
    assert not (bob / "bob-state/revoked.txt").exists()  # refused before its deny-list was merged
    procs = {"start": _party("start", str(bob / "kit-v1"), "--consortium-key", key, "--party", "bob"),
             "start.sh": _sh(bob / "kit-v1/start.sh", key),
             # the current kit still starts: verified, then its start.sh runs (here serve's --help: no server)
             "current": _party("start", str(bob / "kit-v2"), "--consortium-key", key, "--party", "bob", "--",
                               "--help")}
    done = {k: _done(p) for k, p in procs.items()}
    for k in ("start", "start.sh"):
        assert done[k][0] == 2 and "older than version 2" in done[k][1], (k, done[k])
    assert not (bob / "bob-state/audit.db").exists()
    assert done["current"][0] == 0 and "kit OK: bob (labels) of consortium versions, version 2" in done["current"][1]
    assert "Serve this party's segment" in done["current"][1], done["current"][1]


def test_a_tampered_start_script_or_kit_runs_nothing(kits, tmp_path):
    hosts, key, _ = kits
    kit = tmp_path / "kit"
    shutil.copytree(hosts["bob"] / "kit-v2", kit)
    shutil.copytree(hosts["bob"] / "keys", tmp_path / "keys")
    pwned = tmp_path / "PWNED"
    script = (kit / "start.sh").read_text()
    (kit / "start.sh").write_text(script.replace("set -eu\n", f"set -eu\ntouch {pwned}\n"))
    start = _party("start", str(kit), "--consortium-key", key, "--party", "bob")
    # the script intact in a second copy, another file changed: start.sh itself, run directly, verifies first
    other = tmp_path / "other" / "kit"
    shutil.copytree(hosts["bob"] / "kit-v2", other)
    shutil.copytree(hosts["bob"] / "keys", other.parent / "keys")
    (other / "policy.toml").write_text((other / "policy.toml").read_text() + "max_steps_total = 100000000\n")
    direct = _sh(other / "start.sh", key)
    code, out = _done(start)
    assert code == 2 and "file start.sh was changed" in out, out
    assert not pwned.exists()  # the changed script never ran
    code, out = _done(direct)
    assert code == 2 and "file policy.toml was changed" in out, out
    assert "READY" not in out and not (other.parent / "bob-state").exists()
