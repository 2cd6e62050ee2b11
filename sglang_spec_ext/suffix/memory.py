"""Worst-case memory of the suffix drafter for a configuration.

Bounds (SuffixConfig): the global tree holds at most ``max_cached_tokens``
live tokens, each per-request tree at most ``max_request_tokens``. A tree over
n live tokens has fewer than 2n nodes (every leaf and every one-child node ends
an inserted string, one per token at most; branching nodes are fewer than the
leaves). Per node the native core holds its ``Node`` record (NODE_BYTES), an
entry in its parent's child array (CHILD_BYTES; arrays grow by doubling, so up
to twice that, plus a glibc chunk header), and for nodes with many children a
share of the child hash index; each token also costs 4 bytes in its sequence.

Scopes (tenants, ``SuffixDrafter.start_request``): the global trees of every
scope together hold at most ``max_cached_tokens`` live tokens, but each keeps
its node high-water mark until the engine rebuilds a tree whose node slots
exceed 4 per live token (+64): so all of them together stay within twice the
one-tree figure plus 64 node slots per scope (a scope holds at least one cached
request). Corpora: a tree over their ``max_corpus_tokens`` tokens, built once.

The figures here are upper bounds from those sizes; measured figures (RSS and
``SuffixDrafter.stats()["memory_bytes"]``) are in docs/operations.md "Memory" and
benchmarks/results/drafter_memory.json.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import SuffixConfig

try:
    from . import _native

    NODE_BYTES: int = int(_native.NODE_BYTES)
    CHILD_BYTES: int = int(_native.CHILD_BYTES)
except (ImportError, AttributeError):  # pragma: no cover - depends on the build
    NODE_BYTES, CHILD_BYTES = 64, 8

NODES_PER_TOKEN = 2
#: Child array slot (doubling: up to 2 slots per child) + malloc header share
#: + hash-index slot (12 bytes at load >= 3/8) per node, worst case.
_PER_NODE_EXTRA = 2 * CHILD_BYTES + 16 + 32
TOKEN_BYTES = 4
#: Scope trees: rebuilt above 4 node slots per live token (engine.cc kCompactFactor),
#: i.e. at most twice the 2-per-token of one tree, plus kCompactSlack slots each.
SCOPE_FACTOR = 2
SCOPE_SLACK_NODES = 64


def worst_bytes_per_token() -> int:
    """Upper bound of native-core bytes per live token of one tree."""
    return NODES_PER_TOKEN * (NODE_BYTES + _PER_NODE_EXTRA) + TOKEN_BYTES


@dataclass(frozen=True)
class MemoryEstimate:
    """Worst-case bytes of one drafter (one per scheduler process, i.e. per TP rank)."""

    global_tree: int
    per_request: int
    max_running_requests: int
    total: int
    corpora: int = 0

    def describe(self) -> str:
        gib = 1 << 30
        corpora = f", corpora <= {self.corpora / gib:.2f} GiB" if self.corpora else ""
        return (
            f"global trees <= {self.global_tree / gib:.2f} GiB{corpora}, per-request tree <= "
            f"{self.per_request / (1 << 20):.1f} MiB x {self.max_running_requests} running "
            f"requests; total <= {self.total / gib:.2f} GiB per scheduler process (per TP rank)"
        )


def estimate_bytes(
    config: SuffixConfig,
    max_running_requests: int = 256,
    *,
    scoped: bool = False,
    corpus_tokens: int = 0,
) -> MemoryEstimate:
    """Configured worst case: global trees + ``max_running_requests`` per-request trees
    (+ the corpora's ``corpus_tokens``). ``scoped``: requests may fall in several
    scopes (isolation other than ``shared``).

    The global tree's node array keeps its high-water mark (freed slots are
    reused), which the token bound caps; a transient overshoot of one step's
    insertion (``step_insert_tokens``) is included.
    """
    if not isinstance(config, SuffixConfig):
        raise TypeError(f"config must be a SuffixConfig, got {type(config).__name__}")
    if isinstance(max_running_requests, bool) or not isinstance(max_running_requests, int):
        raise TypeError("max_running_requests must be an int")
    if max_running_requests < 0:
        raise ValueError(f"max_running_requests={max_running_requests} must be >= 0")
    per_token = worst_bytes_per_token()
    glob = 0
    if config.global_enabled:
        glob = (config.max_cached_tokens + config.step_insert_tokens) * per_token
        if scoped:
            node = NODE_BYTES + _PER_NODE_EXTRA
            glob = SCOPE_FACTOR * glob + config.max_cached_requests * SCOPE_SLACK_NODES * node
    per_req = config.max_request_tokens * per_token
    corpora = max(0, corpus_tokens) * per_token
    return MemoryEstimate(
        glob,
        per_req,
        max_running_requests,
        glob + per_req * max_running_requests + corpora,
        corpora,
    )
