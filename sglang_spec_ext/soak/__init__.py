"""Soak and fault harness for speculative serving (see benchmarks/soak.py).

``workload`` builds a seeded mix of request kinds, ``runner`` sends it and judges the
answers and the server's state, ``harness`` runs one soak against a plain server.
Engine-agnostic: it talks HTTP to SGLang's native ``/generate``; nothing imports SGLang.
"""

from sglang_spec_ext.soak.harness import format_table, plain_answers, soak
from sglang_spec_ext.soak.runner import ServerHandle, Verdict
from sglang_spec_ext.soak.workload import DEFAULT_MIX, SoakRequest, build_workload

__all__ = [
    "DEFAULT_MIX",
    "ServerHandle",
    "SoakRequest",
    "Verdict",
    "build_workload",
    "format_table",
    "plain_answers",
    "soak",
]
