"""What a sandbox runs: its spec laid over its image's config, by `docker run`'s rules.

* argv is the entrypoint (the spec's, else the image's) followed by the command (the spec's,
  else the image's Cmd, unless the spec replaced the entrypoint);
* the environment is the image's Env with the spec's env over it;
* the working directory is the spec's, else the image's WorkingDir, else /;
* the user is the image's User (a name, uid, name:group or uid:gid, looked up in the image's
  /etc/passwd and /etc/group), else root; HOME follows the user unless the env sets it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sandbox_agent.errors import InvalidSpec
from sandbox_agent.host import confined
from sandbox_agent.images.cache import Image
from sandbox_agent.spec import SandboxSpec

MAX_ACCOUNT_FILE = 1 << 20
"""/etc/passwd and /etc/group are read up to this many bytes: an image is not trusted."""


def effective(spec: SandboxSpec, image: Image) -> SandboxSpec:
    """The spec as it runs: argv, env, cwd and numeric user all settled."""
    config = image.config
    entrypoint = spec.entrypoint if spec.entrypoint is not None else config.entrypoint
    command = spec.command or (() if spec.entrypoint is not None else config.cmd)
    argv = (*entrypoint, *command)
    if not argv:
        raise InvalidSpec(
            "command", f"image {spec.image!r} has no Entrypoint or Cmd; the spec must give a command"
        )
    env = dict(item.split("=", 1) for item in config.env if "=" in item)
    env.update(spec.env)
    uid, gid, home = _user(spec.user or config.user, image.rootfs, spec.image)
    env.setdefault("HOME", home)
    cwd = spec.cwd or config.working_dir or "/"
    return replace(spec, command=argv, entrypoint=None, env=env, cwd=cwd, user=f"{uid}:{gid}")


def _read(rootfs: Path, relative: str) -> str:
    """A file of the image, never through a symlink (it could point at the node's own files)."""
    return confined.read(rootfs, relative, limit=MAX_ACCOUNT_FILE)[0].decode(errors="replace")


def _entries(text: str) -> list[list[str]]:
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]


def _user(user: str, rootfs: Path, image: str) -> tuple[int, int, str]:
    if not user:
        return 0, 0, "/root"
    name, _, group = user.partition(":")
    passwd = _entries(_read(rootfs, "etc/passwd"))
    entry = next(
        (e for e in passwd if len(e) >= 7 and _number(e[2]) and _number(e[3]) and name in (e[0], e[2])),
        None,
    )
    if entry is not None:
        uid, gid, home = int(entry[2]), int(entry[3]), entry[5] or "/"
    elif _number(name):
        uid, gid, home = int(name), 0, "/"
    else:
        raise InvalidSpec("user", f"image {image!r} names user {name!r}, which its /etc/passwd does not have")
    if group:
        if _number(group):
            gid = int(group)
        else:
            found = next(
                (
                    e
                    for e in _entries(_read(rootfs, "etc/group"))
                    if len(e) >= 3 and e[0] == group and _number(e[2])
                ),
                None,
            )
            if found is None:
                raise InvalidSpec(
                    "user", f"image {image!r} names group {group!r}, which its /etc/group does not have"
                )
            gid = int(found[2])
    return uid, gid, home


def _number(text: str) -> bool:
    """A uid or gid as /etc/passwd writes it: ASCII digits ('²' is a digit to str.isdigit, not to int)."""
    return text.isascii() and text.isdigit()
