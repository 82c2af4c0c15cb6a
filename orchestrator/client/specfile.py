"""Episode spec files: the YAML or JSON a user writes, parsed into an `EpisodeSpec`.

Fields take their defaults from the dataclasses. A file's contents may be text, `{base64: ...}`,
or `{from_file: path}` relative to the spec file. What the values mean is checked by the
orchestrator when the spec is submitted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from orchestrator.domain import EpisodeSpec, InvalidArgument, codec


def spec_from_mapping(data: Any, base: Path | None = None) -> EpisodeSpec:
    """Parse; errors name the field as `spec.<path>`. `base` resolves from_file paths."""
    if not data:
        raise InvalidArgument("spec", "is empty; it needs at least image and command")
    return codec.decode(EpisodeSpec, data, "spec", base=base)


def load_spec_file(path: Path) -> EpisodeSpec:
    """Read a YAML or JSON episode spec; a top-level `spec:` key is optional."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidArgument("file", f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidArgument("file", f"{path} is not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise InvalidArgument(
            "file", f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}"
        ) from exc
    if isinstance(data, Mapping) and set(data) == {"spec"}:
        data = data["spec"]
    return spec_from_mapping(data, base=path.parent)
