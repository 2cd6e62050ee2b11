"""Adapter for ArcticInference's suffix cache (``arctic_inference.suffix_decoding``),
the reference implementation SUFFIX is compared against. Imported lazily: the
package is optional (its C++ suffix tree is built from the sdist).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from sglang_spec_ext.replay.protocol import Draft

#: ArcticInference's own drafting defaults (SuffixDecodingCache.speculate and vLLM's
#: suffix-decoding settings): a budget of 1 x match length, continuations >= 0.1.
ARCTIC_DEFAULTS: dict[str, float] = {
    "spec_factor": 1.0,
    "spec_offset": 0.0,
    "min_token_prob": 0.1,
}

ARCTIC_HINT = (
    "the 'arctic' drafter needs ArcticInference's suffix cache: "
    "pip install arctic-inference (builds its C++ suffix tree from the sdist)"
)


def load_arctic_cache_class() -> Any:
    """``SuffixDecodingCache`` or ``ImportError`` with an install hint."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as exc:
        raise ImportError(f"{ARCTIC_HINT} ({exc})") from exc
    return SuffixDecodingCache


def arctic_available() -> bool:
    try:
        load_arctic_cache_class()
    except ImportError:
        return False
    return True


class ArcticDrafter:
    """Drives ``SuffixDecodingCache`` with the replay drafter protocol.

    The pattern passed to ``speculate`` is the last ``max_depth`` tokens of the
    request's context (prompt + committed output), as vLLM's proposer does.
    """

    def __init__(
        self,
        max_depth: int = 64,
        spec_factor: float = 1.0,
        spec_offset: float = 0.0,
        min_token_prob: float = 0.1,
        max_cached_requests: int = -1,
        use_tree: bool = True,
    ) -> None:
        cache_cls = load_arctic_cache_class()
        self._cache = cache_cls(max_tree_depth=max_depth, max_cached_requests=max_cached_requests)
        self.max_depth = max_depth
        self.spec_factor = spec_factor
        self.spec_offset = spec_offset
        self.min_token_prob = min_token_prob
        self.use_tree = use_tree
        self._ctx: dict[Hashable, list[int]] = {}

    def start_request(self, req_id: Hashable, prompt_ids: Sequence[int]) -> None:
        self._cache.start_request(req_id, list(prompt_ids))
        self._ctx[req_id] = list(prompt_ids[-self.max_depth :])

    def extend_request(self, req_id: Hashable, token_ids: Sequence[int]) -> None:
        if not token_ids:
            return
        self._cache.add_active_response(req_id, list(token_ids))
        ctx = self._ctx[req_id]
        ctx.extend(token_ids)
        if len(ctx) > 2 * self.max_depth:
            del ctx[: len(ctx) - self.max_depth]

    def speculate(self, req_id: Hashable, max_nodes: int) -> Draft:
        if max_nodes <= 0:
            return Draft()
        ctx = self._ctx[req_id]
        draft = self._cache.speculate(
            req_id,
            ctx[-self.max_depth :],
            max_spec_tokens=max_nodes,
            max_spec_factor=self.spec_factor,
            max_spec_offset=self.spec_offset,
            min_token_prob=self.min_token_prob,
            use_tree_spec=self.use_tree,
        )
        return Draft(list(draft.token_ids), list(draft.parents))

    def finish_request(self, req_id: Hashable) -> None:
        self._cache.stop_request(req_id)
        self._ctx.pop(req_id, None)
