"""`stasis up`: a whole Stasis on this machine. The orchestrator runs in this process with its
embedded state store and a local snapshot store; each node is a separate agent process with its
own root and name, sharing nothing with the others but the snapshot store.

It is as locked down as a cluster: a CA under <state>/pki certifies the orchestrator and each
node, the nodes register on a mutual-TLS port, and the public API wants a bearer token. The
operator's token and the CA are in the client config <state>/config, whose `local` context is
also merged into the default client config, so the CLI finds it with no flag.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from orchestrator.api import AuthSettings, Orchestrator, OrchestratorSettings, Tokens, add_token
from orchestrator.cli.pki import ClusterPki
from orchestrator.client import StasisClient, config_path, merge_context
from orchestrator.control import ControlSettings
from orchestrator.domain import FailedPrecondition, Role, StasisError, ids
from orchestrator.gateway import GATEWAY_IP, GatewaySettings
from orchestrator.reference_model import TOKENIZER_DIR, ReferenceModelServer, ReferenceModelSettings
from protos.shared.address import host_of
from protos.shared.tls import TlsFiles
from snapshots import set_aside_startup_objects

log = logging.getLogger(__name__)

ADDRESS_SPACE = ipaddress.IPv4Network("10.200.0.0/16")
"""Where stacks that were given no pool get theirs: 16 pools of 4094 addresses."""
STACK_POOL_PREFIX = 20


@dataclass(frozen=True)
class LocalSettings:
    state_dir: Path
    """Everything of the local stack: state.db, snapshots/, nodes/<name>/, logs/."""
    nodes: int = 2
    """Agent processes, named node-1, node-2, ..."""
    listen: str = "127.0.0.1:7070"
    slots: int = 2
    """Sandboxes per node."""
    memory_mb: int = 8192
    """Memory each node offers to sandboxes, in MiB."""
    backend: str = "runc"
    upstream: str = ""
    """Model server for the gateway, up to /v1; empty starts the reference model in this process."""
    gateway_port: int = 0
    """Port of the gateway on 169.254.1.1; 0 picks a free one."""
    node_lost_after_s: float = 10.0
    registry_auth_file: Path | None = None
    """A docker config.json with registry credentials, for the agents (skopeo) only."""
    registry_certs: Path | None = None
    """A directory of <host[:port]>/ca.crt for registries with a private CA."""
    insecure_registries: tuple[str, ...] = ()
    """Registries the agents may reach over plain HTTP (loopback ones always may)."""
    shared_image_cache: bool = True
    """Nodes on one machine share the read-only image trees; off, each node pulls its own."""
    secure: bool = True
    """TLS and tokens as described above; off, every port is plaintext and open (`--insecure`)."""
    model: Mapping[str, Any] = field(default_factory=dict)
    """The gateway's model settings (renderer, tokenizer, ...; `GatewaySettings` fields): by
    default prompts go to the reference model as token ids through its Qwen3 template."""
    address_pool: str = ""
    """Sandbox addresses of this stack (a CIDR). Empty: the pool it claimed before, else the first
    /20 of 10.200.0.0/16 that no other stack on this host claimed (`claim_address_pool`), so
    that two stacks never give two sandboxes one address."""
    stacks_dir: Path = Path("/var/lib/stasis/stacks")
    """Where the stacks on this host claim their address pools, a file each. On disk, not under
    /run: a stack's episodes keep their addresses across a reboot, to be restored with them."""

    @property
    def stack(self) -> str:
        """The stack's name on this host, which its agents carry (`--stack`): it keeps the node-1s
        of two stacks apart, their cgroups, netns and allowances (`stack_name`)."""
        return stack_name(self.state_dir)

    @property
    def pool_claim(self) -> Path:
        """The file of this stack's claim of its address pool (`claim_address_pool`)."""
        return self.stacks_dir / _digest(self.state_dir)

    def image_cache(self, node: str) -> Path:
        """Where a node keeps its image trees."""
        state_dir = self.state_dir.resolve()
        return state_dir / "images" if self.shared_image_cache else state_dir / "nodes" / node / "images"


