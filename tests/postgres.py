"""A real PostgreSQL server for the tests: Debian's PostgreSQL 15, run as the `postgres` system
user (it refuses root) on 127.0.0.1, with its data in a temporary directory."""

from __future__ import annotations

import itertools
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import psycopg

from orchestrator.cli.local import free_port

BIN = Path("/usr/lib/postgresql/15/bin")
USER = "postgres"
"""The system user the Debian package creates; the server runs as it."""
ROLE, PASSWORD = "stasis", "pw-Not/In:Logs@1"
HOSTS = ("127.0.0.1", "127.0.0.2")
"""Where the server listens: loopback, and a second loopback address so that a test can silence
one orchestrator's link to it (`tests.faults.silent_link`) while another keeps its own."""
"""The database role the stores connect as; the password has URL-special characters on purpose."""


def _as_postgres(argv: list[str]) -> list[str]:
    # setpriv execs the program itself, so the process we hold is the server and gets our signals.
    return ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups", "--", *argv]


class PostgresServer:
    """One `postgres` process on a free loopback port. Password authentication over TCP, as a
    real deployment has; `database()` makes a fresh database for each test."""

    def __init__(self) -> None:
        if not (BIN / "postgres").exists():
            raise RuntimeError(f"PostgreSQL 15 is not installed ({BIN}); run scripts/host-setup.sh")
        self.root = Path(tempfile.mkdtemp(prefix="stasis-postgres-"))
        self.process: subprocess.Popen[bytes] | None = None
        self._names = itertools.count(1)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        shutil.chown(self.root, USER, USER)
        data, password_file, self.log = self.root / "data", self.root / "password", self.root / "server.log"
        password_file.write_text(PASSWORD + "\n")
        shutil.chown(password_file, USER, USER)
        subprocess.run(
            _as_postgres([
                str(BIN / "initdb"), "-D", str(data), "--username", ROLE, "--pwfile", str(password_file),
                "--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "--encoding=UTF8", "--locale=C",
            ]),
            check=True, capture_output=True,
        )  # fmt: skip
        self.port = free_port()
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                _as_postgres([
                    str(BIN / "postgres"), "-D", str(data), "-p", str(self.port),
                    "-c", f"listen_addresses={','.join(HOSTS)}", "-c", f"unix_socket_directories={self.root}",
                ]),
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"postgres did not start: {self.log.read_text()[-2000:]}") from None
                time.sleep(0.1)

    def url(self, database: str, host: str = HOSTS[0]) -> str:
        return f"postgresql://{ROLE}:{quote(PASSWORD, safe='')}@{host}:{self.port}/{database}"

    def database(self) -> str:
        """The URL of a new, empty database."""
        name = f"test_{next(self._names)}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def drop(self, url: str) -> None:
        """Drop a database `database()` made, whoever is still connected to it."""
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.url("postgres"), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        """Stop the server (a fast shutdown: clients are disconnected) and remove its data."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)
