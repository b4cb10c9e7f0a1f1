"""A throwaway PostgreSQL server on this machine (Debian's package, ``apt-get install -y postgresql``): one
cluster in a temp dir on a free port, and fresh databases on it. Used by the tests' store fixtures
(tests/fixtures/store.py) and the benchmarks (bench/page_bench.py, bench/fleet_bench.py)."""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from testbed.server import free_port

PG_MISSING = ("PostgreSQL binaries not found under /usr/lib/postgresql/*/bin. Install them "
              "(apt-get install -y postgresql) or set DRAFTSCOPE_TEST_NO_POSTGRES=1.")


def pg_bin() -> Path | None:
    """The folder of Debian's PostgreSQL binaries (the newest version installed), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def as_postgres(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run through ``runuser`` when we are root."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@contextlib.contextmanager
def postgres_cluster(root: Path | None = None, **settings: str) -> Iterator[str]:
    """A throwaway PostgreSQL server (Debian's binaries) in a temp dir on a free port; yields its
    base URL (no database name) and removes it on exit. ``settings``: extra ``-c`` options. ``root``: a
    folder of the caller's instead, whose cluster (``root/data``) is made if new, else started again; on exit
    the server is stopped cleanly and the folder left."""
    bindir = pg_bin()
    if bindir is None:
        raise RuntimeError(PG_MISSING)
    kept, root = root is not None, root or Path(tempfile.mkdtemp(prefix="draftscope-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data = root / "data"
    if not data.exists():
        subprocess.run(as_postgres([str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
                                    "--auth=trust", "--no-sync", "-E", "UTF8"]),
                       check=True, capture_output=True)
    extra = "".join(f" -c {k}={v}" for k, v in settings.items())
    for _ in range(3):  # a free port another process binds first: again on a new one
        port = free_port()
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off{extra}"
        started = subprocess.run(as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"),
                                              "-o", options, "-w", "-t", "60", "start"]), capture_output=True)
        log = (root / "log").read_text(errors="replace") if (root / "log").exists() else ""
        if started.returncode == 0 or "Address already in use" not in log:
            break
    if started.returncode != 0:
        if not kept:
            shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"pg_ctl start failed: {started.stdout!r} {started.stderr!r}\n{log[-2000:]}")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}"
    finally:
        subprocess.run(as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast" if kept else "immediate",
                                    "-w", "stop"]), capture_output=True)
        if not kept:
            shutil.rmtree(root, ignore_errors=True)


def restart_cluster(root: Path, between: Callable[[], None]) -> None:
    """Stop the server of ``postgres_cluster(root)`` cleanly (its shared buffers go with it), call
    ``between``, and start it again with the options it ran with (``postmaster.opts``), on the same port."""
    bindir, data = pg_bin(), root / "data"
    options = " ".join(shlex.split((data / "postmaster.opts").read_text())[3:])  # after postgres -D DATA
    subprocess.run(as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                   check=True, capture_output=True)
    between()
    subprocess.run(as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-o", options,
                                "-w", "-t", "60", "start"]), check=True, capture_output=True)


def create_database(base_url: str, name: str) -> str:
    """A new database ``name`` on the server at ``base_url``; returns its URL."""
    import psycopg

    with psycopg.connect(base_url.replace("postgresql+psycopg", "postgresql") + "/postgres",
                         autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"{base_url}/{name}"
