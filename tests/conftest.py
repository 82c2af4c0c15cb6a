"""Suite-wide fixtures: real root, real runc/CRIU/overlayfs, a real dockerd, and a leak check."""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from sandbox_agent.host import network
from tests import hostcheck
from tests.dockerd import engine as dockerd_engine
from tests.s3server import MotoServer

DOCKER_ROOT = Path("/var/lib/stasis-test-docker")
DOCKER_EXEC_ROOT = Path("/run/stasis-test-docker")
DOCKER_SOCKET = Path("/run/stasis-test-docker.sock")
SUITE_LOCK = Path("/run/stasis-test-suite.lock")
_LOCK = pytest.StashKey[IO[str]]()


def pytest_configure(config: pytest.Config) -> None:
    if os.geteuid() != 0:
        raise pytest.UsageError(
            "the Stasis suite runs as root: it drives runc, CRIU, overlayfs and netns for real"
        )
    # Clients in the suite (and every `stasis` it runs) read and write a client config of their
    # own, never the user's ~/.stasis/config.
    for name in ("STASIS_ADDR", "STASIS_CONTEXT"):
        os.environ.pop(name, None)
    os.environ["STASIS_CONFIG"] = str(Path(tempfile.mkdtemp(prefix="stasis-suite-")) / "config")
    # One Stasis suite at a time on a host: they share iptables chains, the gateway address and
    # the cgroup tree, and leaks are judged by what appears on the host, so a second run would
    # take the first one's sandboxes for its own leaks (and clean them up).
    lock = open(SUITE_LOCK, "w")  # noqa: SIM115 - held until pytest_unconfigure
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"waiting for the other Stasis suite on this host to finish ({SUITE_LOCK})", file=sys.stderr)
        fcntl.flock(lock, fcntl.LOCK_EX)
    config.stash[_LOCK] = lock


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash[_LOCK].close()
    shutil.rmtree(Path(os.environ["STASIS_CONFIG"]).parent, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def no_leftovers() -> Iterator[None]:
    """Fail the session if any test left sandbox mounts, netns, veths, cgroups or containers behind."""
    before = hostcheck.leftovers()
    yield
    after = hostcheck.leftovers()
    leaked = {k: sorted(set(v) - set(before.get(k, []))) for k, v in after.items()}
    leaked = {k: v for k, v in leaked.items() if v}
    assert not leaked, f"the suite left these behind: {leaked}"


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Fail the test that leaks a sandbox's netns, veth or mounts, and clean up after it: a leak
    found only at the end of the session would have broken every test in between."""
    before = hostcheck.sandbox_leftovers()
    allowances = network.allowances()
    yield
    hostcheck.forget_allowances(allowances)
    after = hostcheck.sandbox_leftovers()
    leaked = {k: sorted(set(v) - set(before[k])) for k, v in after.items()}
    leaked = {k: v for k, v in leaked.items() if v}
    if leaked:
        hostcheck.remove(leaked)
        pytest.fail(f"this test left these behind: {leaked}")


@pytest.fixture(scope="session")
def dockerd() -> Iterator[str]:
    """A Docker Engine in experimental mode on its own socket and data root, stopped at the end."""
    if shutil.which("dockerd") is None:
        pytest.fail("dockerd is not installed; run scripts/host-setup.sh")
    with dockerd_engine(
        DOCKER_SOCKET, DOCKER_ROOT, DOCKER_EXEC_ROOT, "stasis-test", experimental=True
    ) as url:
        yield url


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """One moto server for the session, terminated at the end."""
    env = pytest.MonkeyPatch()
    env.setenv("AWS_ACCESS_KEY_ID", "testing")
    env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    server = MotoServer()
    try:
        yield server
    finally:
        server.stop()
        env.undo()
