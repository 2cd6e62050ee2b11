"""Settings of the suffix drafter, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

# (lower, upper) inclusive bounds; anything outside is a configuration mistake.
_INT_RANGES: dict[str, tuple[int, int]] = {
    "max_depth": (1, 1024),
    "max_cached_requests": (0, 10_000_000),
    "max_cached_tokens": (0, 1 << 30),
}
_FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "max_spec_factor": (0.0, 1024.0),
    "max_spec_offset": (-1024.0, 1024.0),
    "min_token_prob": (0.0, 1.0),
}
_BOOLS = ("cache_prompts", "use_tree")


@dataclass(frozen=True)
class SuffixConfig:
    """How the suffix drafter matches, drafts and caches.

    max_depth: longest suffix matched, and the depth of the suffix trees (a draft
        never reaches deeper than max_depth tokens below the tree root).
    max_spec_factor, max_spec_offset: draft budget for a match of length m is
        min(max_nodes, floor(max_spec_factor * m + max_spec_offset)).
    min_token_prob: continuations whose path probability falls below this are
        not drafted.
    max_cached_requests, max_cached_tokens: bounds of the global tree (past and
        in-flight requests); the oldest requests are evicted first. 0 in either
        disables the global tree.
    cache_prompts: whether prompts enter the global tree (outputs always do).
    use_tree: draft a tree (True) or a single chain (False).
    """

    max_depth: int = 64
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    max_cached_requests: int = 10000  # 0 disables the global tree
    max_cached_tokens: int = 4_000_000
    cache_prompts: bool = True  # whether prompts enter the global tree
    use_tree: bool = True

    def __post_init__(self) -> None:
        for name, (lo, hi) in _INT_RANGES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(
                    f"SuffixConfig.{name}={value!r} is invalid: expected an int in [{lo}, {hi}]"
                )
        for name, (lo, hi) in _FLOAT_RANGES.items():
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok or not math.isfinite(value) or not lo <= value <= hi:
                raise ValueError(
                    f"SuffixConfig.{name}={value!r} is invalid: expected a number in [{lo}, {hi}]"
                )
            object.__setattr__(self, name, float(value))
        for name in _BOOLS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(
                    f"SuffixConfig.{name}={value!r} is invalid: expected True or False"
                )

    @property
    def global_enabled(self) -> bool:
        """Whether the global tree (shared across requests) is in use."""
        return self.max_cached_requests > 0 and self.max_cached_tokens > 0

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
