"""Hostile harnesses against the node: each attack here is one a reward-maximising agent tries.
Every attempt fails, and the node goes on working.

* The reward: a trojaned interpreter and shell, `sitecustomize`, a forged last line in its own
  log, planted grader files. The verifier runs from the pristine image and reads the harness's
  tree at /episode, read-only and noexec.
* Paths the agent follows as host root: a symlink where a grader file goes, an exit-code file
  that is a symlink to /dev/zero or endless.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from sandbox_agent import InvalidSpec, Resources, SandboxSpec, SandboxState
from sandbox_agent.errors import NoRoom
from sandbox_agent.host import confined, network
from sandbox_agent.node import Node
from sandbox_agent.settings import AgentSettings
from tests import faults
from tests.sandbox_agent.conftest import NodeFactory, wait_for_log

# Runs as root in the base image; it leaves a wrong answer and tries to make any grader print 1000.
FORGER = """set -e
mkdir -p /work /grader /usr/local/lib/python3.11/dist-packages
echo 41 > /work/answer.txt
real=$(readlink -f /usr/bin/python3)
rm /usr/bin/python3
printf '#!/bin/dash\\n%s "$@"\\necho 1000.0\\n' "$real" > /usr/bin/python3
chmod 755 /usr/bin/python3
rm /bin/sh
printf '#!/bin/dash\\n/bin/dash "$@"\\necho 1000.0\\n' > /bin/sh
chmod 755 /bin/sh
for d in /usr/lib/python3/dist-packages /usr/local/lib/python3.11/dist-packages; do
  printf 'import atexit\\natexit.register(lambda: print(1000.0))\\n' > $d/sitecustomize.py
done
ln -s {target} /grader/grade.py
mkdir -p /episode && echo 1000.0 > /episode/reward
ln -s /grader/expected.txt /work/expected-copy.txt
echo 1000.0
"""

GRADER = """import os, subprocess
answer = open("/episode/work/answer.txt").read().strip()
print("answer:", answer)
print(subprocess.run(["sh", "-c", "echo shell from the image"], capture_output=True, text=True).stdout.strip())
try:
    subprocess.run(["/episode/usr/bin/python3", "-c", "print(1000.0)"], capture_output=True)
    print("the graded tree is executable")
except PermissionError:
    print("the graded tree is noexec")
try:
    open("/episode/work/answer.txt", "w").write("42")
    print("the graded tree is writable")
except OSError:
    print("the graded tree is read-only")
try:
    print("through the harness's symlink:", open("/episode/work/expected-copy.txt").read().strip())
except OSError:
    print("the harness's symlink is not followed")
