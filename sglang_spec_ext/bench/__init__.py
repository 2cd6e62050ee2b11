"""``sglang-spec-ext bench``: compare a baseline and a speculative SGLang server.

``workload`` builds the requests (scenarios, prompts, arrival schedules), ``client``
sends them (native ``/generate`` or OpenAI ``/v1/completions``, streamed), ``metrics``
turns timestamps into throughput and latency figures, ``servers`` launches and stops
servers, ``parity`` compares greedy outputs, ``report`` and ``plot`` write the table,
JSON and PNG, and ``cli`` ties them together.
"""
