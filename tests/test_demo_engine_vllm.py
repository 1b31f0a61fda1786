"""``tierkv demo --engine vllm`` in a Python without vLLM (the default test venv has none): a one-line error
saying how to get the engines environment, exit status 2, no traceback. vLLM is hidden from the subprocess
(``sys.modules["vllm"] = None``), so the test means the same in a venv that has it."""

from __future__ import annotations

import subprocess
import sys

_HIDE_VLLM = (
    "import sys; sys.modules['vllm'] = None; from tierkv._cli import main; "
    "raise SystemExit(main(['demo', '--engine', 'vllm', '--no-warm-start']))"
)


def test_engine_vllm_without_vllm_exits_2_with_how_to_get_the_environment() -> None:
    proc = subprocess.run([sys.executable, "-c", _HIDE_VLLM], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert "--engine vllm needs vLLM" in lines[0]
    assert "bash scripts/_engines_venv.sh" in lines[0] and "-m tierkv demo --engine vllm" in lines[0]


def test_vllm_only_options_are_a_usage_error_with_the_default_engine() -> None:
    code = "from tierkv._cli import main; raise SystemExit(main(['demo', '--model', '/nonexistent']))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert "--model and --dtype apply to --engine vllm only" in proc.stderr


def test_engine_vllm_option_checks_need_no_engine() -> None:
    from tierkv.demo.vllm_engine import MAX_MODEL_LEN, check_args

    assert check_args(128, 2000, 32) is None
    assert "multiple of vLLM's block_size" in (check_args(100, 2000, 32) or "")
    assert "engines' context" in (check_args(128, MAX_MODEL_LEN, 32) or "")
