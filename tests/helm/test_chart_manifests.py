"""What the chart renders: the privileges, wiring and flags each Stasis component depends on."""

from __future__ import annotations

import pytest

from orchestrator import cli
from sandbox_agent import AgentSettings
from sandbox_agent import __main__ as agent_main
from tests.helm.chart import (
    NAMESPACE,
    ORCHESTRATOR_HOST,
    RELEASE,
    TEST_TIMEOUT_S,
    Chart,
    Manifest,
    by_name,
    container,
    find,
    pod_spec,
)

FULLNAME = f"{RELEASE}-stasis"
AGENT = f"{RELEASE}-stasis-agent"


@pytest.fixture
def reference_install(chart: Chart) -> list[Manifest]:
    return chart.render("reference-model-values.yaml")


@pytest.fixture
def s3_install(chart: Chart) -> list[Manifest]:
    return chart.render("s3-values.yaml")


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_agent_is_privileged_on_the_host_network(reference_install: list[Manifest]) -> None:
    daemonset = find(reference_install, "DaemonSet", AGENT)
    spec = pod_spec(daemonset)
    agent = container(daemonset, "agent")
    assert agent["securityContext"]["privileged"] is True
    assert spec["hostNetwork"] is True
    assert spec["hostPID"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["automountServiceAccountToken"] is False

    mounts = by_name(agent["volumeMounts"])
    volumes = by_name(spec["volumes"])
    netns = mounts["netns"]
    assert netns["mountPath"] == "/run/netns"
    assert netns["mountPropagation"] == "Bidirectional"
    assert volumes["netns"]["hostPath"]["path"] == "/run/netns"
    assert mounts["agent-root"]["mountPath"] == "/var/lib/stasis/agent"
    assert volumes["agent-root"]["hostPath"]["path"] == "/var/lib/stasis/agent"
    assert volumes["cgroup"]["hostPath"]["path"] == "/sys/fs/cgroup"
    assert mounts["modules"] == {"name": "modules", "mountPath": "/lib/modules", "readOnly": True}

    env = by_name(agent["env"])
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_agent_flags_point_at_the_orchestrator_service(reference_install: list[Manifest]) -> None:
    daemonset = find(reference_install, "DaemonSet", AGENT)
    agent = container(daemonset, "agent")
    assert agent["command"] == ["stasis-agent"]
    assert agent["args"] == [
        "--node", "$(NODE_NAME)",
        "--root", "/var/lib/stasis/agent",
        "--listen", "0.0.0.0:7071",
        "--advertise", "$(POD_IP):7071",
        "--orchestrator", f"{ORCHESTRATOR_HOST}:7071",
        "--tls-ca", "/etc/stasis/ca/ca.crt",
        "--join", f"{ORCHESTRATOR_HOST}:7070",
        "--join-token-file", "/var/run/secrets/stasis/token",
        "--snapshot-store", "file:///var/lib/stasis/snapshots",
        "--gateway-forward", f"{ORCHESTRATOR_HOST}:8080",
        "--allow-port", "8080",
        "--slots", "4",
        "--memory-mb", "16384",
        "--disk-mb", "0",
        "--backend", "runc",
        "--run-dir", "/run/stasis",
        "--userns-base", "100000",
        "--drain-on-stop", "870",
    ]  # fmt: skip
    # The kubelet's gRPC probe speaks no TLS: a TCP connect it is.
    assert agent["readinessProbe"]["tcpSocket"] == {"port": 7071}


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_agents_join_with_a_pod_token_and_see_only_the_cas_certificate(
    reference_install: list[Manifest],
) -> None:
    daemonset = find(reference_install, "DaemonSet", AGENT)
    volumes = by_name(pod_spec(daemonset)["volumes"])
    assert volumes["ca"]["secret"] == {
        "secretName": f"{FULLNAME}-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }, "never the CA's key"
    token = volumes["join-token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == "stasis" and token["path"] == "token"
    assert pod_spec(daemonset)["automountServiceAccountToken"] is False, "no API token, only the join proof"
    mounts = by_name(container(daemonset, "agent")["volumeMounts"])
    assert mounts["join-token"]["mountPath"] == "/var/run/secrets/stasis"

    orchestrator = container(find(reference_install, "Deployment", FULLNAME), "orchestrator")
    args = cli.parser().parse_args(
        [a.replace("$(STASIS_NODE_LOST_AFTER)", "30") for a in orchestrator["args"]]
    )
    assert (args.tls_ca, args.tls_ca_key) == ("/etc/stasis/ca/ca.crt", "/etc/stasis/ca/ca.key")
    assert args.join_service_account == f"{NAMESPACE}:{AGENT}"
    assert ORCHESTRATOR_HOST in args.tls_hosts.split(",") and "localhost" in args.tls_hosts.split(",")
    assert not args.insecure and args.tokens_file == "/etc/stasis/tokens/tokens.yaml"
    secrets = {m["metadata"]["name"]: m for m in reference_install if m["kind"] == "Secret"}
    assert {f"{FULLNAME}-ca", f"{FULLNAME}-tokens", f"{FULLNAME}-operator-token"} <= set(secrets)
    assert (
        by_name(pod_spec(find(reference_install, "Deployment", FULLNAME))["volumes"])["ca"]["secret"][
            "secretName"
        ]
        == f"{FULLNAME}-ca"
    )


def _agent_settings(agent: Manifest) -> AgentSettings:
    """The agent container's arguments, with the kubelet's $(VAR) expansion done, as stasis-agent parses them."""
    expanded = [a.replace("$(NODE_NAME)", "node-a").replace("$(POD_IP)", "10.0.0.7") for a in agent["args"]]
    return agent_main.settings_from_args(expanded)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_agent_flags_parse_with_the_real_agent(reference_install: list[Manifest]) -> None:
    """The DaemonSet's arguments, with the kubelet's $(VAR) expansion done, parse in stasis-agent."""
    agent = container(find(reference_install, "DaemonSet", AGENT), "agent")
    settings = _agent_settings(agent)
    assert settings.node == "node-a"
    assert settings.allowed_ports == (8080,)
    assert settings.gateway_forward.endswith(":8080") and settings.gateway_port == 8080
    assert (settings.slots, settings.memory_mb, settings.backend) == (4, 16384, "runc")


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_release_sharing_its_nodes_names_its_stack(chart: Chart, reference_install: list[Manifest]) -> None:
    """`agent.stack` reaches the agent as --stack; none keeps the nodes' one Stasis unnamed."""
    assert _agent_settings(container(find(reference_install, "DaemonSet", AGENT), "agent")).stack == ""
    named = chart.render("reference-model-values.yaml", sets={"agent.stack": "team-b"})
    settings = _agent_settings(container(find(named, "DaemonSet", AGENT), "agent"))
    assert (settings.stack, settings.host_key) == ("team-b", "node-a.team-b")


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_agent_drains_its_node_before_stopping(chart: Chart, reference_install: list[Manifest]) -> None:
    """On SIGTERM the agent has its node drained (`--drain-on-stop`), within the grace period."""
    daemonset = find(reference_install, "DaemonSet", AGENT)
    grace = pod_spec(daemonset)["terminationGracePeriodSeconds"]
    assert grace >= 300
    agent = container(daemonset, "agent")
    assert "lifecycle" not in agent, "no preStop hook: the agent drains itself"
    # The drain gives up before the kubelet would kill the agent mid-checkpoint.
    assert 0 < _agent_settings(agent).drain_on_stop_s < grace

    quick = chart.render("reference-model-values.yaml", sets={"agent.drainOnStop": False})
    assert "--drain-on-stop" not in container(find(quick, "DaemonSet", AGENT), "agent")["args"]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_agents_restore_lazily_unless_told_not_to(chart: Chart, reference_install: list[Manifest]) -> None:
    assert _agent_settings(container(find(reference_install, "DaemonSet", AGENT), "agent")).lazy_restore
    eager = chart.render("reference-model-values.yaml", sets={"agent.lazyRestore": False})
    assert not _agent_settings(container(find(eager, "DaemonSet", AGENT), "agent")).lazy_restore


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_agents_stage_restores_in_a_memory_volume_of_the_size_asked(chart: Chart) -> None:
    install = chart.render("reference-model-values.yaml", sets={"agent.restoreStagingMemory": "1Gi"})
    daemonset = find(install, "DaemonSet", AGENT)
    agent = container(daemonset, "agent")
    staging = _agent_settings(agent).memory_dir
    assert staging is not None
    assert by_name(agent["volumeMounts"])["restore-staging"]["mountPath"] == str(staging)
    assert by_name(pod_spec(daemonset)["volumes"])["restore-staging"]["emptyDir"] == {
        "medium": "Memory",
        "sizeLimit": "1Gi",
    }


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_orchestrator_is_a_single_recreated_writer(reference_install: list[Manifest]) -> None:
    deployment = find(reference_install, "Deployment", FULLNAME)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    orchestrator = container(deployment, "orchestrator")
    assert orchestrator["command"] == ["stasis"]
    assert orchestrator["args"] == [
        "server",
        "--listen", "0.0.0.0:7070",
        "--health-listen", "0.0.0.0:7072",
        "--state-dir", "/var/lib/stasis",
        "--snapshot-store", "file:///var/lib/stasis/snapshots",
        "--gateway-listen", "0.0.0.0:8080",
        "--upstream", f"http://{RELEASE}-stasis-reference-model.{NAMESPACE}.svc:8000",
        # Token mode over the reference model's own template and tokenizer, shipped in the image.
        "--upstream-api", "vllm", "--renderer", "qwen3", "--tokenizer", "reference",
        "--node-lost-after", "$(STASIS_NODE_LOST_AFTER)",
        "--tls-ca", "/etc/stasis/ca/ca.crt",
        "--tls-ca-key", "/etc/stasis/ca/ca.key",
        "--tls-hosts",
        f"{FULLNAME},{FULLNAME}.{NAMESPACE},{ORCHESTRATOR_HOST},{ORCHESTRATOR_HOST}.cluster.local,localhost,127.0.0.1",
        "--tokens-file", "/etc/stasis/tokens/tokens.yaml",
        "--cluster-listen", "0.0.0.0:7071",
        "--join-service-account", f"{NAMESPACE}:{AGENT}",
    ]  # fmt: skip
    # The kubelet's gRPC probe speaks no TLS: health checking has a plaintext port of its own,
    # where only the leader is ready.
    for probe in ("startupProbe", "livenessProbe"):
        assert orchestrator[probe]["grpc"] == {"port": 7072}, probe
    assert orchestrator["readinessProbe"]["grpc"] == {"port": 7072, "service": "stasis.v1.Stasis"}
    volumes = by_name(pod_spec(deployment)["volumes"])
    assert volumes["state"]["persistentVolumeClaim"]["claimName"] == f"{FULLNAME}-state"
    assert find(reference_install, "PersistentVolumeClaim", f"{FULLNAME}-state")["spec"]["accessModes"] == [
        "ReadWriteOnce"
    ]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_orchestrator_replicas_share_postgresql_and_keep_nothing_on_disk(s3_install: list[Manifest]) -> None:
    deployment = find(s3_install, "Deployment", FULLNAME)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}, (
        "a standby is never ready beside its leader"
    )
    assert by_name(pod_spec(deployment)["volumes"])["state"] == {"name": "state", "emptyDir": {}}
    assert not [m for m in s3_install if m["metadata"]["name"] == f"{FULLNAME}-state"]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_orchestrator_flags_parse_with_the_real_cli(s3_install: list[Manifest]) -> None:
    """The Deployment's arguments, with $(STASIS_NODE_LOST_AFTER) expanded, parse in `stasis`."""
    orchestrator = container(find(s3_install, "Deployment", FULLNAME), "orchestrator")
    config = find(s3_install, "ConfigMap", f"{FULLNAME}-config")["data"]
    expanded = [
        a.replace("$(STASIS_NODE_LOST_AFTER)", config["STASIS_NODE_LOST_AFTER"]) for a in orchestrator["args"]
    ]
    args = cli.parser().parse_args(expanded)
    assert args.command == "server"
    assert args.node_lost_after == 30
    assert args.upstream == "http://vllm.models.svc:8000"
    assert args.snapshot_store.startswith("s3://rl-snapshots/stasis/prod?")
    assert args.health_listen == "0.0.0.0:7072"


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_orchestrator_without_persistence_uses_an_empty_dir(chart: Chart) -> None:
    manifests = chart.render("reference-model-values.yaml", sets={"orchestrator.persistence.enabled": False})
    volumes = by_name(pod_spec(find(manifests, "Deployment", FULLNAME))["volumes"])
    assert volumes["state"] == {"name": "state", "emptyDir": {}}
    assert not [m for m in manifests if m["metadata"]["name"] == f"{FULLNAME}-state"]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_orchestrator_service_exposes_grpc_and_gateway(reference_install: list[Manifest]) -> None:
    service = find(reference_install, "Service", FULLNAME)
    ports = by_name(service["spec"]["ports"])
    assert ports["grpc"]["port"] == 7070
    assert ports["grpc"]["appProtocol"] == "grpc"
    assert ports["gateway"]["port"] == 8080
    assert ports["gateway"]["appProtocol"] == "https", "the nodes' relays speak TLS to the gateway"
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "orchestrator"
    pod_labels = find(reference_install, "Deployment", FULLNAME)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_rbac_reads_nodes_and_namespaced_pods_and_reviews_tokens(reference_install: list[Manifest]) -> None:
    cluster_roles = [m for m in reference_install if m["kind"] == "ClusterRole"]
    assert len(cluster_roles) == 1
    cluster_role = cluster_roles[0]
    assert "namespace" not in cluster_role["metadata"]
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    ]

    role = find(reference_install, "Role", f"{FULLNAME}-pods")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]

    subject = {"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}
    binding = find(reference_install, "ClusterRoleBinding", cluster_role["metadata"]["name"])
    assert binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert binding["subjects"] == [subject]
    assert find(reference_install, "RoleBinding", f"{FULLNAME}-pods")["subjects"] == [subject]
    assert pod_spec(find(reference_install, "Deployment", FULLNAME))["serviceAccountName"] == FULLNAME
    # Nothing else in the chart grants API access.
    rbac = sorted(m["kind"] for m in reference_install if m["apiVersion"].startswith("rbac."))
    assert rbac == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_s3_credentials_reach_both_components(s3_install: list[Manifest]) -> None:
    url = "s3://rl-snapshots/stasis/prod?endpoint=http://minio.storage.svc:9000&region=eu-west-1"
    for kind, name, container_name in (
        ("Deployment", FULLNAME, "orchestrator"),
        ("DaemonSet", AGENT, "agent"),
    ):
        workload = find(s3_install, kind, name)
        c = container(workload, container_name)
        assert c["args"][c["args"].index("--snapshot-store") + 1] == url, name
        env = by_name(c["env"])
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "stasis-s3", "key": key}, (name, key)
        assert "snapshots" not in by_name(pod_spec(workload)["volumes"]), name
    assert not [m for m in s3_install if m["metadata"]["name"].endswith("-snapshots")]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_upstream_key_and_database_url_reach_the_orchestrator_alone(
    s3_install: list[Manifest], reference_install: list[Manifest]
) -> None:
    secrets = {
        "STASIS_UPSTREAM_API_KEY": ("vllm-key", "api-key"),
        "STASIS_DATABASE_URL": ("stasis-postgres", "url"),
    }
    env = by_name(container(find(s3_install, "Deployment", FULLNAME), "orchestrator")["env"])
    for variable, (name, key) in secrets.items():
        assert env[variable]["valueFrom"]["secretKeyRef"] == {"name": name, "key": key}
    agent = by_name(container(find(s3_install, "DaemonSet", AGENT), "agent").get("env", []))
    without = by_name(container(find(reference_install, "Deployment", FULLNAME), "orchestrator")["env"])
    assert not set(secrets) & (set(agent) | set(without))


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_components_may_run_their_own_images(chart: Chart) -> None:
    digest = "sha256:" + "ab" * 32
    images = {
        "image.repository": "registry.example.com/stasis",
        "image.tag": "0.1.0-rc1",
        "orchestrator.image.repository": "registry.example.com/stasis-orchestrator",
        "referenceModel.image.repository": "registry.example.com/stasis-reference-model",
        "referenceModel.image.digest": digest,
    }
    manifests = chart.render("reference-model-values.yaml", sets=images)
    assert {
        name: container(find(manifests, kind, workload), name)["image"]
        for kind, workload, name in (
            ("Deployment", FULLNAME, "orchestrator"),
            ("DaemonSet", AGENT, "agent"),
            ("Deployment", f"{FULLNAME}-reference-model", "reference-model"),
        )
    } == {
        "orchestrator": "registry.example.com/stasis-orchestrator:0.1.0-rc1",
        "agent": "registry.example.com/stasis:0.1.0-rc1",
        "reference-model": f"registry.example.com/stasis-reference-model@{digest}",
    }


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_local_store_is_one_shared_claim(chart: Chart, reference_install: list[Manifest]) -> None:
    claim = find(reference_install, "PersistentVolumeClaim", f"{FULLNAME}-snapshots")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for kind, name, container_name in (
        ("Deployment", FULLNAME, "orchestrator"),
        ("DaemonSet", AGENT, "agent"),
    ):
        workload = find(reference_install, kind, name)
        volumes = by_name(pod_spec(workload)["volumes"])
        assert volumes["snapshots"]["persistentVolumeClaim"]["claimName"] == f"{FULLNAME}-snapshots"
        mounts = by_name(container(workload, container_name)["volumeMounts"])
        assert mounts["snapshots"]["mountPath"] == "/var/lib/stasis/snapshots"

    existing = chart.render(
        "reference-model-values.yaml", sets={"snapshotStore.local.existingClaim": "nfs-snapshots"}
    )
    assert not [m for m in existing if m["metadata"]["name"] == f"{FULLNAME}-snapshots"]
    volumes = by_name(pod_spec(find(existing, "DaemonSet", AGENT))["volumes"])
    assert volumes["snapshots"]["persistentVolumeClaim"]["claimName"] == "nfs-snapshots"


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_reference_model_serves_as_upstream(
    reference_install: list[Manifest], s3_install: list[Manifest]
) -> None:
    name = f"{RELEASE}-stasis-reference-model"
    model = container(find(reference_install, "Deployment", name), "reference-model")
    assert model["command"] + model["args"] == [
        "python", "-m", "orchestrator.reference_model", "--host", "0.0.0.0", "--port", "8000",
    ]  # fmt: skip
    assert by_name(find(reference_install, "Service", name)["spec"]["ports"])["http"]["port"] == 8000

    orchestrator = container(find(s3_install, "Deployment", FULLNAME), "orchestrator")
    assert orchestrator["args"][orchestrator["args"].index("--upstream") + 1] == "http://vllm.models.svc:8000"
    assert "--renderer" not in orchestrator["args"], "no renderer named: text mode"
    assert not [m for m in s3_install if "reference-model" in m["metadata"]["name"]]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_policy_configmap_feeds_the_orchestrator_and_rolls_it(chart: Chart) -> None:
    before = chart.render("reference-model-values.yaml")
    config = find(before, "ConfigMap", f"{FULLNAME}-config")
    assert config["data"] == {
        "STASIS_DEFAULT_TIME_SLICE_SECONDS": "1800",
        "STASIS_DEFAULT_PRIORITY": "0",
        "STASIS_NODE_LOST_AFTER": "30",
        "STASIS_GC_KEEP_LAST": "3",
        "STASIS_ADDRESS_POOL": "10.200.0.0/16",
    }
    deployment = find(before, "Deployment", FULLNAME)
    assert container(deployment, "orchestrator")["envFrom"] == [
        {"configMapRef": {"name": f"{FULLNAME}-config"}}
    ]

    after = chart.render("reference-model-values.yaml", sets={"policy.gcKeepLast": 5})
    assert find(after, "ConfigMap", f"{FULLNAME}-config")["data"]["STASIS_GC_KEEP_LAST"] == "5"

    def checksum(manifests: list[Manifest]) -> str:
        annotations = find(manifests, "Deployment", FULLNAME)["spec"]["template"]["metadata"]["annotations"]
        return str(annotations["checksum/config"])

    assert checksum(before) != checksum(after)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_every_object_carries_standard_labels(s3_install: list[Manifest]) -> None:
    for manifest in s3_install:
        labels = manifest["metadata"]["labels"]
        where = f"{manifest['kind']}/{manifest['metadata']['name']}"
        assert labels["app.kubernetes.io/name"] == "stasis", where
        assert labels["app.kubernetes.io/instance"] == RELEASE, where
        assert labels["app.kubernetes.io/managed-by"] == "Helm", where
        assert labels["app.kubernetes.io/version"] == "0.1.0", where
        assert labels["app.kubernetes.io/component"], where
        assert labels["team"] == "rl-infra", where  # commonLabels in ci/s3-values.yaml
        if manifest["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert manifest["metadata"]["namespace"] == NAMESPACE, where
    for manifest in s3_install:
        if manifest["kind"] in ("Deployment", "DaemonSet"):
            name = manifest["metadata"]["name"]
            # Service links would inject STASIS_* variables, where the programs read settings.
            assert pod_spec(manifest)["enableServiceLinks"] is False, name
            # A chart bump alone must not roll the pods: a rolled agent drains its node.
            pod_labels = manifest["spec"]["template"]["metadata"]["labels"]
            assert not {"helm.sh/chart", "app.kubernetes.io/version"} & pod_labels.keys(), name


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_release_named_stasis_is_not_doubled(chart: Chart) -> None:
    manifests = chart.render("reference-model-values.yaml", release="stasis")
    find(manifests, "Service", "stasis")
    agent = container(find(manifests, "DaemonSet", "stasis-agent"), "agent")
    assert f"stasis.{NAMESPACE}.svc:7070" in agent["args"]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_registry_credentials_reach_the_agent_and_nothing_else(chart: Chart) -> None:
    """A dockerconfigjson Secret, private CAs and insecure registries become agent flags and
    read-only mounts the real agent parses; the orchestrator learns the import registry."""
    ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    manifests = chart.render(
        "reference-model-values.yaml",
        sets={
            "agent.registry.authSecret": "harness-registry",
            "agent.registry.caCertificates": {"registry.internal:5000": ca},
            "agent.registry.insecure": ["mirror.internal:5001"],
            "orchestrator.importRegistry": "registry.internal:5000",
        },
    )
    daemonset = find(manifests, "DaemonSet", AGENT)
    agent = container(daemonset, "agent")
    settings = _agent_settings(agent)
    assert str(settings.registry_auth_file) == "/etc/stasis/registry-auth/config.json"
    assert str(settings.registry_certs) == "/etc/stasis/registry-certs"
    assert settings.insecure_registries == ("mirror.internal:5001",)
    volumes, mounts = by_name(pod_spec(daemonset)["volumes"]), by_name(agent["volumeMounts"])
    assert volumes["registry-auth"]["secret"] == {
        "secretName": "harness-registry",
        "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
    }
    assert mounts["registry-auth"]["readOnly"] is True and mounts["registry-certs"]["readOnly"] is True
    certs = find(manifests, "ConfigMap", f"{FULLNAME}-registry-certs")
    (item,) = volumes["registry-certs"]["configMap"]["items"]
    assert item["path"] == "registry.internal:5000/ca.crt" and certs["data"][item["key"]] == ca
    for other in (m for m in manifests if m["kind"] in ("Deployment",)):
        for c in pod_spec(other)["containers"]:
            assert "registry-auth" not in str(c.get("volumeMounts", [])), "only the agent holds credentials"
    orchestrator = container(find(manifests, "Deployment", FULLNAME), "orchestrator")
    args = orchestrator["args"]
    assert args[args.index("--import-registry") + 1] == "registry.internal:5000"


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_without_auth_everything_is_plaintext(chart: Chart) -> None:
    manifests = chart.render("reference-model-values.yaml", sets={"auth.enabled": False})
    agent = container(find(manifests, "DaemonSet", AGENT), "agent")
    orchestrator = container(find(manifests, "Deployment", FULLNAME), "orchestrator")
    assert "--insecure" in agent["args"] and "--join" not in agent["args"]
    assert orchestrator["args"][-1] == "--insecure" and "--tls-ca" not in orchestrator["args"]
    assert agent["readinessProbe"]["grpc"] == {"port": 7071}
    assert not [m for m in manifests if m["kind"] == "Secret"]
    ports = by_name(find(manifests, "Service", FULLNAME)["spec"]["ports"])
    assert "cluster" not in ports and ports["gateway"]["appProtocol"] == "http"


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_model_server_in_token_mode_gets_its_renderer_and_tokenizer_volume(chart: Chart) -> None:
    """upstream.renderer with upstream.tokenizerVolume: the orchestrator mounts the tokenizer
    read-only and names it, with the renderer's options, to the gateway."""
    sets = {
        "upstream.renderer": "qwen3",
        "upstream.api": "sglang",
        "upstream.tokenizerVolume.persistentVolumeClaim.claimName": "qwen3-tokenizer",
        "upstream.rendererOptions.enable_thinking": False,
    }
    deployment = find(chart.render("s3-values.yaml", sets=sets), "Deployment", FULLNAME)
    args = container(deployment, "orchestrator")["args"]
    at = args.index("--renderer")
    assert args[at : at + 6] == ["--renderer", "qwen3", "--tokenizer", "/etc/stasis/tokenizer",
                                 "--renderer-option", "enable_thinking=false"]  # fmt: skip
    assert args[args.index("--upstream-api") + 1] == "sglang"
    mounts = by_name(container(deployment, "orchestrator")["volumeMounts"])
    assert mounts["tokenizer"] == {
        "name": "tokenizer",
        "mountPath": "/etc/stasis/tokenizer",
        "readOnly": True,
    }
    volumes = by_name(deployment["spec"]["template"]["spec"]["volumes"])
    assert volumes["tokenizer"]["persistentVolumeClaim"] == {"claimName": "qwen3-tokenizer"}
