"""Regenerate the committed Python code for kubedevice's .proto files.

Usage: python scripts/genproto.py [--out DIR]

With no --out, writes next to the .proto files under src/ (what `make proto` does).
tests/api/test_generated_fresh.py runs this into a temp dir and fails when the
committed code differs, so the generated code can never go stale.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
BIN = pathlib.Path(sys.executable).parent  # mypy-protobuf's plugins live beside python
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
PROTOS = (
    "kubedevice/_api/deviceplugin/v1beta1/api.proto",
    "kubedevice/_api/podresources/v1/api.proto",
    "kubedevice/_api/dra/v1/api.proto",
    "kubedevice/_api/dra/v1beta1/api.proto",
    "kubedevice/_api/pluginregistration/v1/api.proto",
    "kubedevice/_api/drahealth/v1alpha1/api.proto",
)


def generate(out: pathlib.Path) -> list[pathlib.Path]:
    """Generate the messages, the gRPC code and their typing stubs for every proto into ``out``."""
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    written: list[pathlib.Path] = []
    for proto in PROTOS:
        args = [
            "protoc",
            f"-I{SRC}",
            f"-I{include}",
            f"--python_out={out}",
            f"--plugin=protoc-gen-mypy={BIN / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={BIN / 'protoc-gen-mypy_grpc'}",
            f"--mypy_out={out}",
            f"--mypy_grpc_out={out}",
            f"--grpc_python_out={out}",
            str(SRC / proto),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {proto}")
        stem = proto.removesuffix(".proto")
        written += [out / f"{stem}{suffix}" for suffix in SUFFIXES]
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=SRC)
    args = parser.parse_args()
    out: pathlib.Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for path in generate(out):
        print(path.relative_to(out))
    if out != SRC:
        return 0
    # Keep generated packages importable.
    for proto in PROTOS:
        pkg = (SRC / proto).parent
        for d in (pkg, pkg.parent):
            init = d / "__init__.py"
            if not init.exists():
                init.write_text('"""Generated protobuf package."""\n')
    shutil.rmtree(SRC / "kubedevice" / "_api" / "__pycache__", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
