#!/usr/bin/env bash
# Here, before a device call: megatron-core for the device image (Python 3.12, no network there), unpacked
# into .megatron/ (git-ignored). Then carry it: run(..., carry=[".megatron"]); gpu_env.sh puts it on
# PYTHONPATH and sets EMBWGRAD_REQUIRE_MEGATRON=1, so that tests/test_megatron.py runs and cannot skip.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
  -d "$wheels" "megatron-core==${MEGATRON_VERSION:-0.16.1}" "packaging>=24.2"
rm -rf .megatron && mkdir .megatron
for w in "$wheels"/*.whl; do python3 -m zipfile -e "$w" .megatron; done
rm -rf "$wheels" .megatron/*.dist-info/RECORD
du -sh .megatron
