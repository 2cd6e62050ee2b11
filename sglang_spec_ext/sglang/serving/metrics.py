"""The plugin's metrics: Prometheus series on the host's ``/metrics`` and per-request
fields in ``meta_info``.

**Prometheus** (``--enable-metrics``). The host's scheduler builds its
``SchedulerMetricsCollector`` with labels ``model_name``, ``engine_type``, ``tp_rank``,
``pp_rank``, ``moe_ep_rank`` (plus ``dp_rank`` / ``priority`` / extra labels where
configured) and exports on the scheduling rank only (``attn_tp_rank == 0`` unless
``--enable-metrics-for-all-schedulers``). A hook after the host's
``SchedulerMetricsReporter.__post_init__`` takes the same decision and the same labels;
only then are our ``sglang:spec_ext_*`` series created (``prometheus_client`` is imported
then, after the host set ``PROMETHEUS_MULTIPROC_DIR``, so the series go through the
host's multi-process collection to the HTTP server's ``/metrics``). Until then, and for
good when metrics are off, every ``publish_*`` / ``on_*`` call returns at its first line.

The series are fed where the plugin already logs its figures, with the very numbers of
the log line: the SUFFIX drafter-stats line, the HYBRID stats line, the draft-KV repair
line; the adaptive choices (verify width of adaptive SUFFIX, draft steps of the model-draft
controller) are counted at each decode step. Cumulative figures become counters
(``*_total``, increased by the difference to the previous line), sizes become gauges.
docs/metrics.md lists every series and a PromQL query set.

**Per request** (always, for our algorithms): a small record on the host's ``Req``
(attribute :data:`REQ_ATTR`, freed with the request) counts, per source, the verify
steps and committed tokens (HYBRID) and the verify widths or draft steps the request ran
at (adaptive). When the request finishes, the record travels in the host's own
``customized_info`` channel as a request-level key and the tokenizer puts it in the
response's ``meta_info[META_KEY]`` next to the host's ``spec_*`` fields (non-streaming
responses; a streamed request-level field would be sent with the first chunk).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

logger = logging.getLogger("sglang_spec_ext")
F = TypeVar("F", bound=Callable[..., Any])

PREFIX = "sglang:spec_ext_"
#: Attribute on a host ``Req``: its :class:`RequestSpecStats`.
REQ_ATTR = "_spec_ext_req_stats"
#: ``meta_info`` key (and ``customized_info`` key) of the per-request record.
META_KEY = "spec_ext"

_HOST = "sglang.srt"
REPORTER_TARGET = (
    f"{_HOST}.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter.__post_init__"
)
_STREAMER = f"{_HOST}.managers.scheduler_components.output_streamer"
ACCEPT_TARGET = f"{_STREAMER}._GenerationStreamAccumulator.accept"
REQUEST_LEVEL_TARGET = f"{_STREAMER}.SchedulerOutputStreamer.is_request_level_customized_info_key"
META_TARGET = f"{_HOST}.managers.tokenizer_manager.TokenizerManager.update_request_meta_info"
VERIFY_TARGET = f"{_HOST}.speculative.eagle_worker_v2.EAGLEWorkerV2.verify"
DECODE_RESULT_TARGET = (
    f"{_HOST}.managers.scheduler_components.batch_result_processor."
    "SchedulerBatchResultProcessor.process_batch_result_decode"
)

#: name suffix -> (type, extra label names, documentation)
SERIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "drafter_sessions": ("gauge", (), "Requests with a live suffix-drafter session."),
    "drafter_cached_tokens": ("gauge", (), "Tokens in the suffix drafter's global tree."),
    "drafter_cached_tokens_bound": (
        "gauge", (), "Token bound of the global tree (max_cached_tokens)."),
    "drafter_cached_requests": ("gauge", (), "Past requests held by the global tree."),
    "drafter_cached_requests_bound": (
        "gauge", (), "Request bound of the global tree (max_cached_requests)."),
    "drafter_local_tokens": ("gauge", (), "Tokens in the per-request trees."),
    "drafter_pending_tokens": ("gauge", (), "Prompt tokens queued, not yet inserted."),
    "drafter_memory_bytes": ("gauge", (), "Bytes held by the native suffix-tree core."),
    "drafter_memory_bound_bytes": (
        "gauge", (), "Configured worst-case bytes: global tree plus one per-request tree "
        "per live session."),
    "draft_faults": ("counter", ("stage",), "Suffix-drafter faults absorbed, by stage."),
    "draft_gate_steps": (
        "counter", ("decision",), "SUFFIX draft-gate decisions on steps with drafts: "
        "verify or plain."),
    "hybrid_steps": ("counter", ("source",), "HYBRID verify steps per winning draft source."),
    "hybrid_committed_tokens": (
        "counter", ("source",), "HYBRID tokens committed (bonus included) per draft source."),
    "hybrid_choice_faults": (
        "counter", (), "HYBRID steps whose suffix drafting or choice failed (model drafts)."),
    "adaptive_decisions": (
        "counter", ("kind", "tier", "value"),
        "Decode steps per batch-size tier at each verify width (kind=width, adaptive "
        "SUFFIX) or draft step count (kind=steps, model drafts)."),
    "draft_kv_repairs": ("counter", (), "Draft-KV repair forwards."),
    "draft_kv_repaired_requests": ("counter", (), "Requests whose skipped draft KV was rebuilt."),
    "draft_kv_repaired_tokens": ("counter", (), "Draft-KV positions rebuilt."),
    "draft_kv_repair_deferred": ("counter", (), "Marked requests left for a later repair."),
    "draft_kv_repair_truncated": ("counter", (), "Repairs cut by the token budget."),
    "draft_kv_repair_failures": ("counter", (), "Repair failures (the repair then switches off)."),
    "draft_kv_unwritten_tokens": (
        "gauge", (), "Draft-KV tokens the next repair would rebuild."),
}  # fmt: skip

_DRAFTER_GAUGES = {
    "sessions": "drafter_sessions",
    "cached_tokens": "drafter_cached_tokens",
    "cached_requests": "drafter_cached_requests",
    "local_tokens": "drafter_local_tokens",
    "pending_tokens": "drafter_pending_tokens",
    "memory_bytes": "drafter_memory_bytes",
}
_REPAIR_COUNTERS = {
    "repairs": "draft_kv_repairs",
    "requests": "draft_kv_repaired_requests",
    "tokens": "draft_kv_repaired_tokens",
    "deferred": "draft_kv_repair_deferred",
    "truncated": "draft_kv_repair_truncated",
    "failures": "draft_kv_repair_failures",
}


class SpecExtMetrics:
    """Our Prometheus series of one process; inert until :meth:`enable`."""

    def __init__(self) -> None:
        self.enabled = False
        self.labels: dict[str, str] = {}
        self._series: dict[str, Any] = {}
        self._last: dict[tuple, float] = {}  # (name, labels) -> last cumulative value

    def enable(self, labels: dict[str, Any], registry: Any = None) -> None:
        """Create the series with the host's ``labels`` (``registry``: tests only)."""
        from prometheus_client import REGISTRY, Counter, Gauge

        if self.enabled:
            return
        self.labels = {k: str(v) for k, v in labels.items()}
        names = tuple(self.labels)
        for suffix, (kind, extra, doc) in SERIES.items():
            kw: dict[str, Any] = {"registry": registry if registry is not None else REGISTRY}
            if kind == "gauge":
                kw["multiprocess_mode"] = "mostrecent"
                cls: Any = Gauge
            else:
                cls = Counter
            self._series[suffix] = cls(PREFIX + suffix, doc, labelnames=(*names, *extra), **kw)
        self.enabled = True

    def set(self, suffix: str, value: float, **extra: Any) -> None:
        self._series[suffix].labels(**self.labels, **_str(extra)).set(value)

    def inc(self, suffix: str, amount: float = 1, **extra: Any) -> None:
        child = self._series[suffix].labels(**self.labels, **_str(extra))  # a 0 series too
        if amount > 0:
            child.inc(amount)

    def total(self, suffix: str, value: float, **extra: Any) -> None:
        """Counter ``suffix`` follows a cumulative figure (a restarted figure restarts)."""
        key = (suffix, tuple(sorted(extra.items())))
        last = self._last.get(key, 0)
        self._last[key] = value
        self.inc(suffix, value - last if value >= last else value, **extra)


