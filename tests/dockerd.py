"""A Docker Engine of the tests' own: its own socket, data root and exec root, no bridge and no
iptables rules, so it never touches the host's engine or network."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests import hostcheck


def docker(
    url: str, *args: str, check: bool = False, timeout: float | None = None, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """`docker -H url ARGS`, its output captured as text: the one way the suite (and the
    benchmarks) drive an engine. With `check`, a failure raises, naming the command and its stderr."""
    done = subprocess.run(["docker", "-H", url, *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])} failed ({done.returncode}): {done.stderr.strip()}")
    return done


@contextmanager
def engine(
    socket: Path, data_root: Path, exec_root: Path, namespace: str, *, experimental: bool = False
) -> Iterator[str]:
    """Start dockerd and yield its URL; at the end remove its containers, stop it and unmount
    what it mounted, however the body ended. `namespace` names its containerd namespaces.

    Its containerd writes each checkpoint to a temporary directory first, and keeps it when a
    dump fails: temporary files go under the data root, and go with the engine."""
    url = f"unix://{socket}"
    # Checkpoint content from an earlier run refuses a restore whose digest it shares.
    shutil.rmtree(data_root / "containerd", ignore_errors=True)
    tmp = data_root / "tmp-stasis"
    tmp.mkdir(parents=True, exist_ok=True)
    argv = ["dockerd", *(["--experimental"] if experimental else []), "--host", url]
    argv += ["--pidfile", f"{exec_root}.pid", "--data-root", str(data_root), "--exec-root", str(exec_root)]
    argv += ["--bridge", "none", "--iptables=false", "--ip-masq=false"]
    argv += ["--containerd-namespace", namespace, "--containerd-plugins-namespace", f"{namespace}-plugins"]
    log_path = exec_root.with_suffix(".log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(tmp)}
        )
    try:
        deadline = time.monotonic() + 60
        while docker(url, "info").returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        ids = docker(url, "ps", "-aq").stdout.split()
        if ids:
            docker(url, "rm", "-f", *ids)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        hostcheck.unmount_below(exec_root)
        hostcheck.unmount_below(data_root)
        shutil.rmtree(tmp, ignore_errors=True)
