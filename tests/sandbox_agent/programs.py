"""Harness stand-ins that run inside sandboxes and report what they see to their log."""

import json
import re

MEMORY = r"""
import hashlib, random, sys, time
size = int(sys.argv[1]) << 20
buf = bytearray(random.Random(1234).randbytes(size))
print("start", flush=True)
counter = 0
while True:
    counter += 1
    if counter % 10 == 1:
        print("sha", hashlib.sha256(buf).hexdigest(), "counter", counter, flush=True)
    time.sleep(0.05)
"""

FILES = r"""
import hashlib, os, shutil, time
os.makedirs("/work/dir", exist_ok=True)
with open("/work/new.txt", "w") as f:
    f.write("created in the sandbox\n")
with open("/etc/issue", "a") as f:
    f.write("modified in the sandbox\n")
os.remove("/etc/debian_version")
shutil.rmtree("/usr/share/doc/bash")
os.makedirs("/usr/share/doc/bash")
with open("/usr/share/doc/bash/only-new", "w") as f:
    f.write("opaque\n")
os.symlink("../new.txt", "/work/dir/link")
os.link("/work/new.txt", "/work/hard.txt")
os.chmod("/work/new.txt", 0o640)
os.chown("/work/dir", 1234, 4321)
os.setxattr("/work/new.txt", "user.stasis", b"kept")
with open("/work/sparse.bin", "wb") as f:
    f.seek(8 << 20)
    f.write(b"end")
with open("/dev/shm/segment", "wb") as f:  # a tmpfs: CRIU archives it, the layer has no part
    f.write(os.urandom(4096))
os.chmod("/dev/shm", 0o1770)

def view():
    out = []
    for top in ("/work", "/etc", "/usr/share/doc/bash", "/dev/shm"):
        for root, dirs, files in os.walk(top):
            dirs.sort()
            for name in sorted(dirs + files):
                p = os.path.join(root, name)
                st = os.lstat(p)
                entry = f"{p} {st.st_mode:o} {st.st_uid}:{st.st_gid} {st.st_nlink}"
                if os.path.islink(p):
                    entry += " -> " + os.readlink(p)
                elif os.path.isfile(p):
                    entry += " " + hashlib.sha256(open(p, "rb").read()).hexdigest()[:16]
                    entry += " " + ",".join(f"{k}={os.getxattr(p, k).decode()}" for k in os.listxattr(p))
                out.append(entry)
    st = os.stat("/dev/shm")
    out.append(f"/dev/shm {st.st_mode:o} {st.st_uid}:{st.st_gid}")
    return hashlib.sha256("\n".join(out).encode()).hexdigest(), len(out)

print("gone", os.path.exists("/etc/debian_version"), flush=True)
while True:
    digest, n = view()
    print("view", digest, n, flush=True)
    time.sleep(0.3)
"""

TCP = r"""
import socket, sys, time
addr = (sys.argv[1], int(sys.argv[2]))
sock = None
sent = 0
while True:
    try:
        if sock is None:
            sock = socket.create_connection(addr, timeout=5)
            print("connected", flush=True)
        sent += 1
        sock.sendall(f"ping {sent}\n".encode())
        if not sock.recv(64):
            raise ConnectionError("closed by peer")
    except OSError as exc:
        print("reconnect after", type(exc).__name__, flush=True)
        sock = None
    time.sleep(0.1)
"""


def last_sha_counter(log: str) -> tuple[str, int]:
    """The last checksum and counter a MEMORY program logged."""
    sha, counter = re.findall(r"sha (\w+) counter (\d+)", log)[-1]
    return sha, int(counter)


FORKED = r"""
import json, os, random, socket, sys, time
secret = random.getrandbits(64)  # user-space random state: a fork child has the parent's
gateway = (sys.argv[1], int(sys.argv[2]))
os.makedirs("/work", exist_ok=True)
counter, sock, branched = 0, None, False

def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None

while True:
    counter += 1
    with open("/work/count.txt", "w") as f:  # the file and the memory move as one
        f.write(str(counter))
    fork = json.loads(read("/.stasis/fork.json") or "null")
    if fork is not None and not branched:
        with open("/work/branch.txt", "a") as f:
            f.write(f"child {fork['index']}\n")
        branched = True
    try:
        if sock is None:
            sock = socket.create_connection(gateway, timeout=5)
        sock.sendall(b"ping\n")
        if not sock.recv(64):
            raise ConnectionError("closed by peer")
        state = "connected"
    except OSError as exc:
        state, sock = f"reconnect after {type(exc).__name__}", None
    print(json.dumps({
        "counter": counter, "secret": secret, "host": socket.gethostname(),
        "machine_id": read("/etc/machine-id"), "fork": fork, "branch": read("/work/branch.txt"),
        "address": sock.getsockname()[0] if sock else None, "tcp": state,
    }), flush=True)
    time.sleep(0.1)
"""


def ticks(log: str) -> list[dict[str, object]]:
    """The lines a FORKED program logged, in order."""
    return [json.loads(line) for line in log.splitlines() if line.startswith('{"counter"')]
