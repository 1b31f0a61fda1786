"""Glue between tierkv and the libraries around it (inference engines, model libraries).

* :mod:`tierkv.integrations.transformers` -- Hugging Face ``transformers``: a ``DynamicCache`` bridge
  (``store_cache``/``load_cache``), KV <-> cache conversion, prefill on top of stored KV, greedy decoding.
* :mod:`tierkv.integrations.vllm` -- vLLM (0.32): ``TierKVConnector``, a ``KVConnectorBase_V1`` that loads
  into and saves from vLLM's paged KV cache (docs/vllm.md).
* :mod:`tierkv.integrations.sglang` -- SGLang (0.5.23): ``TierKVHiCacheStorage``, a HiCache storage (L3)
  backend with the v1 zero-copy interface (docs/sglang.md).

The transformers integration imports its library inside its functions; the vLLM and SGLang ones import
theirs when they are imported (they subclass the engine's base class). The library (``tierkv`` outside
``lab/``, ``demo/`` and ``integrations/``) never imports an integration (``tests/test_import_graph.py``).
"""
