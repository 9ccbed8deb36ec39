"""Signed kit manifests: every file of a party's start-up kit, hashed, signed with the consortium's Ed25519 key.

A kit (``modelward party provision``, :mod:`modelward.governance.provisioning`) is a folder holding a party's
configuration, policy, its peers' certificates and pins, its deny-list and start command. ``MANIFEST.json`` lists
every other file of the folder with its SHA-256, names the consortium, the party it is for, its role, its
creation time and the consortium's **version** (monotonic: a host refuses a kit older than one it has accepted,
:mod:`modelward.governance.trust.versions`), and carries the consortium's public key; ``MANIFEST.sig`` is the
Ed25519 signature (RFC 8032) of the exact bytes of ``MANIFEST.json``, base64. :func:`verify_kit` accepts a kit only if

1. the public key in the manifest is the one the party expects — its ``spki-sha256:`` fingerprint, obtained out
   of band from the provisioner (never from the kit itself: a kit re-signed with another key carries that key);
2. the signature verifies with it;
3. the folder holds exactly the listed files (no extra, no missing file, no symbolic link) and each one's SHA-256
   is the listed one;
4. optionally, the manifest is for the expected party (a kit of another party, replayed, is refused).

Every refusal is one line naming the file at fault. The signing key never leaves the provisioner
(:func:`load_or_create_signing_key` creates it with mode 0600 and refuses one readable by others).

Example:
    >>> key, _ = load_or_create_signing_key("consortium.key")  # doctest: +SKIP
    >>> write_manifest("kits/alice", key, consortium="digits", party="alice", role="inputs")  # doctest: +SKIP
    >>> verify_kit("kits/alice", key_fingerprint(key.public_key())).party  # doctest: +SKIP
    'alice'
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import stat
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import Field, ValidationError

from modelward.core.config import StrictModel
from modelward.errors import ConfigError, ModelwardError
from modelward.governance.trust.certs import write_new_file
from modelward.governance.trust.identity import SPKI_PREFIX, normalize_fingerprint
from modelward.governance.trust.versions import check_kit_version

MANIFEST = "MANIFEST.json"
SIGNATURE = "MANIFEST.sig"
FORMAT = "modelward-kit/1"
MAX_MANIFEST_BYTES = 1 << 20  # a manifest lists a few dozen files: anything larger is not one
ENV_KEY = "MODELWARD_CONSORTIUM_KEY"  # the expected consortium key on a party's host (out of band)
ENV_PARTY = "MODELWARD_PARTY"  # the party this host runs


class KitError(ModelwardError):
    """A kit that must not be used: bad signature, wrong key, extra / missing / changed file, wrong party."""


class KitManifest(StrictModel):
    """The signed content of ``MANIFEST.json``.

    Args:
        format: ``"modelward-kit/1"``.
        consortium: the consortium's name; party / role: whom the kit is for and its role.
        created: UTC creation time (ISO 8601).
        version: the consortium's version: one more at every provisioning by the same signing key, so a kit
            that revokes a party is newer than every kit that still trusts it (0: a kit from before versions).
        dev_generated_key: the party's private key was made by the provisioner and is in the kit (dev/test only).
        signing_key: the consortium's Ed25519 public key (PEM); files: relative path -> ``sha256:<hex>``.
    """

    format: str = FORMAT
    consortium: str
    party: str
    role: str
    created: str
    version: int = Field(0, ge=0)
    dev_generated_key: bool = False
    signing_key: str
    files: dict[str, str] = Field(default_factory=dict)


def key_fingerprint(public_key: Ed25519PublicKey) -> str:
    """``spki-sha256:<hex>`` of an Ed25519 public key (SHA-256 of its DER SubjectPublicKeyInfo), the value a party
    is given out of band and checks every kit against."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return SPKI_PREFIX + hashlib.sha256(der).hexdigest()