print(1.0 if answer == "42" else 0.0)
"""


def _wait_exited(node: object, sandbox_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while node.get(sandbox_id).state != SandboxState.EXITED:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"{sandbox_id} did not exit"
        time.sleep(0.1)


@pytest.mark.timeout(120)
def test_a_forging_harness_gets_the_honest_grade(make_node: NodeFactory, tmp_path: Path) -> None:
    node = make_node("node-a")
    target = tmp_path / "host-file"
    target.write_text("untouched\n")
    node.create(
        "forger", SandboxSpec(image="base", command=("/bin/dash", "-c", FORGER.format(target=target)))
    )
    _wait_exited(node, "forger")
    assert node.get("forger").exit_code == 0, node.harness_log("forger", 4096)

    result = node.run_verifier(
        "forger",
        ("python3", "/grader/grade.py"),
        {"/grader/grade.py": GRADER.encode(), "/grader/expected.txt": b"the hidden answer"},
    )
    log = result.log.decode()
    assert result.exit_code == 0 and not result.timed_out, log
    assert log.strip().splitlines() == [
        "answer: 41",
        "shell from the image",
        "the graded tree is noexec",
        "the graded tree is read-only",
        "the harness's symlink is not followed",
        "0.0",
    ], log
    assert target.read_text() == "untouched\n", "the planted symlink was not followed on the host"


@pytest.mark.timeout(60)
def test_exit_code_and_log_files_that_are_symlinks_read_as_nothing(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    node = make_node("node-a")
    secret = tmp_path / "node-secret"
    secret.write_text("the node's own file\n")
    # The wrapper then writes the exit code through the symlink, inside the sandbox, into /dev/zero.
    plant = (
        f"ln -sf /dev/zero /.stasis/exit-code; rm /.stasis/harness.log; ln -s {secret} /.stasis/harness.log"
    )
    node.create("planted", SandboxSpec(image="base", command=("sh", "-c", plant)))
    node.create("after", SandboxSpec(image="base", command=("sh", "-c", "exec sleep 0.5")))
    _wait_exited(node, "planted")
    started = time.monotonic()
    assert node.get("planted").exit_code is None
    assert node.harness_log("planted", 1 << 20) == b"", "the node's file is not read through the link"
    assert time.monotonic() - started < 5, "the reads are bounded"
    _wait_exited(node, "after")
    assert node.get("after").exit_code == 0, "the node goes on working"


@pytest.mark.timeout(10)
def test_confined_writes_replace_the_last_component_and_refuse_symlinked_directories(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "victim").write_text("host\n")
    (root / "grader").mkdir()
    (root / "grader" / "grade.py").symlink_to(outside / "victim")
    confined.write(root, "grader/grade.py", b"print(0)\n")
    assert (root / "grader" / "grade.py").read_bytes() == b"print(0)\n"
    assert not (root / "grader" / "grade.py").is_symlink()
    assert (outside / "victim").read_text() == "host\n"

    (root / "tests").symlink_to(outside)
    with pytest.raises(confined.Escapes, match=r"/tests is not a directory"):
        confined.write(root, "tests/hidden.py", b"x")
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    confined.write(root, "new/deep/file", b"y")
    assert (root / "new" / "deep" / "file").read_bytes() == b"y"


@pytest.mark.timeout(60)
def test_spec_files_never_follow_an_image_symlink_to_the_host(make_node: NodeFactory, tmp_path: Path) -> None:
    node = make_node("node-a")
    # Debian's base image has /lib -> usr/lib, a relative symlink: resolved on the host it would
    # stay inside, but no symlink on the path is followed at all.
    with pytest.raises(InvalidSpec, match=r"files\[/lib/hidden\].*/lib is not a directory"):
        node.create("files", SandboxSpec(image="base", command=("true",)), {"/lib/hidden": b"x"})
    assert [s.record.id for s in node.list()] == [], "the refused sandbox left nothing"


IPV6_PROBE = """import os, socket, sys
inet6 = open("/proc/net/if_inet6").read().split() if os.path.exists("/proc/net/if_inet6") else []
print("inet6 addresses:", len(inet6))
port = int(sys.argv[1])
for host in sys.argv[2:]:
    try:
        socket.create_connection((host, port), timeout=2).close()
        print("reached", host)
    except OSError as exc:
        print("no way to", host, type(exc).__name__)
"""


def _host_inet6() -> list[str]:
    """The host's own IPv6 addresses, loopback included, link-local left out (they need a scope)."""
    found = ["::1"]
    for line in Path("/proc/net/if_inet6").read_text().splitlines():
        raw, scope = line.split()[0], line.split()[3]
        if scope == "00" and raw != "0" * 31 + "1":
            found.append(":".join(raw[i : i + 4] for i in range(0, 32, 4)))
    return found


@pytest.mark.timeout(60)
def test_a_sandbox_has_no_ipv6_to_the_node_or_anywhere(make_node: NodeFactory) -> None:
    node = make_node("node-a")
    server = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    try:
        port, targets = server.getsockname()[1], _host_inet6()
        node.create(
            "v6",
            SandboxSpec(
                image="base", command=("python3", "-c", IPV6_PROBE, str(port), *targets), address="10.205.0.2"
            ),
        )
        _wait_exited(node, "v6")
        log = node.harness_log("v6", 1 << 16).decode()
        assert "inet6 addresses: 0" in log, log
        assert all(f"no way to {t}" in log for t in targets) and "reached" not in log, log
        host_side = Path(f"/proc/sys/net/ipv6/conf/{network.veth_name('node-a', 'v6')}/disable_ipv6")
        assert host_side.read_text().strip() == "1", "the node's end of the veth has no IPv6 either"
    finally:
        server.close()


ESCAPES = r"""import ctypes, os, socket, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def tried(what, result):
    print(what, "refused" if result != 0 else "ALLOWED", os.strerror(ctypes.get_errno()) if result else "")
tried("unshare(CLONE_NEWUSER)", libc.unshare(0x10000000))
tried("unshare(CLONE_NEWNET)", libc.unshare(0x40000000))
tried("mount tmpfs", libc.mount(b"none", b"/mnt", b"tmpfs", 0, None))
tried("keyctl", 0 if libc.syscall(250, 0, -3, 0) >= 0 else -1)  # KEYCTL_GET_KEYRING_ID
r = subprocess.run(["unshare", "-U", "-r", "true"], capture_output=True, text=True)
print("unshare -U -r", "refused" if r.returncode else "ALLOWED", r.stderr.strip()[-60:])
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    print("raw socket ALLOWED")
except PermissionError:
    print("raw socket refused")
print("threads and children still work:", subprocess.run(["sh", "-c", "echo ok"], capture_output=True, text=True).stdout.strip())
"""


