"""Episode specs as mappings: the YAML/JSON files users write, and the JSON the state store keeps."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import InvalidArgument
from orchestrator.model import EpisodeSpec, Limits, Preemption, Resources, RewardSpec

_SECTIONS: dict[str, tuple[str, ...]] = {
    "spec": ("image", "command", "env", "files", "resources", "limits", "preemption", "labels", "reward"),
    "spec.resources": ("cpus", "memory_mb"),
    "spec.limits": ("max_wall_s",),
    "spec.preemption": ("time_slice_s", "priority", "autosave_s"),
    "spec.reward": ("command", "files", "image", "timeout_s"),
}


def _section(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument(where, f"must be a mapping, not {type(value).__name__}")
    unknown = sorted(set(value) - set(_SECTIONS[where]))
    if unknown:
        raise InvalidArgument(
            f"{where}.{unknown[0]}", f"is not a field; expected one of {', '.join(_SECTIONS[where])}"
        )
    return value


def _number(value: Any, where: str, kind: type = float) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(where, f"must be a number, not {value!r}")
    if kind is int and value != int(value):
        raise InvalidArgument(where, f"must be a whole number, not {value!r}")
    return kind(value)


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise InvalidArgument(where, "must be a list of strings (argv), e.g. [python3, agent.py]")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise InvalidArgument(f"{where}[{i}]", f"must be a string, not {item!r}")
    return tuple(value)


def _string_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument(where, "must be a mapping of strings")
    out = {}
    for k, v in value.items():
        if not isinstance(v, str):
            raise InvalidArgument(f"{where}.{k}", f"must be a string, not {v!r}")
        out[str(k)] = v
    return out


def _files(value: Any, where: str, base: Path | None = None) -> dict[str, bytes]:
    """Files as path -> text, path -> {base64: ...}, or (in spec files) path -> {from_file: local path}."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument(where, "must map absolute paths to contents")
    out = {}
    for path, content in value.items():
        if isinstance(content, str):
            out[str(path)] = content.encode()
        elif isinstance(content, bytes):
            out[str(path)] = content
        elif isinstance(content, Mapping) and set(content) == {"from_file"} and base is not None:
            local = base / str(content["from_file"])
            try:
                out[str(path)] = local.read_bytes()
            except OSError as exc:
                raise InvalidArgument(f"{where}.{path}", f"cannot read {local}: {exc.strerror}") from None
        elif isinstance(content, Mapping) and set(content) == {"base64"}:
            try:
                out[str(path)] = base64.b64decode(content["base64"], validate=True)
            except (binascii.Error, TypeError) as exc:
                raise InvalidArgument(f"{where}.{path}", f"is not valid base64: {exc}") from exc
        else:
            raise InvalidArgument(f"{where}.{path}", "must be text, {base64: ...} or {from_file: path}")
    return out


def spec_from_mapping(data: Any, base: Path | None = None) -> EpisodeSpec:
    """Parse and validate; errors name the field as `spec.<path>`. `base` resolves from_file paths."""
    top = _section(data, "spec")
    if not top:
        raise InvalidArgument("spec", "is empty; it needs at least image and command")
    res = _section(top.get("resources"), "spec.resources")
    lim = _section(top.get("limits"), "spec.limits")
    pre = _section(top.get("preemption"), "spec.preemption")
    reward = None
    if top.get("reward") is not None:
        rw = _section(top["reward"], "spec.reward")
        reward = RewardSpec(
            command=_strings(rw.get("command"), "spec.reward.command"),
            files=_files(rw.get("files"), "spec.reward.files", base),
            image=str(rw.get("image", "") or ""),
            timeout_s=_number(rw.get("timeout_s", 600.0), "spec.reward.timeout_s"),
        )
    image = top.get("image")
    if not isinstance(image, str):
        raise InvalidArgument("spec.image", "is required and must be a string")
    defaults = Resources()
    spec = EpisodeSpec(
        image=image,
        command=_strings(top.get("command"), "spec.command"),
        env=_string_map(top.get("env"), "spec.env"),
        files=_files(top.get("files"), "spec.files", base),
        resources=Resources(
            cpus=_number(res.get("cpus", defaults.cpus), "spec.resources.cpus"),
            memory_mb=_number(res.get("memory_mb", defaults.memory_mb), "spec.resources.memory_mb", int),
        ),
        limits=Limits(max_wall_s=_number(lim.get("max_wall_s", 0.0), "spec.limits.max_wall_s")),
        preemption=Preemption(
            time_slice_s=_number(pre.get("time_slice_s", 0.0), "spec.preemption.time_slice_s"),
            priority=_number(pre.get("priority", 0), "spec.preemption.priority", int),
            autosave_s=_number(pre.get("autosave_s", 0.0), "spec.preemption.autosave_s"),
        ),
        labels=_string_map(top.get("labels"), "spec.labels"),
        reward=reward,
    )
    return spec.validate()


def _encode_files(files: dict[str, bytes]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, content in files.items():
        try:
            out[path] = content.decode()
        except UnicodeDecodeError:
            out[path] = {"base64": base64.b64encode(content).decode()}
    return out


def spec_to_mapping(spec: EpisodeSpec) -> dict[str, Any]:
    """The inverse of spec_from_mapping, JSON- and YAML-safe."""
    out: dict[str, Any] = {
        "image": spec.image,
        "command": list(spec.command),
        "env": dict(spec.env),
        "files": _encode_files(spec.files),
        "resources": {"cpus": spec.resources.cpus, "memory_mb": spec.resources.memory_mb},
        "limits": {"max_wall_s": spec.limits.max_wall_s},
        "preemption": {
            "time_slice_s": spec.preemption.time_slice_s,
            "priority": spec.preemption.priority,
            "autosave_s": spec.preemption.autosave_s,
        },
        "labels": dict(spec.labels),
    }
    if spec.reward is not None:
        out["reward"] = {
            "command": list(spec.reward.command),
            "files": _encode_files(spec.reward.files),
            "image": spec.reward.image,
            "timeout_s": spec.reward.timeout_s,
        }
    return out


def load_spec_file(path: Path) -> EpisodeSpec:
    """Read a YAML or JSON episode spec; a top-level `spec:` key is optional."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidArgument("file", f"cannot read {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise InvalidArgument(
            "file", f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}"
        ) from exc
    if isinstance(data, Mapping) and set(data) == {"spec"}:
        data = data["spec"]
    return spec_from_mapping(data, base=path.parent)
