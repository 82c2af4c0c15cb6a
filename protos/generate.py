"""Regenerate the Python stubs from protos/stasis/v1/*.proto and CRIU's protos/criu/rpc.proto
(`make protos`).

With --check, regenerate into a scratch dir and fail if the checked-in stubs differ.
"""

from __future__ import annotations

import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

REPO = Path(__file__).resolve().parent.parent
FOLDERS = (REPO / "protos" / "stasis" / "v1", REPO / "protos" / "criu")
GRPC = FOLDERS[0]
"""Only Stasis's own protos define services; CRIU's RPC is messages over a socket pair."""
GENERATED = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out: Path) -> None:
    include = Path(protoc.__file__).parent / "_proto"
    for folder in FOLDERS:
        args = [
            "protoc",
            f"-I{REPO}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            *([f"--grpc_python_out={out}"] if folder == GRPC else []),
            *(str(s.relative_to(REPO)) for s in sorted(folder.glob("*.proto"))),
        ]
        if protoc.main(args) != 0:
            sys.exit("protoc failed")


def stubs(root: Path) -> list[Path]:
    found = []
    for folder in FOLDERS:
        mirrored = root / folder.relative_to(REPO)
        if mirrored.is_dir():
            found += [p.relative_to(root) for p in mirrored.iterdir() if p.name.endswith(GENERATED)]
    return sorted(found)


def main() -> None:
    if "--check" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp))
            fresh, current = stubs(Path(tmp)), stubs(REPO)
            stale = [
                str(p)
                for p in fresh
                if not (REPO / p).exists() or not filecmp.cmp(Path(tmp) / p, REPO / p, False)
            ]
            extra = [str(p) for p in current if p not in fresh]
            if stale or extra:
                sys.exit(f"generated stubs are stale; run `make protos`: {', '.join(stale + extra)}")
        return
    for old in stubs(REPO):
        (REPO / old).unlink()
    generate(REPO)
    for init in (REPO / "protos" / "stasis", *FOLDERS):
        (init / "__init__.py").touch()
    for folder in FOLDERS:
        shutil.rmtree(folder / "__pycache__", ignore_errors=True)


if __name__ == "__main__":
    main()
