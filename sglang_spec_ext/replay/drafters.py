"""Drafters selectable by name for replay: ``suffix`` (ours), ``suffix-recycle`` (ours
merged with the target's recycled top-k from the trace's ``target_topk``) and
``recycle-only`` (the recycled top-k alone; both ``replay/recycle.py``), ``suffix-prev``
(ours with the settings before issue 14, ``PREVIOUS_SUFFIX_SETTINGS``), ``prompt-lookup``,
``ngram`` (the host's NGRAM corpus) and ``arctic`` (ArcticInference's suffix cache).

Optional drafters are imported only when chosen; a missing one raises
``DrafterUnavailable`` with what to install.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang_spec_ext.replay.protocol import Drafter
from sglang_spec_ext.suffix.config import PREVIOUS_SUFFIX_SETTINGS, SuffixConfig
from sglang_spec_ext.suffix.recycler import RecycleConfig

DRAFTER_NAMES = (
    "suffix",
    "suffix-recycle",
    "recycle-only",
    "suffix-prev",
    "prompt-lookup",
    "ngram",
    "arctic",
)
_SUFFIX_DEFAULTS = SuffixConfig()
_RECYCLE_DEFAULTS = RecycleConfig()


class DrafterUnavailable(RuntimeError):
    """The named drafter cannot be built here (missing optional package)."""


@dataclass
class DrafterOptions:
    """Settings shared by the drafters; each drafter reads the ones it has.

    ``width`` is the host verify width including the root; the host NGRAM corpus
    fixes its draft size to it.
    """

    width: int = 16
    # suffix / arctic (defaults: SuffixConfig's; ArcticInference's own are
    # replay.arctic.ARCTIC_DEFAULTS)
    max_depth: int = _SUFFIX_DEFAULTS.max_depth
    spec_factor: float = _SUFFIX_DEFAULTS.max_spec_factor
    spec_offset: float = _SUFFIX_DEFAULTS.max_spec_offset
    min_token_prob: float = _SUFFIX_DEFAULTS.min_token_prob
    max_cached_requests: int = -1
    use_tree: bool = True
    suffix_backend: str = "auto"  # suffix only: "auto", "native" or "python"
    # suffix-recycle / recycle-only (defaults: RecycleConfig's; min_prob None: the suffix
    # min_token_prob, as the server's PluginConfig.recycle_config() sets it)
    recycle_k: int = _RECYCLE_DEFAULTS.k
    recycle_min_prob: float | None = None
    recycle_max_depth: int = _RECYCLE_DEFAULTS.max_depth
    # prompt-lookup
    max_ngram: int = 3
    min_ngram: int = 1
    # host NGRAM (defaults of sglang 0.5.23's server args)
    ngram_max_trie_depth: int = 18
    ngram_min_bfs_breadth: int = 1
    ngram_max_bfs_breadth: int = 10
    ngram_match_type: str = "BFS"
    ngram_capacity: int = 10_000_000
    # anything else, passed to the suffix config by field name
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def suffix_config_kwargs(opts: DrafterOptions) -> dict[str, Any]:
    """``SuffixConfig`` keyword arguments for these options.

    ``max_cached_requests < 0`` (unbounded, as in ArcticInference) keeps the
    SuffixConfig default bound; ``extra`` entries are passed through by field name.
    """
    from sglang_spec_ext.suffix.config import suffix_config_kwargs as mapped

    options = opts.as_dict()
    if opts.max_cached_requests < 0:
        options.pop("max_cached_requests")
    return {**mapped(options), **opts.extra}


def _make_suffix(opts: DrafterOptions) -> Drafter:
    try:
        from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter
    except ImportError as exc:
        raise DrafterUnavailable(f"the suffix drafter is not available: {exc}") from exc
    try:
        config = SuffixConfig(**suffix_config_kwargs(opts))
    except TypeError as exc:  # an unknown field in `extra`
        raise ValueError(f"bad suffix setting: {exc}") from exc
    try:
        return SuffixDrafter(config, backend=opts.suffix_backend)
    except RuntimeError as exc:  # backend="native" without the compiled core
        raise DrafterUnavailable(str(exc)) from exc


def _make_suffix_prev(opts: DrafterOptions) -> Drafter:
    """Our suffix drafter with the budget and probability settings it had before
    issue 14 (``PREVIOUS_SUFFIX_SETTINGS``); the other options apply as given."""
    prev = dataclasses.replace(
        opts,
        spec_factor=PREVIOUS_SUFFIX_SETTINGS["max_spec_factor"],
        spec_offset=PREVIOUS_SUFFIX_SETTINGS["max_spec_offset"],
        min_token_prob=PREVIOUS_SUFFIX_SETTINGS["min_token_prob"],
        extra={**opts.extra, "merge_drafts": PREVIOUS_SUFFIX_SETTINGS["merge_drafts"]},
    )
    return _make_suffix(prev)


def recycle_config(opts: DrafterOptions) -> RecycleConfig:
    """The ``RecycleConfig`` of these options (``ValueError`` when out of range)."""
    min_prob = opts.min_token_prob if opts.recycle_min_prob is None else opts.recycle_min_prob
    if opts.recycle_k < 1 or opts.recycle_max_depth < 1 or not 0 <= min_prob <= 1:
        raise ValueError(
            f"bad recycle setting: k={opts.recycle_k} and max_depth={opts.recycle_max_depth} "
            f"must be >= 1, min_prob={min_prob} in [0, 1]"
        )
    return RecycleConfig(k=opts.recycle_k, min_prob=min_prob, max_depth=opts.recycle_max_depth)


def _make_suffix_recycle(opts: DrafterOptions) -> Drafter:
    """The ``suffix`` drafter (same options) merged with the recycled top-k."""
    from sglang_spec_ext.replay.recycle import RecycleDrafter

    return RecycleDrafter(_make_suffix(opts), recycle_config(opts))  # type: ignore[arg-type]


def _make_recycle_only(opts: DrafterOptions) -> Drafter:
    """The recycled top-k alone (the suffix draft empty)."""
    from sglang_spec_ext.replay.recycle import RecycleDrafter

    return RecycleDrafter(None, recycle_config(opts))


def _make_prompt_lookup(opts: DrafterOptions) -> Drafter:
    from sglang_spec_ext.replay.prompt_lookup import PromptLookupDrafter

    return PromptLookupDrafter(max_ngram=opts.max_ngram, min_ngram=opts.min_ngram)


def _make_ngram(opts: DrafterOptions) -> Drafter:
    try:
        from sglang_spec_ext.sglang.host.replay_ngram import HostNgramDrafter
    except ImportError as exc:
        raise DrafterUnavailable(
            f"the ngram drafter needs the host (sglang==0.5.23) NGRAM corpus: {exc}"
        ) from exc
    return HostNgramDrafter(
        width=opts.width,
        max_trie_depth=opts.ngram_max_trie_depth,
        min_bfs_breadth=opts.ngram_min_bfs_breadth,
        max_bfs_breadth=opts.ngram_max_bfs_breadth,
        match_type=opts.ngram_match_type,
        capacity=opts.ngram_capacity,
    )


def _make_arctic(opts: DrafterOptions) -> Drafter:
    from sglang_spec_ext.replay.arctic import ArcticDrafter

    try:
        return ArcticDrafter(
            max_depth=opts.max_depth,
            spec_factor=opts.spec_factor,
            spec_offset=opts.spec_offset,
            min_token_prob=opts.min_token_prob,
            max_cached_requests=opts.max_cached_requests,
            use_tree=opts.use_tree,
        )
    except ImportError as exc:
        raise DrafterUnavailable(str(exc)) from exc


_FACTORIES: dict[str, Callable[[DrafterOptions], Drafter]] = {
    "suffix": _make_suffix,
    "suffix-recycle": _make_suffix_recycle,
    "recycle-only": _make_recycle_only,
    "suffix-prev": _make_suffix_prev,
    "prompt-lookup": _make_prompt_lookup,
    "ngram": _make_ngram,
    "arctic": _make_arctic,
}


def make_drafter(name: str, opts: DrafterOptions | None = None) -> Drafter:
    """A fresh drafter by name (``DRAFTER_NAMES``)."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown drafter {name!r}; choose from {', '.join(DRAFTER_NAMES)}")
    return _FACTORIES[name](opts or DrafterOptions())


def drafter_factory(name: str, opts: DrafterOptions | None = None) -> Callable[[], Drafter]:
    """A zero-argument factory (fresh state per call) for ``replay`` and ``acceptance_table``."""
    opts = opts or DrafterOptions()
    return lambda: make_drafter(name, opts)


def available_drafters(opts: DrafterOptions | None = None) -> dict[str, str | None]:
    """name -> None if it can be built here, else the reason it cannot."""
    out: dict[str, str | None] = {}
    for name in DRAFTER_NAMES:
        try:
            make_drafter(name, opts)
            out[name] = None
        except DrafterUnavailable as exc:
            out[name] = str(exc)
    return out