def _digest(state_dir: Path) -> str:
    """Eight hex digits of the state dir's path, which no two stacks share."""
    return hashlib.sha256(os.fsencode(state_dir.resolve())).hexdigest()[:8]


def stack_name(state_dir: Path) -> str:
    """The name of the stack in `state_dir`, kept in <state_dir>/stack from its first start:
    the state dir's `_digest`. A state dir whose nodes ran before stacks were named keeps none,
    as their sandboxes, which may still run, are named without one."""
    recorded = state_dir / "stack"
    if recorded.is_file():
        return recorded.read_text().strip()
    name = "" if any((state_dir / "nodes").glob("*/sandboxes")) else _digest(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    recorded.write_text(name + "\n")
    return name


class AgentProcess:
    """One node agent as a child process; its log goes to logs/<node>.log."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            # No preexec_fn: running Python in a forked child of a process with gRPC threads can
            # abort it; the agent watches for its parent's death itself (--exit-with-parent).
            self.process = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def agent_command(
    settings: LocalSettings, name: str, orchestrator: str, gateway_port: int = 0, tls: TlsFiles | None = None
) -> list[str]:
    """The command line of one local node agent; without `tls` it serves anyone (--insecure)."""
    state_dir = settings.state_dir.resolve()
    return [
        sys.executable, "-m", "sandbox_agent",
        "--node", name,
        "--stack", settings.stack,
        "--root", str(state_dir / "nodes" / name),
        "--image-cache", str(settings.image_cache(name)),
        "--listen", "127.0.0.1:0",
        "--orchestrator", orchestrator,
        "--snapshot-store", f"file://{state_dir / 'snapshots'}",
        "--slots", str(settings.slots),
        "--memory-mb", str(settings.memory_mb),
        "--backend", settings.backend,
        "--exit-with-parent",  # an agent must not outlive a `stasis up` that was killed outright
        *(["--allow-port", str(gateway_port)] if gateway_port else []),
        *(["--registry-auth-file", str(settings.registry_auth_file)] if settings.registry_auth_file else []),
        *(["--registry-certs", str(settings.registry_certs)] if settings.registry_certs else []),
        *(arg for host in settings.insecure_registries for arg in ("--insecure-registry", host)),
        *(["--tls-ca", str(tls.ca), "--tls-cert", str(tls.cert), "--tls-key", str(tls.key)] if tls else ["--insecure"]),
    ]  # fmt: skip


def claim_address_pool(settings: LocalSettings) -> str:
    """The stack's address pool (`LocalSettings.address_pool`), claimed in `stacks_dir` as
    <digest of its state dir>: {"pool", "state_dir"}. A claim whose state dir is gone is free
    again, and removed. A pool given that overlaps another live stack's is refused."""
    stacks = settings.stacks_dir
    stacks.mkdir(parents=True, exist_ok=True)
    with open(stacks / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        others: dict[str, ipaddress.IPv4Network] = {}
        own = None
        for claim in stacks.iterdir():
            if claim.name.startswith("."):
                continue
            try:
                held = json.loads(claim.read_text())
                pool = ipaddress.IPv4Network(held["pool"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if claim == settings.pool_claim:
                own = pool
            elif Path(held.get("state_dir", "")).is_dir():
                others[held["state_dir"]] = pool
            else:  # its stack is gone with its state
                claim.unlink(missing_ok=True)
        if settings.address_pool:
            pool = ids.address_pool(settings.address_pool)
            clash = [d for d, p in others.items() if p.overlaps(pool)]
            if clash:
                raise FailedPrecondition(
                    f"address pool {pool} overlaps {others[clash[0]]} of the stack in {clash[0]} on this host: "
                    "give one that is disjoint, or none to be given a free one"
                )
        elif own is not None and not any(own.overlaps(p) for p in others.values()):
            pool = own
        else:
            free = (p for p in ADDRESS_SPACE.subnets(new_prefix=STACK_POOL_PREFIX)
                    if not any(p.overlaps(o) for o in others.values()))  # fmt: skip
            found = next(free, None)
            if found is None:
                raise FailedPrecondition(
                    f"every /{STACK_POOL_PREFIX} of {ADDRESS_SPACE} is claimed by another stack on this host "
                    f"(see {stacks}): give this one --address-pool"
                )
            pool = found
        settings.pool_claim.write_text(
            json.dumps({"pool": str(pool), "state_dir": str(settings.state_dir.resolve())}) + "\n"
        )
        return str(pool)


class LocalRegistry:
    """The stack's OCI registry (Debian's docker-registry) on loopback, for `stasis image import`.
    Nodes pull from it over plain HTTP, as they may from any loopback registry."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        config = {
            "version": 0.1,
            "log": {"level": "warn"},
            "storage": {
                "filesystem": {"rootdirectory": str(self.root / "data")},
                "delete": {"enabled": True},
            },
            "http": {"addr": self.host},
        }
        (self.root / "config.yml").write_text(json.dumps(config))  # JSON is YAML
        log_path = self.root / "registry.log"
        with open(log_path, "ab") as out:
            # The kernel sends it SIGTERM when `stasis up` dies, however it dies. Set by setpriv
            # before the exec, not by a preexec_fn: running Python in a forked child of a process
            # with gRPC threads can hang it before it ever execs.
            self.process = subprocess.Popen(
                ["setpriv", "--pdeathsig", "TERM", "--", "docker-registry", "serve", str(self.root / "config.yml")],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise StasisError(f"the image registry did not start; see {log_path}:\n{_tail(log_path)}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class LocalStack:
    def __init__(self, settings: LocalSettings) -> None:
        self.settings = settings
        self.state_dir = settings.state_dir.resolve()
        self.orchestrator: Orchestrator | None = None
        self.model: ReferenceModelServer | None = None
        self.agents: dict[str, AgentProcess] = {}
        self.registry = LocalRegistry(self.state_dir / "registry")
        self.pki = ClusterPki(self.state_dir / "pki")
        self.client_config = self.state_dir / "config"
        """The client config with this stack's `local` context (server, CA, operator token)."""

    def client(self, **kw: Any) -> StasisClient:
        """A client of this stack, with its operator credential when it is secure."""
        return StasisClient(self.address, config=self.client_config, **kw)

    def _auth(self) -> AuthSettings | None:
        """The orchestrator's certificate and the tokens file, with a `local-operator` token kept
        across restarts in <state>/operator.token."""
        if not self.settings.secure:
            return None
        host = host_of(self.settings.listen, "--listen")
        tls = self.pki.orchestrator(() if host in ("", "0.0.0.0", "127.0.0.1", "localhost") else (host,))
        tokens, token_file = self.state_dir / "tokens.yaml", self.state_dir / "operator.token"
        held = token_file.read_text().strip() if token_file.exists() else ""
        try:
            caller = Tokens(tokens).caller(held) if held and tokens.exists() else None
            if caller is None or caller.role != Role.OPERATOR:
                token = add_token(tokens, "local-operator", Role.OPERATOR, replace=True)
                fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(token + "\n")
        except ValueError as exc:
            raise FailedPrecondition(str(exc)) from None
        return AuthSettings(tls=tls, tokens_file=tokens, cluster_listen="127.0.0.1:0")

    def write_client_config(self, path: Path) -> None:
        merge_context(
            path,
            "local",
            cluster={"server": self.address, "certificate-authority": str(self.pki.ca_cert)},
            user={"token-file": str(self.state_dir / "operator.token")},
        )

    @property
    def address(self) -> str:
        assert self.orchestrator is not None
        return self.orchestrator.address

    @property
    def store_url(self) -> str:
        return f"file://{self.state_dir / 'snapshots'}"

    def start(self, progress: Callable[[str], None] = lambda _: None, timeout_s: float = 120) -> None:
        s = self.settings
        upstream, model = s.upstream, dict(s.model)
        if not upstream:
            self.model = ReferenceModelServer(ReferenceModelSettings()).start()
            upstream = self.model.url
            progress(f"reference model serving {upstream}")
            model = model or {"renderer": "qwen3", "tokenizer": str(TOKENIZER_DIR)}
        gateway_port = s.gateway_port or free_port()
        self.registry.start()
        progress(f"image registry at {self.registry.host} for `stasis image import`")
        auth = self._auth()
        stack, pool = s.stack, claim_address_pool(s)
        self.orchestrator = Orchestrator(
            OrchestratorSettings(
                state_dir=self.state_dir,
                listen=s.listen,
                snapshot_store=self.store_url,
                import_registry=self.registry.host,
                auth=auth,
                control=ControlSettings(node_lost_after_s=s.node_lost_after_s, address_pool=pool),
                gateway=GatewaySettings(
                    listen=f"{GATEWAY_IP}:{gateway_port}", port=gateway_port, upstream=upstream, **model
                ),
            )
        ).start(gateway=False)
        progress(f"orchestrator listening on {self.address}, state in {self.state_dir}")
        progress(f"stack {stack or '(unnamed)'} on this host, sandbox addresses from {pool}")
        if auth is not None:
            self.write_client_config(self.client_config)
            progress(f"operator credential in {self.client_config} (context `local`)")
        for i in range(1, s.nodes + 1):
            name = f"node-{i}"
            tls = self.pki.node(name) if auth else None
            argv = agent_command(s, name, self.orchestrator.cluster_address, gateway_port, tls)
            agent = AgentProcess(name, argv, self.state_dir / "logs" / f"{name}.log")
            agent.start()
            self.agents[name] = agent
        progress(f"starting {s.nodes} node agents (logs in {self.state_dir / 'logs'})")
        self.wait_for_nodes(timeout_s)
        # The nodes have put 169.254.1.1 on this host; now the gateway can listen there.
        self.orchestrator.start_gateway()
        gateway = self.orchestrator.settings.gateway
        how = f"token ids through the {gateway.renderer} template" if gateway.renderer else "text"
        progress(
            f"gateway at http://{GATEWAY_IP}:{gateway_port}/v1 for sandboxes, forwarding {how} to {upstream}"
        )

    def renew_certificates(self) -> None:
        """Issue again each node certificate that is due; its agent takes the new one up."""
        if self.settings.secure:
            for name in self.agents:
                self.pki.node(name)

    def wait_for_nodes(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self.client() as client:
            while True:
                ready = {n.name for n in client.nodes() if n.state == "READY"}
                if set(self.agents) <= ready:
                    return
                for agent in self.agents.values():
                    if agent.process is not None and agent.process.poll() is not None:
                        raise FailedPrecondition(
                            f"agent {agent.name} exited with code {agent.process.returncode}; "
                            f"see {agent.log_path}:\n{_tail(agent.log_path)}"
                        )
                if time.monotonic() > deadline:
                    raise FailedPrecondition(
                        f"nodes {sorted(set(self.agents) - ready)} did not register in time"
                    )
                time.sleep(0.2)

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()
        if self.orchestrator is not None:
            self.orchestrator.stop()
        if self.model is not None:
            self.model.stop()
        self.registry.stop()


CERTIFICATE_CHECK_S = 3600.0
"""How often a running stack checks its nodes' certificates (`ClusterPki.node`) for renewal."""


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port on `address` that nothing listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_foreground(settings: LocalSettings, out: IO[str]) -> int:
    """Start the stack, print its address, and run until SIGINT/SIGTERM."""
    stack = LocalStack(settings)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        stack.start(progress=lambda line: print(line, file=out, flush=True))
    except StasisError as exc:
        print(f"stasis up: {exc}", file=out, flush=True)
        stack.stop()
        return 1
    set_aside_startup_objects()  # as `stasis server` does once it serves
    nodes = ", ".join(stack.agents)
    print(f"Stasis is up at {stack.address} with nodes {nodes}", file=out)
    if settings.secure:
        # kubectl-style: the default client config gains (or refreshes) the `local` context.
        default = config_path()
        stack.write_client_config(default)
        print(f"  context `local` (operator) is current in {default}", file=out)
    print(f"  export STASIS_ADDR={stack.address}", file=out)
    print(
        "  stasis submit -f examples/episode.yaml   # then: stasis get, stasis snapshots ID",
        file=out,
        flush=True,
    )
    while not stop.wait(CERTIFICATE_CHECK_S):
        stack.renew_certificates()
    print(
        "stopping (running sandboxes keep running and are picked up by the next `stasis up`)",
        file=out,
        flush=True,
    )
    stack.stop()
    return 0
