"""The research lab: measuring tierkv's decisions offline. Not part of the library.

* :mod:`tierkv.lab.replay` -- ``tierkv replay``: replay a Mooncake-format trace against cache policies.
* :mod:`tierkv.lab.policies` -- the replayed policies, one per module (LRU, LFU, ARC, S3-FIFO, W-TinyLFU,
  Belady MIN, tierkv's ranking and the experimental session policy).
* :mod:`tierkv.lab.synth` -- synthetic Mooncake-format traces of other workload shapes.
* :mod:`tierkv.lab.sharegpt_trace` -- a chat trace from real ShareGPT conversations and SmolLM2's tokenizer.
* :mod:`tierkv.lab.codec_eval` -- ``tierkv codec-eval``: codec levels measured on real SmolLM2 KV.

The lab may import the library (``tierkv.scheduler``, ``tierkv.codecs``, the demo's model loader); the
library never imports the lab (``tests/test_import_graph.py``). Only the ``tierkv`` command imports it, inside
the subcommand that needs it.
"""
