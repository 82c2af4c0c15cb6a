"""Who may call what on the public API: bearer tokens with roles, checked before each call runs.

A tokens file holds each token's name, role and SHA-256 digest, never the token itself. It is
re-read when it changes, so an operator issues or revokes a token without a restart. An edit
that leaves it unreadable admits no one until it is mended: keeping the tokens last read would
keep a token the edit meant to revoke.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

from orchestrator.domain import Caller, Role, acting_for
from protos.stasis.v1 import stasis_pb2 as pb

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["Stasis"].full_name

METHOD_ROLES: dict[str, Role] = {
    "GetEpisode": Role.VIEWER,
    "ListEpisodes": Role.VIEWER,
    "WatchEpisodes": Role.VIEWER,
    "ListEvents": Role.VIEWER,
    "ListSnapshots": Role.VIEWER,
    "ListNodes": Role.VIEWER,
    "ListImages": Role.VIEWER,
    "ListGroups": Role.VIEWER,
    "SubmitEpisode": Role.TRAINER,
    "SubmitEpisodes": Role.TRAINER,
    "ForkEpisode": Role.TRAINER,
    "CancelEpisode": Role.TRAINER,
    "GetTrajectory": Role.TRAINER,
    "StreamTrajectories": Role.TRAINER,
    "GetEpisodeLog": Role.TRAINER,
    "PublishPolicy": Role.TRAINER,
    "PreemptEpisode": Role.OPERATOR,
    "ResumeEpisode": Role.OPERATOR,
    "DrainNode": Role.OPERATOR,
    "UncordonNode": Role.OPERATOR,
    "ExportSnapshot": Role.OPERATOR,
    "ImportImage": Role.OPERATOR,
    "RemoveImage": Role.OPERATOR,
}
"""The least role each method of the Stasis service needs; a method missing here is refused to all."""

TOKEN_PREFIX = "stasis_"


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenEntry:
    name: str
    role: Role
    sha256: str


class Tokens:
    """The tokens file: YAML `tokens: [{name, role, sha256}, ...]`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._by_digest: dict[str, Caller] = {}
        self._reload(at_start=True)  # a bad file stops the server at start, not at its first call

    def caller(self, token: str) -> Caller | None:
        """Who holds `token`, or None if no entry has its digest."""
        with self._lock:
            try:
                self._reload()
            except OSError:
                self._by_digest, self._stamp = {}, None  # no file, no tokens
            return self._by_digest.get(token_digest(token))

    def _reload(self, at_start: bool = False) -> None:
        """Read the file again if it changed. One that does not parse raises ValueError at start;
        later it admits no token until an edit mends it (logged once per edit)."""
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return
        try:
            entries = read_tokens(self.path)
        except ValueError as exc:
            if at_start:
                raise
            log.error("%s; no token is admitted until the file is mended", exc)
            entries = []
        self._by_digest = {e.sha256: Caller(e.name, e.role) for e in entries}
        self._stamp = stamp


def read_tokens(path: Path) -> list[TokenEntry]:
    """Every entry of a tokens file; a malformed one raises ValueError naming the entry and field."""
    try:
        data: Any = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"tokens file {path}: {exc}") from None
    items = data.get("tokens", []) if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError(f"tokens file {path}: `tokens` must be a list of {{name, role, sha256}}")
    entries: list[TokenEntry] = []
    for i, item in enumerate(items):
        where = f"tokens file {path}: tokens[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: must be a mapping of name, role and sha256")
        name, role, digest = (str(item.get(k, "")) for k in ("name", "role", "sha256"))
        if not name:
            raise ValueError(f"{where}.name: is required")
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"{where}.sha256: must be the 64 lowercase hex digits of the token's SHA-256")
        try:
            entries.append(TokenEntry(name, Role.parse(role), digest))
        except ValueError as exc:
            raise ValueError(f"{where}.role: {exc}") from None
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"tokens file {path}: names must be unique, got {sorted(names)}")
    return entries


def add_token(path: Path, name: str, role: Role, *, replace: bool = False) -> str:
    """Issue a new token for `name` into the tokens file (made, mode 0600, if missing); returns
    the token, which is shown this once and stored only as its digest. With `replace`, a token
    of the same name is revoked; without, it is an error."""
    entries = read_tokens(path) if path.exists() else []
    if any(e.name == name for e in entries):
        if not replace:
            raise ValueError(f"tokens file {path} already has a token named {name!r}")
        entries = [e for e in entries if e.name != name]
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    entries.append(TokenEntry(name, role, token_digest(token)))
    document = {"tokens": [{"name": e.name, "role": str(e.role), "sha256": e.sha256} for e in entries]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(document, f, sort_keys=False)
    tmp.replace(path)
    return token


def _bearer(context: grpc.ServicerContext) -> str:
    for key, value in context.invocation_metadata():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


class PublicAccess:
    """The public API's admission policy (see `protos.shared.admission`): a valid bearer token whose role
    the method allows; the call then acts for the token's holder."""

    def __init__(self, tokens: Tokens) -> None:
        self.tokens = tokens

    @contextmanager
    def __call__(self, method: str, context: grpc.ServicerContext) -> Iterator[None]:
        service, _, name = method.lstrip("/").partition("/")
        needed = METHOD_ROLES.get(name) if service == SERVICE else None
        if needed is None:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{method} is not open to any role")
        token = _bearer(context)
        if not token:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "this Stasis needs a bearer token (`authorization: Bearer ...`); the CLI and "
                "StasisClient read one from the client config (STASIS_CONFIG)",
            )
        caller = self.tokens.caller(token)
        if caller is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "the bearer token is not one this Stasis issued")
        assert caller is not None and needed is not None
        if caller.role < needed:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{caller.name} is a {caller.role}; {name} needs the {needed} role",
            )
        with acting_for(caller):
            yield
