"""Settings of the suffix drafter, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

# (lower, upper) inclusive bounds; anything outside is a configuration mistake.
#: Largest token bound of one tree: the native core's node ids, counts and
#: token offsets are 32-bit, and a tree over n tokens has fewer than 2n nodes.
MAX_TREE_TOKENS = 1 << 28
_INT_RANGES: dict[str, tuple[int, int]] = {
    "max_depth": (1, 1024),
    "max_cached_requests": (0, 10_000_000),
    "max_cached_tokens": (0, MAX_TREE_TOKENS),
    "max_request_tokens": (1, MAX_TREE_TOKENS),
    "global_prompt_cap": (0, MAX_TREE_TOKENS),
    "step_insert_tokens": (1, 1 << 30),
    "max_scope_tokens": (0, MAX_TREE_TOKENS),
}
_FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "max_spec_factor": (0.0, 1024.0),
    "max_spec_offset": (-1024.0, 1024.0),
    "min_token_prob": (0.0, 1.0),
}
_BOOLS = ("cache_prompts", "use_tree", "merge_drafts")

#: Option name (the plugin's SGLANG_SPEC_EXT_* fields, the replay/tune options) ->
#: SuffixConfig field. The one mapping: PluginConfig.suffix_config() and the replay
#: drafters both go through :func:`suffix_config_kwargs`.
OPTION_FIELDS: dict[str, str] = {
    "max_depth": "max_depth",
    "spec_factor": "max_spec_factor",
    "spec_offset": "max_spec_offset",
    "min_token_prob": "min_token_prob",
    "max_cached_requests": "max_cached_requests",
    "max_cached_tokens": "max_cached_tokens",
    "max_request_tokens": "max_request_tokens",
    "global_prompt_cap": "global_prompt_cap",
    "step_insert_tokens": "step_insert_tokens",
    "cache_prompts": "cache_prompts",
    "use_tree": "use_tree",
    "merge_drafts": "merge_drafts",
    "max_scope_tokens": "max_scope_tokens",
}


def suffix_config_kwargs(options: dict) -> dict:
    """``SuffixConfig`` keyword arguments from option-named values (others ignored)."""
    return {OPTION_FIELDS[k]: v for k, v in options.items() if k in OPTION_FIELDS}


#: Budget and probability settings of SUFFIX before issue 14 (Arctic-like: a draft
#: of at most one node per matched token, continuations below 10% dropped). The
#: replay table shows them as "the plugin's previous SUFFIX" (drafter ``suffix-prev``).
PREVIOUS_SUFFIX_SETTINGS: dict[str, float | bool] = {
    "max_spec_factor": 1.0,
    "max_spec_offset": 0.0,
    "min_token_prob": 0.1,
    "merge_drafts": False,
}


@dataclass(frozen=True)
class SuffixConfig:
    """How the suffix drafter matches, drafts and caches.

    max_depth: longest suffix matched, and the depth of the suffix trees (a draft
        never reaches deeper than max_depth tokens below the tree root).
    max_spec_factor, max_spec_offset: draft budget for a match of length m is
        min(max_nodes, floor(max_spec_factor * m + max_spec_offset)).
    min_token_prob: continuations whose path probability falls below this are
        not drafted.
    max_cached_requests, max_cached_tokens: bounds of the global trees (past and
        in-flight requests, every scope together); the oldest requests are
        evicted first. 0 in either disables the global trees.
    max_scope_tokens: bound of one scope's global tree (a tenant's: see
        ``SuffixDrafter.start_request``), its oldest requests evicted first; 0
        means max_cached_tokens (no bound of its own).
    cache_prompts: whether prompts enter the global tree (outputs always do).
    use_tree: draft a tree (True) or a single chain (False).
    merge_drafts: (tree drafts) merge the request tree's and the global tree's
        drafts into one tree, best nodes first by path probability (True), or
        keep the draft with the higher score (False, the behaviour before issue
        14; chain drafts always do this).
    max_request_tokens: bound of each per-request tree: it holds the request's
        most recent max_request_tokens tokens (a sliding window; the oldest
        strings leave as new tokens arrive). At least max_depth.
    global_prompt_cap: only the last min(global_prompt_cap, max_cached_tokens // 2)
        prompt tokens of a request enter the global tree, so one long prompt
        never evicts the whole cache.
    step_insert_tokens: prompt tokens are inserted incrementally: at most this
        many queued tokens (both trees together) per step, a step ending with
        each speculate / speculate_batch call. Until a request's tokens are all
        in a tree, it drafts from what that tree holds so far.
    """

    max_depth: int = 64
    # defaults chosen by `tune` across widths 8/16/32 on the committed traces (docs/suffix.md)
    max_spec_factor: float = 8.0
    max_spec_offset: float = 4.0
    min_token_prob: float = 0.02
    max_cached_requests: int = 10000  # 0 disables the global tree
    max_cached_tokens: int = 4_000_000
    cache_prompts: bool = True  # whether prompts enter the global tree
    use_tree: bool = True
    merge_drafts: bool = True
    max_request_tokens: int = 65536
    global_prompt_cap: int = 64  # tuned; a prompt is whole in its own request's tree
    step_insert_tokens: int = 4096
    max_scope_tokens: int = 0  # 0: max_cached_tokens

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
        if self.max_request_tokens < self.max_depth:
            raise ValueError(
                f"SuffixConfig.max_request_tokens={self.max_request_tokens!r} is invalid: "
                f"expected an int >= max_depth ({self.max_depth})"
            )

    @property
    def global_enabled(self) -> bool:
        """Whether the global tree (shared across requests) is in use."""
        return self.max_cached_requests > 0 and self.max_cached_tokens > 0

    @property
    def scope_tokens(self) -> int:
        """The effective bound of one scope's global tree."""
        if self.max_scope_tokens == 0:
            return self.max_cached_tokens
        return min(self.max_scope_tokens, self.max_cached_tokens)

    @property
    def global_prompt_tokens(self) -> int:
        """How many prompt tokens (the last ones) of a request enter the global tree."""
        if not self.cache_prompts:
            return 0
        return min(self.global_prompt_cap, self.max_cached_tokens // 2)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
