#!/usr/bin/env bash
# Here, before a device call: megatron-core for the device image (Python 3.12, no network there), unpacked
# into .megatron/ (git-ignored). Then carry it: run(..., carry=[".megatron"]); gpu_env.sh puts it on
# PYTHONPATH and sets EMBWGRAD_REQUIRE_MEGATRON=1, so that tests/test_megatron.py runs and cannot skip.
set -euo pipefail
cd "$(dirname "$0")/.."
# .megatron/core: megatron-core; .megatron/deps: packaging, its one dependency the image may lack
# (gpu_env.sh adds deps only where the image's python cannot import packaging).
wheels=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
  -d "$wheels" "megatron-core==${MEGATRON_VERSION:-0.16.1}" "packaging>=24.2"
rm -rf .megatron && mkdir -p .megatron/core .megatron/deps
python3 -m zipfile -e "$wheels"/megatron_core-*.whl .megatron/core
python3 -m zipfile -e "$wheels"/packaging-*.whl .megatron/deps
rm -rf "$wheels"
du -sh .megatron