def public_key_pem(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(serialization.Encoding.PEM,
                                   serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def load_or_create_signing_key(path: str | Path) -> tuple[Ed25519PrivateKey, bool]:
    """The consortium signing key at `path` (PKCS#8 PEM), created with mode 0600 if absent; its public key is
    written next to it as ``<path>.pub`` (to hand to parties with ``--consortium-key FILE``).

    Args:
        path: the private key file (stays with the provisioner).
    Returns:
        ``(key, created)``. A key file readable by group or others, or not an Ed25519 key, is a ConfigError.
    """
    path = Path(path)
    created = False
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        key = Ed25519PrivateKey.generate()
        write_new_file(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()), 0o600)
        created = True
    else:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ConfigError(f"{path}: the consortium signing key is readable by others (mode {mode:o}); "
                              f"`chmod 600 {path}` (and consider it compromised if others could read it)")
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{path}: not an unencrypted PEM private key ({e})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{path}: the consortium signing key must be Ed25519, got {type(key).__name__}")
    pub = path.with_name(path.name + ".pub")
    pem = public_key_pem(key.public_key()).encode()
    if not pub.exists() or pub.read_bytes() != pem:
        write_new_file(pub, pem, 0o644, force=True)
    return key, created


def expected_key_fingerprint(value: str) -> str:
    """The consortium key a party expects: a ``spki-sha256:`` fingerprint, or a file with the public key (PEM).

    Args:
        value: what ``--consortium-key`` / ``MODELWARD_CONSORTIUM_KEY`` holds.
    Returns:
        The normalised ``spki-sha256:<hex>``; ConfigError naming the accepted forms otherwise.
    """
    v = value.strip()
    if v.lower().startswith(SPKI_PREFIX):
        return normalize_fingerprint(v, "--consortium-key")
    if v.lower().startswith("sha256:"):
        raise ConfigError(f"--consortium-key {value!r}: a consortium key is pinned by its public key, "
                          "'spki-sha256:<64 hex>' (as `party provision` prints it), or give its .pub file")
    p = Path(v).expanduser()
    if not p.is_file():
        raise ConfigError(f"--consortium-key {value!r}: neither a fingerprint 'spki-sha256:<64 hex>' nor an "
                          "existing public key file (consortium-signing.key.pub)")
    try:
        key = serialization.load_pem_public_key(p.read_bytes())
    except ValueError as e:
        raise ConfigError(f"--consortium-key {p}: not a PEM public key ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"--consortium-key {p}: not an Ed25519 public key ({type(key).__name__})")
    return key_fingerprint(key)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def kit_files(kit: Path) -> list[str]:
    """Every entry under `kit` but the manifest and its signature, as sorted POSIX relative paths; a symbolic
    link or anything else than a plain file or folder is a KitError naming it."""
    out: list[str] = []
    for root, dirs, files in os.walk(kit, followlinks=False):
        for name in [*dirs, *files]:
            p = Path(root) / name
            rel = p.relative_to(kit).as_posix()
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                raise KitError(f"kit {kit}: {rel} is a symbolic link; a kit holds plain files only")
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise KitError(f"kit {kit}: {rel} is not a plain file")
            if rel not in (MANIFEST, SIGNATURE):
                out.append(rel)
    return sorted(out)


def write_manifest(kit: str | Path, key: Ed25519PrivateKey, *, consortium: str, party: str, role: str,
                   dev_generated_key: bool = False, created: str | None = None, version: int = 0) -> KitManifest:
    """Hash every file in `kit`, write ``MANIFEST.json`` and its Ed25519 signature ``MANIFEST.sig``.

    Args:
        kit: the kit folder, complete (every file it will hold).
        key: the consortium signing key.
        consortium / party / role: what the manifest names.
        dev_generated_key: the kit holds a private key made by the provisioner.
        created: the creation time (default now, UTC).
        version: the consortium's version (:mod:`modelward.governance.trust.versions`).
    Returns:
        The signed :class:`KitManifest`.
    """
    kit = Path(kit)
    files = {rel: sha256_file(kit / rel) for rel in kit_files(kit)}
    m = KitManifest(consortium=consortium, party=party, role=role,
                    created=created or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), version=version,
                    dev_generated_key=dev_generated_key, signing_key=public_key_pem(key.public_key()), files=files)
    data = (json.dumps(m.model_dump(mode="json"), indent=2, sort_keys=True) + "\n").encode()
    (kit / MANIFEST).write_bytes(data)
    (kit / SIGNATURE).write_text(base64.b64encode(key.sign(data)).decode() + "\n")
    return m


def _read_manifest(kit: Path) -> tuple[bytes, bytes]:
    for name in (MANIFEST, SIGNATURE):
        p = kit / name
        if p.is_symlink() or not p.is_file():
            raise KitError(f"kit {kit}: {name} is missing (not a kit, or an incomplete copy); provision it again")
    with (kit / MANIFEST).open("rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise KitError(f"kit {kit}: {MANIFEST} is larger than {MAX_MANIFEST_BYTES} bytes; not a kit manifest")
    try:
        sig = base64.b64decode((kit / SIGNATURE).read_bytes().strip(), validate=True)
    except (binascii.Error, ValueError):
        raise KitError(f"kit {kit}: {SIGNATURE} is not a base64 signature") from None
    return data, sig


def verify_kit(kit: str | Path, expected_key: str, party: str | None = None) -> KitManifest:
    """Check a kit before anything in it is used (see the module docstring for the four checks).

    Args:
        kit: the kit folder.
        expected_key: the consortium key the party expects: ``spki-sha256:<hex>`` or a public key file
            (:func:`expected_key_fingerprint`), obtained out of band.
        party: the party this host runs (a kit for another party is refused); None: not checked.
    Returns:
        The verified :class:`KitManifest`.
    Raises:
        KitError: one line naming the file at fault (and the expected and found values).
    Example:
        >>> verify_kit("kit-bob", "spki-sha256:3b1f…", party="bob").role  # doctest: +SKIP
        'labels'
    """
    kit = Path(kit)
    if not kit.is_dir():
        raise KitError(f"kit {kit}: not a folder")
    want = expected_key_fingerprint(expected_key)
    data, sig = _read_manifest(kit)
    try:
        raw = json.loads(data)
        signing_pem = raw["signing_key"] if isinstance(raw, dict) else None
        pub = serialization.load_pem_public_key(str(signing_pem).encode())
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise KitError(f"kit {kit}: {MANIFEST} is not a kit manifest (no readable signing_key)") from None
    if not isinstance(pub, Ed25519PublicKey):
        raise KitError(f"kit {kit}: {MANIFEST}: the signing key is not Ed25519")
    got = key_fingerprint(pub)
    if not hmac.compare_digest(got, want):
        raise KitError(f"kit {kit}: {MANIFEST} is signed by consortium key {got}, not the expected {want} "
                       "(re-signed by someone else, or a kit of another consortium)")
    try:
        pub.verify(sig, data)
    except InvalidSignature:
        raise KitError(f"kit {kit}: {SIGNATURE}: the signature of {MANIFEST} does not verify with the consortium "
                       f"key {want} ({MANIFEST} was changed after signing)") from None
    try:
        m = KitManifest.model_validate(raw)
    except ValidationError as e:
        raise KitError(f"kit {kit}: {MANIFEST}: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None
    if m.format != FORMAT:
        raise KitError(f"kit {kit}: {MANIFEST}: format {m.format!r}; this modelward reads {FORMAT!r}")
    if party is not None and m.party != party:
        raise KitError(f"kit {kit}: {MANIFEST}: this kit is for party {m.party!r}, not {party!r} (a kit of "
                       "another party)")
    for rel in m.files:
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts or rel in (MANIFEST, SIGNATURE):
            raise KitError(f"kit {kit}: {MANIFEST} lists {rel!r}, which is not a file inside the kit")
    present = kit_files(kit)
    for rel in present:
        if rel not in m.files:
            raise KitError(f"kit {kit}: extra file {rel} is not in {MANIFEST}; remove it or provision again")
    for rel in sorted(m.files):
        if rel not in present:
            raise KitError(f"kit {kit}: file {rel} listed in {MANIFEST} is missing")
        h = sha256_file(kit / rel)
        if not hmac.compare_digest(h, m.files[rel]):
            raise KitError(f"kit {kit}: file {rel} was changed (its {h[:23]}… is not the signed "
                           f"{m.files[rel][:23]}…)")
    return m


def signer_fingerprint(m: KitManifest) -> str:
    """The ``spki-sha256:`` fingerprint of the consortium key that signed a verified manifest."""
    return key_fingerprint(serialization.load_pem_public_key(m.signing_key.encode()))  # type: ignore[arg-type]


def find_kit(config: str | Path) -> Path | None:
    """The kit folder `config` belongs to (`config` is a folder, or a file next to a ``MANIFEST.json``), or None."""
    p = Path(config)
    folder = p if p.is_dir() else p.parent
    return folder if p.is_dir() or (folder / MANIFEST).exists() else None


def expected_key_from_env(option: str | None) -> str | None:
    """``--consortium-key`` if given, else ``MODELWARD_CONSORTIUM_KEY`` (None when neither is set)."""
    return option or os.environ.get(ENV_KEY) or None


def expected_party_from_env(option: str | None) -> str | None:
    """``--party`` if given, else ``MODELWARD_PARTY`` (None when neither is set)."""
    return option or os.environ.get(ENV_PARTY) or None


def check_kit_of(config: str | Path, option_key: str | None = None, option_party: str | None = None,
                 overrides: list[str] | None = None) -> KitManifest | None:
    """The one rule for a command started on a configuration (``party serve``, ``split train``): a configuration
    in a kit (a folder with ``MANIFEST.json``) is used only once the kit verifies against the consortium key and
    is not older than a kit this host has accepted (its consortium version; nothing recorded here);
    with a consortium key given (``--consortium-key`` or ``MODELWARD_CONSORTIUM_KEY`` on the host) only kits are
    accepted; ``--set`` overrides are refused for a kit (its configuration is signed).

    Args:
        config: the configuration file or kit folder the command was given.
        option_key / option_party: ``--consortium-key`` / ``--party`` (default: the environment variables).
        overrides: the command's ``--set`` items.
    Returns:
        The verified manifest, or None for a plain configuration (no kit, no key).
    Raises:
        KitError: one line (no key for a kit, a kit that does not verify, a plain config where only kits go).
    """
    key = expected_key_from_env(option_key)
    kit = find_kit(config)
    if kit is None:
        if key:
            raise KitError(f"{config}: not a kit (no {MANIFEST} next to it), but a consortium key is given "
                           f"(--consortium-key or {ENV_KEY}): this host uses verified kits only")
        return None
    if not key:
        raise KitError(f"kit {kit}: give the consortium key to check it against (--consortium-key spki-sha256:… "
                       f"or {ENV_KEY}), as the provisioner told you out of band; a kit is never used unverified")
    if overrides:
        raise KitError(f"kit {kit}: --set {overrides[0]}: a kit's configuration is signed; change it in the "
                       "consortium file and provision again")
    m = verify_kit(kit, key, expected_party_from_env(option_party))
    check_kit_version(kit, m, record=False)
    return m
