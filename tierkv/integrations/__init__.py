"""Glue between tierkv and the libraries around it (inference engines, model libraries).

* :mod:`tierkv.integrations.transformers` -- Hugging Face ``transformers``: a ``DynamicCache`` bridge
  (``store_cache``/``load_cache``), KV <-> cache conversion, prefill on top of stored KV, greedy decoding.

Each integration imports its library inside its functions; the library (``tierkv`` outside ``lab/``,
``demo/`` and ``integrations/``) never imports an integration (``tests/test_import_graph.py``).
"""
