#!/usr/bin/env sh
# Regenerate the committed gRPC stubs in common/ateapi/ from proto/ateapi.proto.
# Reproducible: same grpcio-tools version -> byte-identical files (tests/substrate checks it).
# Usage: proto/generate.sh [OUT_ROOT]   (OUT_ROOT defaults to the repo root)
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root}"
py="${PYTHON:-$root/.venv/bin/python}"
mkdir -p "$out/common/ateapi"
# The virtual path common/ateapi=proto makes the generated gRPC module import
# `from common.ateapi import ateapi_pb2`, so the stubs live in a normal package.
cd "$root"
"$py" -m grpc_tools.protoc \
  --proto_path=common/ateapi=proto \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  common/ateapi/ateapi.proto