def _str(extra: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in extra.items()}


METRICS = SpecExtMetrics()
_FAILED: list[str] = []  # names of feeding calls that raised (each logged once)


def _never_raises(fn: F) -> F:
    """Metrics must never stop a decode step: a feeding call that raises is logged
    once (with its traceback) and otherwise ignored."""

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception:  # noqa: BLE001
            if fn.__name__ not in _FAILED:
                _FAILED.append(fn.__name__)
                logger.exception("sglang-spec-ext metrics: %s failed (ignored)", fn.__name__)

    return guarded  # type: ignore[return-value]


# -- feeding the series (no-ops while metrics are off) --------------------------------
@_never_raises
def publish_drafter(stats: dict[str, Any], config: Any) -> None:
    """The SUFFIX drafter-stats line's figures (``SuffixWorker.drafter_stats()``)."""
    if not METRICS.enabled:
        return
    for key, suffix in _DRAFTER_GAUGES.items():
        if isinstance(stats.get(key), (int, float)):
            METRICS.set(suffix, stats[key])
    for stage, n in (stats.get("draft_faults_by_stage") or {}).items():
        METRICS.total("draft_faults", n, stage=stage)
    if "gate_steps_verified" in stats:  # SGLANG_SPEC_EXT_DRAFT_GATE=1
        METRICS.total("draft_gate_steps", stats["gate_steps_verified"], decision="verify")
        METRICS.total("draft_gate_steps", stats["gate_steps_plain"], decision="plain")
    if config is not None:
        METRICS.set("drafter_cached_tokens_bound", config.max_cached_tokens)
        METRICS.set("drafter_cached_requests_bound", config.max_cached_requests)
        bound = config.suffix_memory(int(stats.get("sessions", 0)))
        METRICS.set("drafter_memory_bound_bytes", bound.total)