@pytest.mark.timeout(60)
def test_namespaces_mounts_keyrings_and_raw_sockets_are_refused(make_node: NodeFactory) -> None:
    node = make_node("node-a")
    node.create("escape", SandboxSpec(image="base", command=("python3", "-c", ESCAPES)))
    _wait_exited(node, "escape")
    log = node.harness_log("escape", 1 << 16).decode()
    assert "ALLOWED" not in log and log.count("refused") == 6, log
    assert "threads and children still work: ok" in log, log


@pytest.mark.timeout(90)
def test_a_fork_bomb_and_a_memory_hog_fail_alone(make_node: NodeFactory) -> None:
    node = make_node("node-a")
    bomb = "b() { b | b & }; b; sleep 5; echo still here"
    hog = "x = []\nwhile True:\n    x.append(bytearray(16 << 20))"
    node.create("bomb", SandboxSpec(image="base", command=("bash", "-c", bomb), resources=Resources(pids=64)))
    node.create(
        "hog", SandboxSpec(image="base", command=("python3", "-c", hog), resources=Resources(memory_mb=128))
    )
    node.create("neighbour", SandboxSpec(image="base", command=("sh", "-c", "sleep 3; echo fine")))
    _wait_exited(node, "hog", 60)
    assert node.get("hog").exit_code not in (0, None), "the kernel killed the hog inside its cgroup"
    _wait_exited(node, "neighbour", 60)
    assert node.harness_log("neighbour", 4096).strip() == b"fine" and node.get("neighbour").exit_code == 0
    node.kill("bomb")
    _wait_exited(node, "bomb", 30)


FILL = """dd if=/dev/zero of=/fill bs=1M count=200 2>/dev/null; bytes=$?
rm -f /fill
mkdir /many; i=0; while touch /many/f$i 2>/dev/null; do i=$((i+1)); done
rm -rf /many
echo "dd exit $bytes, files $i"; sleep 600
"""


@pytest.mark.timeout(120)
def test_a_full_disk_fails_its_own_sandbox_alone(make_node: NodeFactory, tmp_path: Path) -> None:
    a, b = make_node("node-a"), make_node("node-b")
    small = Resources(disk_mb=64, inodes=2048)
    a.create(
        "full", SandboxSpec(image="base", command=("sh", "-c", FILL), resources=small, address="10.205.0.3")
    )
    writer = "dd if=/dev/zero of=/data bs=1M count=100 2>/dev/null && echo wrote 100 MiB; sleep 600"
    a.create("neighbour", SandboxSpec(image="base", command=("sh", "-c", writer)))
    log = wait_for_log(a, "full", lambda t: "files" in t, 90)
    done = log.split("dd exit ")[1].split()
    assert done[0] != "0," and int(done[2]) < 2048, "bytes and inodes both ran out at the layer's size"
    assert "wrote 100 MiB" in wait_for_log(a, "neighbour", lambda t: "wrote" in t, 60)
    # The full sandbox still checkpoints and restores elsewhere, and goes on running there.
    a.checkpoint("full", tmp_path / "ck", leave_running=False)
    assert b.restore("full", tmp_path / "ck").state == SandboxState.RUNNING


@pytest.mark.timeout(120)
def test_a_node_refuses_what_its_disk_cannot_hold(make_node: NodeFactory, tmp_path: Path) -> None:
    """Layers are sparse: without a count, a few harnesses filling their quota fill the node. A
    node holds each layer whole and room to stage a checkpoint beside them, and refuses a
    sandbox beyond that, naming the field, before it makes anything of it."""
    a = make_node("node-a", disk_mb=200)
    small = Resources(disk_mb=64, memory_mb=32, inodes=2048)  # 64 MiB of layer, 96 to stage a checkpoint
    spec = SandboxSpec(image="base", command=("sleep", "600"), resources=small)
    a.create("first", spec)
    with pytest.raises(NoRoom, match=r"node-a cannot hold sandbox 'second'.*resources\.disk_mb"):
        a.create("second", SandboxSpec(image="base", command=("sleep", "600"), resources=small))
    assert [s.record.id for s in a.list()] == ["first"]
    assert not (a.sandboxes.dir / "second").exists()
    assert not network.netns_path("node-a", "second").exists(), "nothing of the refused sandbox is left"
    # The room kept beside the layers stages a checkpoint of the one it holds...
    a.checkpoint("first", tmp_path / "ck", leave_running=False)
    assert a.disk.held_mb == 0, "its layer and staging were given back"
    # ...and what a sandbox gave back takes the next one.
    assert a.restore("second", tmp_path / "ck").state == SandboxState.RUNNING
    assert a.disk.held_mb == 64


