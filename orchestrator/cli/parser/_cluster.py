"""The commands on the cluster and its access: nodes, drain, uncordon, image, token and config."""

from __future__ import annotations

from orchestrator.cli.parser._helptext import Subparsers, command, output


def add_cluster_commands(sub: Subparsers) -> None:
    n = command(
        sub,
        "nodes",
        "list nodes: state, slots, memory, disk, episodes, last heartbeat",
        ("List the nodes", "stasis nodes"),
        ("The same as JSON", "stasis nodes -o json"),
    )
    output(n)

    d = command(
        sub,
        "drain",
        "move every episode off a node and keep new ones away",
        (
            "Drain node-1 and wait up to 5 minutes for its episodes to move",
            "stasis drain node-1 --wait --timeout 300",
        ),
    )
    d.add_argument("node", metavar="NODE", help="the node's name")
    d.add_argument("--wait", action="store_true", help="wait until every episode has moved off it")
    d.add_argument(
        "--timeout",
        type=float,
        default=600,
        metavar="SECONDS",
        help="with --wait, give up after this long (default %(default)s)",
    )
    u = command(
        sub,
        "uncordon",
        "let a drained node take episodes again",
        ("Let node-1 take episodes again", "stasis uncordon node-1"),
    )
    u.add_argument("node", metavar="NODE", help="the node's name")

    im = command(
        sub,
        "image",
        "images by name: import, ls, rm",
        ("Import a local Docker image as `agent`", "stasis image import agent docker://my-agent:latest"),
        ("List the images", "stasis image ls"),
    )
    im_sub = im.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    imp = command(
        im_sub,
        "import",
        "make an image available to every node under NAME",
        ("Import a local Docker image as `agent`", "stasis image import agent docker://my-agent:latest"),
        ("Import a root filesystem directory", "stasis image import tools ./rootfs"),
        ("Import from a registry", "stasis image import python registry.example:5000/python:3.12"),
        about="Prints NAME DIGEST SIZE on NODES; progress goes to stderr: the push, then each node's pull.",
    )
    imp.add_argument("name", metavar="NAME", help="the name episode specs give as `image:`")
    imp.add_argument(
        "source",
        metavar="SOURCE",
        help="a directory (a root filesystem or an OCI layout), an OCI-layout or docker-archive "
        "tarball, docker://IMAGE from the local Docker engine, or a registry reference host/repo:tag",
    )
    ls = command(
        im_sub,
        "ls",
        "name, digest, size and the nodes that cache each image",
        ("List the images", "stasis image ls"),
        ("The same as JSON", "stasis image ls -o json"),
    )
    output(ls)
    rm = command(
        im_sub,
        "rm",
        "remove an image name (episodes that use it keep their bytes)",
        ("Remove the name `agent`", "stasis image rm agent"),
    )
    rm.add_argument("name", metavar="NAME", help="the image's name")

    tk = command(
        sub,
        "token",
        "issue bearer tokens of the public API",
        (
            "Give alice a trainer's token",
            "stasis token create alice --role trainer --tokens-file tokens.yaml",
        ),
    )
    tk_sub = tk.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    tc = command(
        tk_sub,
        "create",
        "add a token to a tokens file and print it (shown only this once)",
        (
            "Give alice a trainer's token",
            "stasis token create alice --role trainer --tokens-file tokens.yaml",
        ),
        about="Only the token's digest is kept; a running server takes it at once.",
    )
    tc.add_argument(
        "name", metavar="NAME", help="who holds it; events of the changes it asks for record this name"
    )
    tc.add_argument(
        "--role",
        required=True,
        choices=("viewer", "trainer", "operator"),
        help="viewer reads; trainer also submits, cancels, reads trajectories and logs and publishes "
        "policy versions; operator also preempts, resumes, drains, exports and manages images",
    )
    tc.add_argument(
        "--tokens-file", required=True, metavar="FILE", help="the file `stasis server --tokens-file` reads"
    )

    cf = command(
        sub,
        "config",
        "the client config's contexts, as kubectl config",
        (
            "Reach a cluster's orchestrator with its CA and a token",
            "stasis config set-context prod --server stasis.example:7070 --certificate-authority ca.crt "
            "--token-file alice.token",
        ),
    )
    cf_sub = cf.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    sc = command(
        cf_sub,
        "set-context",
        "add or replace a context and make it current",
        (
            "Reach a cluster's orchestrator with its CA and a token",
            "stasis config set-context prod --server stasis.example:7070 --certificate-authority ca.crt "
            "--token-file alice.token",
        ),
        (
            "Reach it through an address its certificate does not name",
            "stasis config set-context tunnel --server 127.0.0.1:17070 --certificate-authority ca.crt "
            "--tls-server-name stasis.example",
        ),
    )
    sc.add_argument("name", metavar="NAME", help="the context's name")
    sc.add_argument("--server", required=True, metavar="HOST:PORT", help="the orchestrator's public API")
    sc.add_argument(
        "--certificate-authority",
        default="",
        metavar="FILE",
        help="PEM file of the cluster CA; empty: plaintext, and no token is sent",
    )
    sc.add_argument(
        "--tls-server-name",
        default="",
        metavar="NAME",
        help="the name the orchestrator's certificate carries; empty: the --server host",
    )
    sc.add_argument(
        "--token-file", default="", metavar="FILE", help="a file holding the bearer token; empty: none"
    )