@_never_raises
def publish_hybrid(stats: dict[str, Any]) -> None:
    """The HYBRID stats line's figures (``HybridMixin.hybrid_stats()``)."""
    if not METRICS.enabled:
        return
    for source, fig in (stats.get("by_source") or {}).items():
        METRICS.total("hybrid_steps", fig["steps"], source=source)
        METRICS.total("hybrid_committed_tokens", fig["committed_tokens"], source=source)
    METRICS.total("hybrid_choice_faults", stats.get("choice_faults", 0))


@_never_raises
def publish_repairs(repair_stats: Any) -> None:
    """The draft-KV repair line's counters (``model_drafts/kv_repair_marks.STATS``)."""
    if not METRICS.enabled:
        return
    for attr, suffix in _REPAIR_COUNTERS.items():
        METRICS.total(suffix, getattr(repair_stats, attr))
    METRICS.set("draft_kv_unwritten_tokens", repair_stats.unwritten_tokens)


def tier_of(controller: Any, bs: int) -> int:
    """The batch-size tier (its upper bound) of ``bs`` in an ``AdaptiveController``."""
    policy = controller.policy
    return int(policy.tiers[policy.tier_index(bs)])


@_never_raises
def on_adaptive_step(
    kind: str, controller: Any, bs: int, value: int, reqs: Sequence[Any] | None = None
) -> None:
    """One decode step at verify width (``kind="width"``) or draft steps (``"steps"``)
    ``value``: the decision counter (metrics on) and each request's record."""
    if reqs:
        note_requests(reqs, kind, value)
    if METRICS.enabled:
        METRICS.inc("adaptive_decisions", kind=kind, tier=tier_of(controller, bs), value=value)


# -- per request ------------------------------------------------------------------------
class RequestSpecStats:
    """One request's record: per source [verify steps, committed tokens]; per verify
    width / draft step count, verify steps. Bounded by the number of sources and widths."""

    __slots__ = ("sources", "widths", "steps")

    def __init__(self) -> None:
        self.sources: dict[str, list[int]] = {}
        self.widths: Counter[int] = Counter()
        self.steps: Counter[int] = Counter()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.sources:
            out["drafted_by"] = {
                s: {"steps": v[0], "committed_tokens": v[1]}
                for s, v in sorted(self.sources.items())
            }
        if self.widths:
            out["verify_widths"] = {str(w): n for w, n in sorted(self.widths.items())}
        if self.steps:
            out["draft_steps"] = {str(k): n for k, n in sorted(self.steps.items())}
        return out


def request_stats(req: Any) -> RequestSpecStats:
    rec = getattr(req, REQ_ATTR, None)
    if rec is None:
        rec = RequestSpecStats()
        setattr(req, REQ_ATTR, rec)
    return rec


