"""`make images` (scripts/images.sh) builds the Stasis images, and each entry point starts in a
container and answers its health check.

All real: the script, its Docker engine, the images and the containers. The engine is the
script's own (its own socket, data root and exec root, not the suite's dockerd), and keeps its
images between runs so that a second build takes seconds. Containers talk to 127.0.0.1 only: the
orchestrator and the reference model on the host's loopback, the agent in a network namespace of
its own, where the iptables rules and the 169.254.1.1 address it makes on start stay out of the
host's. The agent gets every capability but CAP_SYS_RESOURCE instead of --privileged: this VM's
bounding set lacks that one, and runc refuses --privileged without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator.cli.local import free_port
from tests import dockerd
from tests.helm.chart import CHART, REPO, Chart, pod_spec

SCRIPT = REPO / "scripts" / "images.sh"
# scripts/images.sh's own engine: none of these is the suite's (tests/conftest.py).
ENGINE_ROOT = Path("/var/lib/stasis-images-docker")
ENGINE_EXEC_ROOT = Path("/run/stasis-images-docker")
ENGINE_SOCKET = Path("/run/stasis-images-docker.sock")
ENGINE_URL = f"unix://{ENGINE_SOCKET}"

# A first build downloads ~60 MB of wheels and Debian's runc, iptables, skopeo and umoci, and
# takes 5 to 8 minutes on 2 cores; with its wheels and layers cached it takes about 15 s.
BUILD_TIMEOUT_S = 900
# Too slow for `make test` on a fresh machine: `make images` builds and runs these.
pytestmark = [pytest.mark.images, pytest.mark.timeout(BUILD_TIMEOUT_S + 120)]
START_TIMEOUT_S = 60
# Run inside the agent's container: only there can its network namespace be reached.
HEALTH_CHECK = """
import sys, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
with grpc.insecure_channel(sys.argv[1]) as channel:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
print(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
"""


@dataclass(frozen=True)
class Build:
    """What one run of scripts/images.sh did."""

    version: str
    log: str
    seconds: float

    def image(self, name: str) -> str:
        return f"{name}:{self.version}"


def answers(url: str) -> bool:
    return dockerd.docker(url, "version").returncode == 0


def run_script(env: dict[str, str]) -> Build:
    """Run scripts/images.sh; on a timeout, stop it with its process group, dockerd included."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        _, log = proc.communicate(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        _, log = proc.communicate(timeout=60)
        pytest.fail(f"{SCRIPT} took more than {BUILD_TIMEOUT_S} s:\n{log[-3000:]}")
    assert proc.returncode == 0, f"{SCRIPT} failed with exit code {proc.returncode}:\n{log[-5000:]}"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return Build(str(chart["appVersion"]), log, time.monotonic() - started)


def script_env(docker_host: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    return {**env, "DOCKER_HOST": docker_host}


@pytest.fixture(scope="module")
def build() -> Build:
    """`make images` with no engine running: the script starts its own, then stops it. DOCKER_HOST
    names that engine's socket, so that another engine on the default socket cannot stand in."""
    if answers(ENGINE_URL):
        pytest.fail(f"a Docker engine already answers on {ENGINE_URL}; stop it (the test starts its own)")
    done = run_script(script_env(ENGINE_URL))
    assert not answers(ENGINE_URL), "scripts/images.sh left the dockerd it started running"
    return done


@pytest.fixture(scope="module")
def engine(build: Build) -> Iterator[str]:
    """The script's engine again, over its data root with the images, to run them."""
    with dockerd.engine(ENGINE_SOCKET, ENGINE_ROOT, ENGINE_EXEC_ROOT, "stasis-images") as url:
        yield url


def docker(url: str, *args: str, timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return dockerd.docker(url, *args, timeout=timeout)


def run_in(url: str, image: str, *args: str, entrypoint: str = "") -> subprocess.CompletedProcess[str]:
    """Run a command to its end in a container of the image, with no network."""
    options = ["--entrypoint", entrypoint] if entrypoint else []
    return docker(url, "run", "--rm", "--network", "none", *options, image, *args)


@contextlib.contextmanager
def container(url: str, name: str, *run_args: str) -> Iterator[str]:
    """A detached container, removed (and its log shown if the test failed) on the way out."""
    docker(url, "rm", "-f", name)
    started = docker(url, "run", "-d", "--name", name, *run_args)
    assert started.returncode == 0, started.stderr
    try:
        yield name
    except BaseException:
        print(f"--- log of {name}:\n{docker(url, 'logs', name).stderr[-3000:]}")
        raise
    finally:
        docker(url, "rm", "-f", name)


def wait_for(what: str, check: Callable[[], bool], url: str, name: str) -> None:
    """Poll check() until it is true; fail with the container's log after START_TIMEOUT_S."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not check():
        state = docker(url, "inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        if state != "running" or time.monotonic() > deadline:
            pytest.fail(f"{name} ({state}) did not {what}:\n{docker(url, 'logs', name).stderr[-3000:]}")
        time.sleep(0.2)


def grpc_status(address: str) -> str:
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
    except grpc.RpcError:
        return ""
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def http_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())


def http_answers(url: str) -> bool:
    try:
        http_json(url)
    except OSError:
        return False
    return True


def test_the_chart_runs_the_built_image(chart: Chart, build: Build, engine: str) -> None:
    manifests = chart.render("reference-model-values.yaml")
    containers = [
        c
        for m in manifests
        if m["kind"] in ("Deployment", "DaemonSet")
        for c in pod_spec(m)["containers"] + pod_spec(m).get("initContainers", [])
    ]
    assert {c["image"] for c in containers} == {build.image("stasis")}
    assert len(containers) == 3
    for c in containers:
        # The subcommand, if the pod names one (`stasis server`), then --help: every import happens.
        args = c.get("args", [])
        sub = args[:1] if args and not args[0].startswith("-") else []
        argv = [*c["command"], *sub, "--help"]
        ran = run_in(engine, build.image("stasis"), *argv[1:], entrypoint=argv[0])
        assert ran.returncode == 0, f"{c['name']}: {argv} in {build.image('stasis')}:\n{ran.stderr[-2000:]}"
        assert "usage:" in ran.stdout


def test_orchestrator_answers_grpc_health(build: Build, engine: str) -> None:
    api, gateway = free_port(), free_port()
    with container(
        engine,
        "stasis-images-test-orchestrator",
        "--network",
        "host",
        build.image("stasis-orchestrator"),
        "--insecure",
        "--listen",
        f"127.0.0.1:{api}",
        "--gateway-listen",
        f"127.0.0.1:{gateway}",
        "--upstream",
        "http://127.0.0.1:9",
    ) as name:
        wait_for(
            "answer gRPC health checks", lambda: grpc_status(f"127.0.0.1:{api}") == "SERVING", engine, name
        )
        logs = docker(engine, "logs", name)
        assert f"stasis server listening on 127.0.0.1:{api}" in logs.stdout
        assert f"gateway listening on 127.0.0.1:{gateway}" in logs.stderr


def test_reference_model_answers_health_and_models(build: Build, engine: str) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # As the chart's pod runs it: its own user, a read-only root, a writable /tmp.
    with container(
        engine,
        "stasis-images-test-reference-model",
        "--network",
        "host",
        "--read-only",
        "--tmpfs",
        "/tmp",
        "--user",
        "65532:65532",
        build.image("stasis-reference-model"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ) as name:
        wait_for("answer /health", lambda: http_answers(f"{base}/health"), engine, name)
        health = http_json(f"{base}/health")
        assert isinstance(health, dict) and health["status"] == "ok"
        models = http_json(f"{base}/v1/models")
        assert isinstance(models, dict)
        assert [m["id"] for m in models["data"]] == ["reference"]


def test_agent_image_carries_runc_criu_and_its_tools(build: Build, engine: str) -> None:
    image = build.image("stasis-agent")
    script = (
        "set -e; runc --version; criu --version; ldd /usr/local/sbin/criu; iptables --version; "
        "skopeo --version; umoci --version; ls /var/cache/stasis/images/base"
    )
    ran = run_in(engine, image, "-c", script, entrypoint="sh")
    assert ran.returncode == 0, ran.stderr
    assert re.search(r"^runc version \d", ran.stdout, re.M)
    criu = re.search(r"^Version: (\d+)\.(\d+)", ran.stdout, re.M)
    assert criu and (int(criu[1]), int(criu[2])) >= (4, 2), ran.stdout
    assert "not found" not in ran.stdout
    assert "rootfs.tar" in ran.stdout and "digest" in ran.stdout
    assert docker(engine, "image", "inspect", "--format", "{{.Id}}", build.image("stasis")).stdout == (
        docker(engine, "image", "inspect", "--format", "{{.Id}}", image).stdout
    )


def test_agent_answers_grpc_health(build: Build, engine: str) -> None:
    # Its own network namespace (--network none): the agent's start-up rules and address land there.
    with container(
        engine,
        "stasis-images-test-agent",
        "--network",
        "none",
        "--cap-add",
        "ALL",
        "--cap-drop",
        "SYS_RESOURCE",
        "--security-opt",
        "seccomp=unconfined",
        "--tmpfs",
        "/var/lib/stasis/agent",
        build.image("stasis-agent"),
        "--node",
        "images-test",
        "--insecure",
        "--listen",
        "127.0.0.1:7071",
    ) as name:

        def serving() -> bool:
            ran = docker(engine, "exec", name, "python3", "-c", HEALTH_CHECK, "127.0.0.1:7071")
            return ran.stdout.strip() == "SERVING"

        wait_for("answer gRPC health checks", serving, engine, name)
        logs = docker(engine, "logs", name)
        assert "stasis-agent node=images-test listening on 127.0.0.1:7071" in logs.stdout
        # It imported the built-in base sandbox image the image carries.
        assert "imported base image sha256:" in logs.stderr


def test_a_second_build_changes_nothing(build: Build, engine: str) -> None:
    again = run_script(script_env(engine))
    for name in ("python", "orchestrator", "reference-model", "agent"):
        assert f"stasis-{name}:{build.version} unchanged" in again.log, again.log
    assert "downloading" not in again.log and "importing" not in again.log, again.log
    assert again.seconds < 60, f"a build with everything cached took {again.seconds:.0f} s"
    assert answers(engine), "the script stopped an engine it did not start"
