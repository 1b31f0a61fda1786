#!/usr/bin/env bash
# The main job on a fresh machine: create .venv-demo, install tierkv with the demo extra, run `tierkv demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh "${TIERKV_DEMO_VENV:-.venv-demo}" "demo"
exec "${TIERKV_DEMO_VENV:-.venv-demo}/bin/tierkv" demo "$@"