def note_requests(reqs: Iterable[Any], kind: str, value: int) -> None:
    """Each request of a decode step ran at verify width / draft steps ``value``."""
    for req in reqs:
        rec = request_stats(req)
        (rec.widths if kind == "width" else rec.steps)[int(value)] += 1


@_never_raises
def note_sources(reqs: Sequence[Any], sources: Sequence[str], committed: Sequence[int]) -> None:
    """HYBRID: each request's winning source of this verify and the tokens it committed."""
    for req, source, n in zip(reqs, sources, committed, strict=True):
        fig = request_stats(req).sources.setdefault(source, [0, 0])
        fig[0] += 1
        fig[1] += int(n)


# -- host hooks ------------------------------------------------------------------------
def _after_reporter_init(result: Any, reporter: Any, *_a: Any, **_k: Any) -> None:
    """The host decided whether this scheduler exports metrics and with which labels."""
    collector = getattr(reporter, "metrics_collector", None)
    if getattr(reporter, "current_scheduler_metrics_enabled", False) and collector is not None:
        try:
            METRICS.enable(dict(collector.labels))
        except Exception:  # noqa: BLE001 - metrics must never stop the server
            logger.exception("sglang-spec-ext: could not create the spec_ext metrics")
    return None


def _before_accept(acc: Any, *args: Any, **kwargs: Any) -> None:
    """A finished request with a record: hand it to the host's customized_info."""
    req = kwargs.get("req", args[0] if args else None)
    rec = getattr(req, REQ_ATTR, None)
    if rec is not None and req.finished() and not req.finished_output:
        info = req.customized_info if req.customized_info is not None else {}
        info[META_KEY] = [rec.summary()]
        req.customized_info = info
    return None


def _request_level(original: Any, streamer: Any, key: str) -> bool:
    return key == META_KEY or original(streamer, key)


def _after_meta_info(result: Any, manager: Any, meta_info: dict, *_a: Any, **_k: Any) -> None:
    """The host accumulates customized fields into a list: ours is one record."""
    value = meta_info.get(META_KEY)
    if isinstance(value, list) and value:
        meta_info[META_KEY] = value[-1]
    return None


def _after_verify(result: Any, worker: Any, batch: Any, *_a: Any, **_k: Any) -> None:
    """Model drafts under our step controller (``GoodputStepPolicy`` of
    ``model_drafts/step_policy.py``, which marks itself): each request's draft step count."""
    policy = getattr(getattr(worker, "adaptive_controller", None), "params", None)
    if getattr(policy, "spec_ext_step_policy", False) is True and not batch.forward_mode.is_idle():
        note_requests(batch.reqs, "steps", int(worker.speculative_num_steps))
    return None


def _before_decode_result(_processor: Any, *args: Any, **kwargs: Any) -> None:
    """HYBRID: each request's winning source and the tokens it committed, counted where
    the scheduler reads a decode step's results on the host (after the host's own wait
    for their copy), so the worker never reads its accept lengths inside a step."""
    batch = kwargs.get("batch", args[0] if args else None)
    result = kwargs.get("result", args[1] if len(args) > 1 else None)
    sources = getattr(result, "spec_ext_sources", None)
    if not sources or batch is None:
        return None
    try:
        if result.copy_done is not None:
            result.copy_done.synchronize()  # what the host does first, a no-op after
        lens = result.accept_lens.tolist()  # the host's copy, on the host by now
        if len(lens) == len(sources) == len(batch.reqs):
            # not a request an earlier step finished (overlap ran one step past it)
            live = [i for i, req in enumerate(batch.reqs) if not req.finished()]
            note_sources(
                [batch.reqs[i] for i in live], [sources[i] for i in live], [lens[i] for i in live]
            )
    except Exception:  # noqa: BLE001 - figures must never stop the server
        logger.exception("sglang-spec-ext: could not count HYBRID's per-request sources")
    return None


def install_metrics() -> list[str]:
    """Register the hooks (idempotent); return the installed name."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once(
        [
            (REPORTER_TARGET, _after_reporter_init, HookType.AFTER),
            (ACCEPT_TARGET, _before_accept, HookType.BEFORE),
            (REQUEST_LEVEL_TARGET, _request_level, HookType.AROUND),
            (META_TARGET, _after_meta_info, HookType.AFTER),
            (VERIFY_TARGET, _after_verify, HookType.AFTER),
            (DECODE_RESULT_TARGET, _before_decode_result, HookType.BEFORE),
        ]
    )
    return ["metrics"]
