"""The new user's path: `stasis up` in one shell, the `stasis` CLI in another."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cli.local import LocalSettings, free_port
from tests.orchestrator.conftest import STASIS, cli, remove_sandboxes

PROGRAM = """\
import hashlib, os, random, time
buf = bytearray(random.Random(5).randbytes(8 << 20))
want = hashlib.sha256(buf).hexdigest()
os.makedirs("/work", exist_ok=True)
steps = 0
while steps < 70:
    steps += 1
    with open("/work/steps.log", "a") as f:
        f.write(f"{steps}\\n")
    print("step", steps, flush=True)
    time.sleep(0.25)
lines = open("/work/steps.log").read().split()
ok = lines == [str(i) for i in range(1, steps + 1)] and hashlib.sha256(buf).hexdigest() == want
print("memory and files intact:", ok, flush=True)
raise SystemExit(0 if ok else 3)
"""


@pytest.fixture
def stasis_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """`stasis up` as a user runs it; its context lands in this test's own default client config,
    which every later `stasis` finds with no flag, as ~/.stasis/config would be found."""
    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("STASIS_CONFIG", str(tmp_path / "home" / "config"))
    state = tmp_path / "state"
    claims = LocalSettings(state_dir=state).stacks_dir
    made = [d for d in (claims, *claims.parents) if not d.exists()]
    log = open(tmp_path / "up.log", "w+")  # noqa: SIM115 - read back while the process runs
    proc = subprocess.Popen(
        [STASIS, "up", "--state-dir", str(state), "--listen", address], stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 120
        while "Stasis is up" not in (tmp_path / "up.log").read_text():
            assert proc.poll() is None, (tmp_path / "up.log").read_text()
            assert time.monotonic() < deadline, "stasis up did not come up"
            time.sleep(0.2)
        yield address
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        log.close()
        remove_sandboxes(state)
        # Its claim of an address pool on the host goes with it (`claim_address_pool`).
        LocalSettings(state_dir=state).pool_claim.unlink(missing_ok=True)
        if made:  # the dirs it made for that claim go, if nothing else came into them
            (claims / ".lock").unlink(missing_ok=True)
            for d in made:
                with contextlib.suppress(OSError):
                    d.rmdir()


@pytest.mark.timeout(300)
def test_submit_preempt_resume_elsewhere_finish(stasis_up: str, tmp_path: Path) -> None:
    addr = stasis_up
    spec = tmp_path / "episode.yaml"
    spec.write_text(
        json.dumps({"image": "base", "command": ["python3", "-c", PROGRAM], "labels": {"suite": "e2e"}})
    )
    nodes = json.loads(cli(addr, "nodes", "-o", "json").stdout)["items"]
    assert [n["name"] for n in nodes] == ["node-1", "node-2"]

    submitted = cli(addr, "submit", "-f", str(spec)).stdout
    assert len(submitted.splitlines()) == 1
    episode = submitted.strip()
    cli(addr, "wait", episode, "--for", "RUNNING", "--timeout", "60")
    first = json.loads(cli(addr, "get", episode, "-o", "json").stdout)["node"]
    other = "node-2" if first == "node-1" else "node-1"

    for target in (other, first):
        time.sleep(2)
        cli(addr, "preempt", episode, "--reason", "e2e", "--wait")
        held = json.loads(cli(addr, "get", episode, "-o", "json").stdout)
        assert held["state"] == "PREEMPTED" and held["held"] and held["node"] == ""
        time.sleep(1)
        assert json.loads(cli(addr, "get", episode, "-o", "json").stdout)["state"] == "PREEMPTED", "held"
        resumed = cli(addr, "resume", episode, "--node", target, "--wait").stdout
        assert f"RUNNING on {target}" in resumed

    cli(addr, "wait", episode, "--for", "SUCCEEDED", "--timeout", "120")
    final = json.loads(cli(addr, "get", episode, "-o", "json").stdout)
    assert final["state"] == "SUCCEEDED" and final["exit_code"] == 0 and final["snapshots"] == 2

    snapshots = json.loads(cli(addr, "snapshots", episode, "-o", "json").stdout)["items"]
    assert len(snapshots) == 2
    for key in ("id", "parent_id", "node", "reason", "created_at", "stored_bytes", "new_bytes"):
        assert all(key in s for s in snapshots), key
    assert snapshots[0]["parent_id"] == "" and snapshots[1]["parent_id"] == snapshots[0]["id"]
    assert [s["node"] for s in snapshots] == [first, other]
    assert all(s["reason"] == "manual" for s in snapshots)
    assert snapshots[1]["new_bytes"] < snapshots[0]["stored_bytes"]
    for s in snapshots:  # killed once dumped, before the upload: free before durable
        t = s["timings_ms"]
        assert t["durable_ms"] >= t["node_free_ms"] >= t["frozen_ms"] > 0, t
    table = cli(addr, "snapshots", episode).stdout
    assert snapshots[1]["id"] in table and "STORED" in table

    archive = tmp_path / "checkpoint.tar"
    cli(addr, "export", snapshots[1]["id"], "-o", str(archive))
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"config.dump", "spec.dump", "rootfs-diff.tar", "deleted.files"} <= names
    assert any(n.startswith("checkpoint/") and n.endswith("inventory.img") for n in names)
    missing = cli(addr, "export", "ep-nope-s1", "-o", str(tmp_path / "x.tar"), check=False)
    assert missing.returncode == 1 and "ep-nope-s1" in missing.stderr

    listing = json.loads(cli(addr, "get", "-o", "json", "-l", "suite=e2e").stdout)["items"]
    assert [e["id"] for e in listing] == [episode]
    assert "SUCCEEDED" in cli(addr, "get").stdout


@pytest.mark.timeout(60)
def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    result = cli(nowhere, "--retry-for", "0.5", "get", check=False)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "cannot reach Stasis" in result.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("image: base\ncommand: python3 agent.py\n")
    result = cli(nowhere, "submit", "-f", str(bad), check=False)
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == "stasis: spec.command: must be a list of strings (argv), e.g. [python3, agent.py], not 'python3 agent.py'"
    )
    # Refused before anything is sent, each in one line naming what is wrong.
    (tmp_path / "latin1.yaml").write_bytes(b"image: b\xe4se\ncommand: [/bin/true]\n")
    (tmp_path / "huge.yaml").write_text(
        "image: base\ncommand: [/bin/true]\npreemption: {priority: 3000000000}\n"
    )
    (tmp_path / "surrogate.yaml").write_text('image: base\ncommand: [/bin/true]\nlabels: {team: "\\ud800"}\n')
    for args, words in (
        (("submit", "-f", str(tmp_path / "latin1.yaml")), "stasis: file: "),
        (("submit", "-f", str(tmp_path / "huge.yaml")), "stasis: spec.preemption.priority: 3000000000"),
        (("submit", "-f", str(tmp_path / "surrogate.yaml")), "stasis: spec: cannot be sent"),
        (("get", "--state", "bogus"), "stasis: states: 'bogus' is not one of"),
        (("export", "ep-1-s1", "-o", str(tmp_path / "no" / "dir.tar")), "stasis: output: cannot write"),
    ):
        result = cli(nowhere, "--retry-for", "0.5", *args, check=False)
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(words), result.stderr
    result = cli(nowhere, "get", "-l", "team", check=False)
    assert result.returncode == 2 and "'team' is not KEY=VALUE" in result.stderr