@pytest.mark.timeout(120)
def test_a_node_not_told_its_disk_offers_what_is_free_there(image_cache: Path, tmp_path: Path) -> None:
    """On a disk other tenants have filled to 200 MiB free, a node offers 90 % of that: room for
    one small sandbox with its staging, not two."""
    with faults.small_disk(tmp_path / "disk", 1024) as disk, faults.full_disk(disk, leave_mb=200):
        node = Node(AgentSettings(node="node-f", root=disk / "node-f", image_cache=image_cache))
        try:
            assert 160 <= node.disk.capacity_mb <= 180, node.disk.capacity_mb
            small = Resources(disk_mb=64, memory_mb=32, inodes=2048)  # 64 + 96 to stage
            node.create("first", SandboxSpec(image="base", command=("sleep", "600"), resources=small))
            with pytest.raises(NoRoom, match="node-f cannot hold sandbox 'second'"):
                node.create("second", SandboxSpec(image="base", command=("sleep", "600"), resources=small))
        finally:
            node.delete_all()


ROOT_INSIDE = r"""set -e
echo "uid $(id -u) map" $(cat /proc/self/uid_map)
echo mine > /root/mine
mkdir -p /home/u && echo theirs > /home/u/f && chown 1000:1000 /home/u/f
chown 1000 /etc/hostname
python3 -c 'import socket; socket.create_server(("0.0.0.0", 80)).close(); print("port 80 bound")'
mknod /dev/sda1 b 8 1 2>/dev/null && echo "mknod ALLOWED" || echo "mknod refused"
echo ready; sleep 600
"""


@pytest.mark.timeout(120)
def test_the_sandboxs_root_is_an_unprivileged_host_user(make_node: NodeFactory, tmp_path: Path) -> None:
    """A user namespace maps the sandbox's ids 0..65535 to host ids from 100000: its root owns its
    own tree and nothing of the node's. Its files lie on disk as it sees them, so layers and
    snapshots do not depend on the map, and a restore elsewhere keeps it."""
    a, b = make_node("node-a"), make_node("node-b")
    a.create("rooted", SandboxSpec(image="base", command=("sh", "-c", ROOT_INSIDE), address="10.205.0.4"))
    log = wait_for_log(a, "rooted", lambda t: "ready" in t or "exit" in t)
    assert "uid 0 map 0 100000 65536" in log and "port 80 bound" in log and "mknod refused" in log, log

    def host_uids(node: object) -> set[str]:
        init = node.get("rooted").pid  # type: ignore[attr-defined]
        tasks = [init, *map(int, Path(f"/proc/{init}/task/{init}/children").read_text().split())]
        return {Path(f"/proc/{p}/status").read_text().split("Uid:")[1].split()[0] for p in tasks}

    assert host_uids(a) == {"100000"}, "every process of the sandbox runs as host uid 100000"
    upper = a.settings.root / "sandboxes" / "rooted" / "layer" / "upper"
    owners = {p: (upper / p).stat().st_uid for p in ("root/mine", "home/u/f", "etc/hostname")}
    assert owners == {"root/mine": 0, "home/u/f": 1000, "etc/hostname": 1000}, owners

    a.checkpoint("rooted", tmp_path / "ck", leave_running=False)
    assert b.restore("rooted", tmp_path / "ck").state == SandboxState.RUNNING
    assert host_uids(b) == {"100000"}
    moved = b.settings.root / "sandboxes" / "rooted" / "layer" / "upper"
    assert (moved / "home/u/f").stat().st_uid == 1000 and (moved / "root/mine").read_text() == "mine\n"


SNOOP = r"""import os
found = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            found += [pid] if b"key-of-b" in open(f"/proc/{pid}/environ", "rb").read() else []
        except OSError:
            pass
print("processes seen:", len([p for p in os.listdir("/proc") if p.isdigit()]), "with b's key:", found or "none")
"""


@pytest.mark.timeout(60)
def test_a_sandbox_cannot_read_a_neighbours_key(make_node: NodeFactory) -> None:
    """Keys live in each harness's environment. A neighbour's processes are in another pid
    namespace and owned by nobody the snooper's root maps to, so there is nothing to read (and a
    key heard from the wrong sandbox is refused by the gateway anyway: `test_gateway_authentication.py`)."""
    node = make_node("node-a")
    node.create("b", SandboxSpec(image="base", command=("sleep", "600"), env={"OPENAI_API_KEY": "key-of-b"}))
    node.create("snoop", SandboxSpec(image="base", command=("python3", "-c", SNOOP)))
    _wait_exited(node, "snoop")
    log = node.harness_log("snoop", 4096).decode()
    assert "with b's key: none" in log, log
    assert int(log.split("processes seen: ")[1].split()[0]) <= 3, "only its own few processes"
