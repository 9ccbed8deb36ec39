"""A throwaway PostgreSQL server for tests and benchmarks: a real ``postgres`` started from the system's binaries
(Debian's ``postgresql`` package: ``/usr/lib/postgresql/<version>/bin``) in a temporary folder, on 127.0.0.1.

PostgreSQL refuses to run as root; as root the server runs as the ``postgres`` system user (``runuser``), which
owns the temporary folder. :func:`find_postgres` says in one line why no server can be had (no binaries, no
psycopg, root without a ``postgres`` user); tests skip with that line.

Not for production: ``fsync=off`` (a throwaway cluster; the guard's crash tests kill guards, not the database).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from modelward.core.ports import free_port


@dataclass(frozen=True)
class PostgresBinaries:
    bindir: Path
    run_as: str | None  # the user the server runs as (None: the current one)


def find_postgres() -> PostgresBinaries | str:
    """The PostgreSQL binaries to start a server with, or why there are none (one line)."""
    try:
        import psycopg  # noqa: F401 - only whether it is installed
    except ImportError:
        return "psycopg is not installed (pip install 'modelward[postgres]')"
    cands = [os.environ.get("MODELWARD_PG_BINDIR", "")]
    found = shutil.which("initdb")
    cands += [str(Path(found).parent)] if found else []
    cands += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    bindir = next((Path(c) for c in cands if c and (Path(c) / "initdb").is_file() and (Path(c) / "pg_ctl").is_file()),
                  None)
    if bindir is None:
        return "no PostgreSQL server binaries (initdb, pg_ctl): apt-get install postgresql (or .ci/postgres.sh)"
    run_as = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run PostgreSQL as"
        if shutil.which("runuser") is None:
            return "running as root and 'runuser' is missing (util-linux)"
        run_as = "postgres"
    return PostgresBinaries(bindir, run_as)


def _free_port() -> int:
    return free_port()  # outside the ephemeral range: no outgoing connection takes it before the server binds it


@contextmanager
def throwaway_postgres(timeout: float = 60.0) -> Iterator[str]:
    """Start a PostgreSQL server; yields its URL (database ``postgres``, user ``guard``, trust auth on 127.0.0.1)
    and removes everything on exit. Raises RuntimeError with :func:`find_postgres`'s line when none can be had.

    Example:
        >>> with throwaway_postgres() as url:  # doctest: +SKIP
        ...     store = open_store(url, Path("unused"))
    """
    found = find_postgres()
    if isinstance(found, str):
        raise RuntimeError(found)
    root = Path(tempfile.mkdtemp(prefix="modelward-pg-"))
    data = root / "data"
    prefix: list[str] = []
    if found.run_as:
        pw = pwd.getpwnam(found.run_as)
        os.chown(root, pw.pw_uid, pw.pw_gid)
        prefix = ["runuser", "-u", found.run_as, "--"]
    port = _free_port()

    def run(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, *cmd], capture_output=True, text=True, timeout=timeout, cwd=root)

    try:
        r = run(str(found.bindir / "initdb"), "-D", str(data), "-U", "guard", "--auth=trust", "-E", "UTF8", "--no-sync",
                "--no-instructions")
        if r.returncode:
            raise RuntimeError(f"initdb failed: {r.stderr.strip()[-500:]}")
        r = run(str(found.bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w", "-t",
                str(int(timeout)), "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=60", "start")
        if r.returncode:
            log = (root / "server.log").read_text(errors="replace")[-800:] if (root / "server.log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {r.stderr.strip()[-300:]} {log}")
        url = f"postgresql://guard@127.0.0.1:{port}/postgres"
        deadline = time.monotonic() + timeout
        import psycopg

        while True:
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url
    finally:
        if (data / "postmaster.pid").exists():
            run(str(found.bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(url: str, name: str) -> str:
    """Create (or re-create) database ``name`` on the server of ``url``; returns its URL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        db.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + f"/{name}"
