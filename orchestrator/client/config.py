"""The client config: which Stasis to talk to and with what credential, in kubectl-style contexts.

apiVersion: stasis/v1
kind: Config
current-context: local
clusters:  [{name: local, cluster: {server: 127.0.0.1:7070, certificate-authority: /path/ca.crt}}]
users:     [{name: local-operator, user: {token-file: /path/operator.token}}]
contexts:  [{name: local, context: {cluster: local, user: local-operator}}]

The file is $STASIS_CONFIG, else ~/.stasis/config. `stasis up` writes one under its state
directory and merges its context into the default file, so the CLI and `StasisClient` find it
with no flag. A cluster may also give `tls-server-name` (the name its certificate holds, when
it is not the server's host); a user gives `token` or `token-file`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from orchestrator.domain import InvalidArgument

DEFAULT_PATH = Path("~/.stasis/config")


def config_path(explicit: str | Path | None = None) -> Path:
    return Path(explicit or os.environ.get("STASIS_CONFIG") or DEFAULT_PATH).expanduser()


@dataclass(frozen=True)
class Context:
    """What one context resolves to."""

    name: str
    server: str = ""
    certificate_authority: Path | None = None
    tls_server_name: str = ""
    token: str = ""

    @property
    def secure(self) -> bool:
        return self.certificate_authority is not None


def load_context(path: Path, name: str | None = None) -> Context | None:
    """The named context (default: current-context) of the config at path; None if there is no
    file and no name was asked for. Errors name the file and the field."""
    if not path.exists():
        if name:
            raise InvalidArgument("context", f"{name!r} asked for, but there is no client config {path}")
        return None
    document = _read(path)
    name = name or os.environ.get("STASIS_CONTEXT") or document.get("current-context") or ""
    if not name:
        raise InvalidArgument(f"{path}: current-context", "is not set; give --context NAME")
    context = _entry(path, document, "contexts", name, "context")
    cluster = _entry(path, document, "clusters", str(context.get("cluster", "")), "cluster")
    user_name = str(context.get("user", ""))
    user = _entry(path, document, "users", user_name, "user") if user_name else {}
    token = str(user.get("token", ""))
    if not token and user.get("token-file"):
        token_file = _relative(path, user["token-file"])
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise InvalidArgument(
                f"{path}: users[{user_name}].token-file", f"cannot read {token_file}: {exc.strerror}"
            ) from None
    ca = cluster.get("certificate-authority")
    if token and not ca:
        raise InvalidArgument(
            f"{path}: clusters[{context.get('cluster')}].certificate-authority",
            "is required with a token: a bearer token is never sent without TLS",
        )
    return Context(
        name=name,
        server=str(cluster.get("server", "")),
        certificate_authority=_relative(path, ca) if ca else None,
        tls_server_name=str(cluster.get("tls-server-name", "")),
        token=token,
    )


def merge_context(path: Path, name: str, cluster: dict[str, str], user: dict[str, str]) -> None:
    """Add or replace context `name` (with its cluster and user of the same name) and make it
    current, keeping every other entry of the file; the file is written 0600."""
    document = _read(path) if path.exists() else {}
    document.setdefault("apiVersion", "stasis/v1")
    document.setdefault("kind", "Config")
    for section, body_key, body in (
        ("clusters", "cluster", cluster),
        ("users", "user", user),
        ("contexts", "context", {"cluster": name, "user": name}),
    ):
        entries = [e for e in document.get(section) or [] if isinstance(e, dict) and e.get("name") != name]
        document[section] = [*entries, {"name": name, body_key: body}]
    document["current-context"] = name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(document, f, sort_keys=False)
    tmp.replace(path)


def _read(path: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise InvalidArgument(str(path), f"cannot read the client config: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InvalidArgument(str(path), f"is not YAML: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidArgument(str(path), "must be a mapping (apiVersion, clusters, users, contexts)")
    return document


def _entry(path: Path, document: dict[str, Any], section: str, name: str, body_key: str) -> dict[str, Any]:
    for entry in document.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(body_key) or {}
            if not isinstance(body, dict):
                raise InvalidArgument(f"{path}: {section}[{name}].{body_key}", "must be a mapping")
            return body
    known = [e.get("name") for e in document.get(section) or [] if isinstance(e, dict)]
    raise InvalidArgument(f"{path}: {section}", f"has no entry named {name!r} (it has {known})")


def _relative(config: Path, value: object) -> Path:
    """A path in the config, relative to the config's own directory as kubectl reads them."""
    p = Path(str(value)).expanduser()
    return p if p.is_absolute() else config.parent / p
