"""A Docker Engine of the tests' own: its own socket, data root and exec root, no bridge and no
iptables rules, so it never touches the host's engine or network."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests import hostcheck


@contextmanager
def engine(
    socket: Path, data_root: Path, exec_root: Path, namespace: str, *, experimental: bool = False
) -> Iterator[str]:
    """Start dockerd and yield its URL; at the end remove its containers, stop it and unmount
    what it mounted, however the body ended. `namespace` names its containerd namespaces."""
    url = f"unix://{socket}"
    argv = ["dockerd", *(["--experimental"] if experimental else []), "--host", url]
    argv += ["--pidfile", f"{exec_root}.pid", "--data-root", str(data_root), "--exec-root", str(exec_root)]
    argv += ["--bridge", "none", "--iptables=false", "--ip-masq=false"]
    argv += ["--containerd-namespace", namespace, "--containerd-plugins-namespace", f"{namespace}-plugins"]
    log_path = exec_root.with_suffix(".log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "-H", url, "info"], capture_output=True).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"dockerd did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        ids = subprocess.run(
            ["docker", "-H", url, "ps", "-aq"], capture_output=True, text=True
        ).stdout.split()
        if ids:
            subprocess.run(["docker", "-H", url, "rm", "-f", *ids], capture_output=True)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        hostcheck.unmount_below(exec_root)
        hostcheck.unmount_below(data_root)
