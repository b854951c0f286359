#!/usr/bin/env bash
# bench/venv.sh: the project-local venv (.venv) with what the benchmark driver, `threadheap profile` and
# their tests need: matplotlib, rich, pytest, protobuf, and grpcio-tools (its protoc, which matches the
# protobuf it installs, compiles proto/profile.proto at first use). Made once; as root, python3-venv is
# installed first when Debian's python3 lacks it. `make test`, `make bench` (through bench/run.sh) and .ci/run
# all call it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
"$venv/bin/python" -c 'import matplotlib, rich, pytest, google.protobuf, grpc_tools' 2>/dev/null && exit 0
echo "bench/venv.sh: setting up $venv (matplotlib, rich, pytest, protobuf, grpcio-tools)" >&2
if ! python3 -c 'import ensurepip, venv' 2>/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >&2 ||
    { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >&2; } || true
fi
python3 -m venv "$venv" || { echo "bench/venv.sh: cannot make $venv (is python3-venv installed?)" >&2; exit 1; }
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "matplotlib>=3.7" rich pytest protobuf \
  grpcio-tools
