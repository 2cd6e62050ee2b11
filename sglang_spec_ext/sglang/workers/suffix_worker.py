"""The SUFFIX speculative worker: the host's NGRAM worker with our drafter.

Everything after drafting is the host's own NGRAM path (verify input, tree
mask, CUDA graphs, greedy and sampling verify, KV moves, metrics, overlap
relay). This class replaces only the draft source and keeps the suffix drafter
in step with what every request has committed:

* a request seen for the first time in a decode batch starts a drafter session
  with its prompt; each step pushes the output tokens committed since the last
  step (under overlap scheduling the previous step's accepted tokens are not
  yet in ``req.output_ids`` and are spliced in, exactly as the host's NGRAM
  does);
* a request that leaves the decode batch (finished, aborted or retracted) is
  closed: its remaining tokens go to the global tree and its per-request state
  is freed. A retracted request that comes back simply starts a new session.

Drafter faults never stop serving: an exception while drafting (a C++
``out_of_range`` or ``bad_alloc`` surfacing as ``IndexError`` / ``MemoryError``,
a bad draft, anything) degrades the affected requests to an empty draft for that
step (plain decoding through the verify path: the output stays the target's),
drops their drafter session (it restarts from the request's tokens at the next
step) and is counted in :meth:`SuffixWorker.drafter_stats` and logged once per
request id. A fault while dropping a session resets the whole drafter.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from sglang.srt.runtime_context import get_device, get_schedule, get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.ngram_worker import NGRAMWorker

from sglang_spec_ext.sglang.serving import metrics as spec_metrics
from sglang_spec_ext.sglang.serving.external_corpus import CorpusStore
from sglang_spec_ext.sglang.serving.server_args import plugin_config
from sglang_spec_ext.sglang.verify.width_switch import WidthSwitchMixin
from sglang_spec_ext.sglang.verify.widths import VerifyWidthBackends
from sglang_spec_ext.sglang.workers import plain_step
from sglang_spec_ext.sglang.workers.fault_log import FaultLog
from sglang_spec_ext.sglang.workers.tp_sync import TpDraftError, TpSync, tp_sync
from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter
from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.suffix.gate import DraftGate, GateConfig
from sglang_spec_ext.suffix.scopes import scope_key
from sglang_spec_ext.verify.layout import pack_batch

logger = logging.getLogger("sglang_spec_ext")

#: The INFO line with the drafter statistics (JSON after the mark), logged at the first
#: decode step and then at most every SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S seconds (the
#: soak harness, sglang_spec_ext/soak/runner.py, reads them from the server log).
STATS_LOG_MARK = "sglang-spec-ext drafter stats: "


@dataclass
class _Session:
    """What the drafter has been told about one request."""

    synced: int = 0  # output tokens already pushed to the drafter
    req: Any = field(default=None, repr=False)  # the host Req, for the final push


def suffix_config_from_plugin_config() -> SuffixConfig:
    return plugin_config().suffix_config()


def _relayed_tokens(spec_info: Any, bs: int) -> tuple[list[int], list[int], int]:
    """The previous step's accepted tokens (overlap relay): ids, lengths, row stride.

    The stride is read from the relay itself (its rows are as wide as the host's
    future map, sized by the first relayed step), not from a width attribute that
    a batch made of merged or earlier steps may carry stale.
    """
    ids, lens = spec_info.accept_tokens, spec_info.accept_lens
    if not ids.is_cpu:
        ids, lens = ids.cpu(), lens.cpu()
    ids, lens = ids.tolist(), lens.tolist()
    if len(lens) != bs or (bs and len(ids) % bs):
        raise RuntimeError(
            f"overlap relay does not match the batch: {len(lens)} accept lengths and "
            f"{len(ids)} tokens for {bs} requests"
        )
    stride = len(ids) // bs if bs else 0
    if lens and max(lens) > stride:
        raise RuntimeError(f"overlap relay: accept length {max(lens)} > row stride {stride}")
    return ids, lens, stride


def _last_token(req: Any, prev: list[int]) -> int:
    """The request's last committed token: the root of its draft tree."""
    if prev:
        return prev[-1]
    out = req.output_ids
    return out[-1] if len(out) else req.origin_input_ids_unpadded[-1]


class _SessionCloser:
    """Stands where the host's NGRAM worker keeps its corpus object.

    ``NGRAMWorker.forward_batch_generation`` calls ``erase_match_state`` with the
    rids that left the decode batch and ``clear_cache_pool`` calls ``reset``.
    """

    def __init__(self, worker: SuffixWorker) -> None:
        self._worker = worker

    def erase_match_state(self, req_ids: list[str]) -> None:
        self._worker.close_sessions(req_ids)

    def reset(self) -> None:
        self._worker.reset_drafter()

    def synchronize(self) -> None:
        return None


class SuffixWorker(WidthSwitchMixin, NGRAMWorker):
    """``--speculative-algorithm SUFFIX``."""

    #: Capture width-1 target verify graphs at start-up for steps with no draft
    #: (adaptive SUFFIX captures every width of its ladder itself).
    NARROW_EMPTY_STEPS = True
    #: Gate each step on the drafts' calibrated worth (suffix/gate.py) when the config
    #: turns it on (adaptive SUFFIX does not: its controller chooses the width).
    USES_DRAFT_GATE = True

    def __init__(
        self,
        server_args: Any,
        gpu_id: int,
        nccl_port: int,
        target_worker: Any,
    ) -> None:
        # Not NGRAMWorker.__init__: it JIT-builds the host's C++ n-gram corpus,
        # which this worker never uses. The attributes below are the ones the
        # inherited NGRAM methods read (tests/host/test_suffix_worker.py checks
        # them against the host's NGRAMWorker.__init__).
        BaseSpecWorker.__init__(self)
        spec = get_spec()
        self.server_args = server_args
        self.enable_overlap = not get_schedule().disable_overlap_schedule
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.page_size = get_schedule().page_size
        self.draft_token_num = spec.speculative_num_draft_tokens
        self.speculative_num_draft_tokens = spec.speculative_num_draft_tokens
        self.max_trie_depth = spec.speculative_ngram_max_trie_depth
        self.topk = spec.speculative_eagle_topk
        self.speculative_num_steps = spec.speculative_num_steps
        self.device = get_device().device
        self.adaptive_controller = None
        self._prev_decode_rids: set = set()
        self.grammar_tree_host = None
        self._init_drafter()
        self._tp_sync = tp_sync()
        logger.info(
            "SUFFIX worker: verify width %d, drafter backend %s, overlap %s",
            self.draft_token_num,
            self.drafter.backend,
            self.enable_overlap,
        )

    @classmethod
    def drafting_only(cls, use_tree: bool | None = None) -> SuffixWorker:
        """The drafter and its request sessions without the host worker: what HYBRID
        (``hybrid_worker.py``) composes. ``use_tree=False`` drafts chains."""
        worker = object.__new__(cls)
        worker.enable_overlap = False
        worker._init_drafter(use_tree)
        worker._gate = None  # HYBRID chooses per request; it has its own calibration
        return worker

    def _init_drafter(self, use_tree: bool | None = None) -> None:
        """The drafter and its per-request sessions (no host runtime context needed)."""
        config = plugin_config()
        suffix_config = suffix_config_from_plugin_config()
        if use_tree is not None and use_tree != suffix_config.use_tree:
            suffix_config = dataclasses.replace(suffix_config, use_tree=use_tree)
        self.drafter = SuffixDrafter(suffix_config, backend=config.backend)
        self.max_width = getattr(self, "draft_token_num", 0)  # the startup verify width
        self._width_buffers: dict[int, dict[str, Any]] = {}
        self._verify_backends: VerifyWidthBackends | None = None
        self._narrow = False  # width-1 verify graphs for steps with no draft
        if self.drafter.backend != "native" and config.backend == "auto":
            logger.warning(
                "SUFFIX: the native suffix-tree core (sglang_spec_ext.suffix._native) is not "
                "built, so drafting falls back to the pure-Python drafter, 25-50x slower per "
                "step. Fix: install a C++17 compiler and pybind11, then reinstall with "
                "`pip install --no-build-isolation -e .` (SGLANG_SPEC_EXT_NO_NATIVE unset); "
                "`sglang-spec-ext doctor` checks it. Set SGLANG_SPEC_EXT_BACKEND=python to "
                "choose the Python drafter knowingly and silence this warning."
            )
        self.ngram_corpus = _SessionCloser(self)
        self._sessions: dict[str, _Session] = {}
        self._faults: Counter[str] = Counter()  # stage -> drafting faults absorbed
        self._fault_log = FaultLog()
        self._stats_logged_at: float | None = None
        self._stats_log_interval_s = config.stats_log_interval_s
        self._tp_sync: TpSync | None = None  # set by __init__ with TP > 1
        self._plain_steps = config.plain_steps  # empty steps as plain decode steps
        self._step_empty = False  # no request has a draft in the last drafted step
        # The draft gate (suffix/gate.py): fixed-width SUFFIX verifies only where it pays.
        self._gate = (
            DraftGate(GateConfig(cost_prior=config.draft_gate_cost))
            if (self.USES_DRAFT_GATE and config.draft_gate and config.plain_steps)
            else None
        )
        self._gate_step: tuple[int, bool, float] | None = None  # (bs, verified, start)
        self._staged: tuple[np.ndarray, np.ndarray] | None = None
        self._config = config  # the bounds the metrics report
        self._isolation = config.isolation
        self.corpora = CorpusStore(self, config.max_corpus_tokens)
        self._snapshots = None  # warm restarts (sglang/serving/snapshots.py), opt-in
        if config.snapshot_path:
            from sglang_spec_ext.sglang.serving.snapshots import SnapshotKeeper, snapshot_identity

            self._snapshots = SnapshotKeeper.from_plugin_config(config, snapshot_identity(self))
            if self._snapshots is not None:
                self._snapshots.load_into(self.drafter)

    # -- host NGRAM hooks we replace -----------------------------------------
    def forward_batch_generation(self, batch: Any, on_publish=None, pp_proxy_tensors=None):
        """The host's NGRAM step, or a plain decode step where no request of the batch
        has a draft (``plain_step.py``; the emptiness is the verified drafts', the same
        on every TP rank)."""
        self._staged = None
        if self._gate is not None:
            self._time_gate_step(batch)
        if self._plain_steps and batch.forward_mode.is_decode() and batch.reqs:
            tokens, mask = self._prepare_draft_tokens(batch)
            if self._gate is not None:
                self._gate_step = (len(batch.reqs), not self._step_empty, time.perf_counter())
            if self._step_empty:
                reason = plain_step.ineligible(batch, pp_proxy_tensors)
                if reason is None:
                    roots = torch.from_numpy(tokens[:: self.draft_token_num])
                    if self._narrow_fits(batch):
                        return self._narrow_step(batch, roots, on_publish, pp_proxy_tensors)
                    result = plain_step.ngram_plain_step(self, batch, roots, on_publish)
                    if result is not None:
                        return result
                else:
                    plain_step.STATS.count(False, reason)
            self._staged = (tokens, mask)
        return super().forward_batch_generation(batch, on_publish, pp_proxy_tensors)

    def init_cuda_graphs(self) -> None:
        """After the target's graphs (the scheduler's order): where the startup width has
        verify graphs, width-1 verify graphs too, on which a step with no draft for any
        request replays a decode-shaped forward (:meth:`_narrow_step`). Without them such
        a step runs the plain decode forward eagerly: the host's verify graph runner
        refuses a DECODE batch of an NGRAM-style worker (its width check), and eager
        kernel launches cost more than a replay on a GPU at small batch sizes."""
        super().init_cuda_graphs()
        if not (self.NARROW_EMPTY_STEPS and self._plain_steps and self.max_width > 1):
            return
        if getattr(self.model_runner, "decode_cuda_graph_runner", None) is None:
            return  # eager serving: such steps run as plain decode steps
        backends = VerifyWidthBackends(self.model_runner, self.max_width)
        try:
            backends.prepare_graphs((1,))
        except Exception as exc:  # an optimisation: serve without it, say so
            logger.warning(
                "SUFFIX: could not capture width-1 verify graphs (%s); steps with no draft "
                "run the plain decode forward eagerly (the width-%d verify graphs refuse a "
                "decode batch). SGLANG_SPEC_EXT_PLAIN_STEPS=0 silences this.",
                exc,
                self.max_width,
            )
            return
        self._verify_backends = backends
        self._narrow = True

    def _narrow_fits(self, batch: Any) -> bool:
        """Whether this step replays the width-1 verify graphs (captured, batch size
        within the captured sizes, the worker at its startup width)."""
        if not self._narrow or self.draft_token_num != self.max_width:
            return False
        runner = self._verify_backends.graph_runner(1)
        return runner is not None and len(batch.reqs) <= getattr(runner, "max_bs", 0)

    def _narrow_step(self, batch: Any, roots: torch.Tensor, on_publish, pp_proxy_tensors) -> Any:
        """A decode step with no draft for any request, where a verify graph runs it: the
        host's verify at width 1 (roots only) on the width-1 graphs, the relay padded
        back to the startup width."""
        bs = len(batch.reqs)
        self._use_width(1)
        try:
            self._staged = (roots.numpy().astype(np.int64), np.ones(bs, dtype=bool))
            result = super().forward_batch_generation(batch, on_publish, pp_proxy_tensors)
        finally:
            self._staged = None
            self._use_width(self.max_width)
        if result.next_draft_input is not None:
            self._pad_relay(result.next_draft_input, bs, 1)
        plain_step.STATS.count(False, narrow=True)
        return result

    def _time_gate_step(self, batch: Any) -> None:
        """The previous decode step's wall time (to this step's start, the same batch
        size: what bounds decode throughput, as the adaptive controller times it)."""
        prev, self._gate_step = self._gate_step, None
        if prev is None or not batch.forward_mode.is_decode():
            return
        bs, verified, start = prev
        if bs == len(batch.reqs):
            self._gate.on_step_time(bs, verified, time.perf_counter() - start)

    def after_plain_step(self, batch: Any) -> None:
        """What the host's NGRAM verify does after a step for the requests' match state."""
        cur_rids = {req.rid for req in batch.reqs}
        departed = self._prev_decode_rids - cur_rids
        if departed:
            self.ngram_corpus.erase_match_state(list(departed))
        self._prev_decode_rids = cur_rids

    def _prepare_draft_tokens(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        staged, self._staged = getattr(self, "_staged", None), None
        if staged is not None:  # drafted by forward_batch_generation for this step
            return staged
        if self._tp_sync is None:
            return self._local_drafts(batch)
        # TP: every rank verifies the first rank's drafts. The broadcast stays outside
        # the block that can fail: a rank whose drafting raised takes part with a zeroed
        # contribution; if the first rank failed, every rank plain-decodes the step.
        ok = True
        try:
            tokens, mask = self._local_drafts(batch)
        except Exception as exc:
            self._fault("prepare", None, exc)
            ok = False
            width = self.draft_token_num
            tokens = np.zeros((len(batch.reqs) * width,), dtype=np.int64)
            mask = np.zeros((len(batch.reqs) * width * width,), dtype=bool)
            self._step_empty = True
        try:
            tokens, mask, self._step_empty = self._tp_sync.drafts_flagged(
                tokens, mask, ok=ok, empty=self._step_empty
            )
            return tokens, mask
        except TpDraftError as exc:
            self._fault("tp-source", None, exc)
            return self._root_only_drafts(batch)

    def _root_only_drafts(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        """Empty drafts (plain decoding through the verify path) for the whole batch:
        the roots only, the same on every TP rank (they hold the same committed tokens)."""
        prevs = self._relayed_per_request(batch)
        roots = [_last_token(req, prev) for req, prev in zip(batch.reqs, prevs, strict=True)]
        self._step_empty = True
        return pack_batch([DraftTree() for _ in roots], roots, self.draft_token_num)

    def _relayed_per_request(self, batch: Any) -> list[list[int]]:
        """Per request, the accepted tokens of the previous step not yet in
        ``req.output_ids``. Same splice rule as the host's NGRAM: only overlap mode has
        such tokens (relayed by the host's future map)."""
        bs = len(batch.reqs)
        if not self.enable_overlap or batch.grammar_needs_sync():
            return [[] for _ in range(bs)]
        ids, lens, stride = _relayed_tokens(batch.spec_info, bs)
        return [ids[i * stride : i * stride + lens[i]] for i in range(bs)]

    def _local_drafts(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        self._maybe_log_stats()
        width = self.draft_token_num
        rids, roots, ok = [], [], []
        for req, prev in zip(batch.reqs, self._relayed_per_request(batch), strict=True):
            rids.append(req.rid)
            roots.append(_last_token(req, prev))
            ok.append(self._guarded("sync", req.rid, self._sync, req, prev))

        # A fault may have reset the whole drafter: draft only for live sessions.
        ok = [good and rid in self.drafter for rid, good in zip(rids, ok, strict=True)]
        trees = self._speculate([r for r, good in zip(rids, ok, strict=True) if good], width - 1)
        it = iter(trees)
        trees = [next(it) if good else DraftTree() for good in ok]
        if self._gate is not None and not self._gate.decide(rids, trees):
            trees = [DraftTree() for _ in trees]  # weak drafts: a plain step pays more
        self._step_empty = not any(len(tree.parents) for tree in trees)
        try:
            return pack_batch(trees, roots, width)
        except Exception as exc:  # a malformed draft: find it, plain-decode its request
            self._fault("pack", None, exc)
            for i, tree in enumerate(trees):
                try:
                    pack_batch([tree], [roots[i]], width)
                except Exception as tree_exc:
                    self._fault("pack", rids[i], tree_exc)
                    trees[i] = DraftTree()
            self._step_empty = not any(len(tree.parents) for tree in trees)
            return pack_batch(trees, roots, width)

    def _speculate(self, rids: list[str], max_nodes: int) -> list[DraftTree]:
        """Drafts for ``rids``; a request whose drafting fails gets an empty draft."""
        if not rids:
            return []
        try:
            trees = self.drafter.speculate_batch(rids, max_nodes)
            if len(trees) == len(rids):
                return trees
        except Exception:  # find the failing request(s); the others keep their drafts
            pass
        trees = []
        for rid in rids:
            try:
                trees.append(self.drafter.speculate(rid, max_nodes))
            except Exception as exc:
                self._fault("speculate", rid, exc)
                trees.append(DraftTree())
        return trees

    def _update_ngram_corpus(self, batch: Any) -> None:
        # The drafter is updated from committed tokens at the next draft
        # preparation (see _sync); nothing to insert after verify.
        return None

    # -- session bookkeeping --------------------------------------------------
    def _sync(self, req: Any, prev: list[int]) -> None:
        """Push what ``req`` committed since the last step to the drafter.

        The committed sequence is ``req.output_ids + prev``; only its new tail is
        read, so the cost per step does not grow with the output length.
        """
        out = req.output_ids
        total = len(out) + len(prev)
        session = self._sessions.get(req.rid)
        if session is not None and total < session.synced:
            # Output shrank (cannot happen in 0.5.23; be safe): start over.
            self._close(req.rid)
            session = None
        if session is None:
            scope = scope_key(
                getattr(req, "cache_salt", None),
                getattr(req, "extra_key", None),
                getattr(req, "lora_id", None),
                self._isolation,
            )
            self.drafter.start_request(req.rid, req.origin_input_ids_unpadded, scope=scope)
            session = self._sessions[req.rid] = _Session()
            if self._gate is not None:
                self._gate.forget(req.rid)
        if total > session.synced:
            start = session.synced
            new = list(out[start:]) + prev if start < len(out) else prev[start - len(out) :]
            self.drafter.extend_request(req.rid, new)
            if self._gate is not None:  # what the request's last draft was up against
                self._gate.on_committed(req.rid, new)
            session.synced = total
        session.req = req

    def _close(self, rid: str) -> None:
        if self._gate is not None:
            self._gate.forget(rid)
        session = self._sessions.pop(rid, None)
        if session is None:
            return
        req = session.req
        if req is not None and len(req.output_ids) > session.synced:
            # Tokens committed in the request's last step(s).
            self.drafter.extend_request(rid, list(req.output_ids[session.synced :]))
        self.drafter.finish_request(rid)

    def close_sessions(self, rids: list[str]) -> None:
        for rid in rids:
            self._guarded("close", rid, self._close, rid)

    def reset_drafter(self) -> None:
        self._sessions.clear()
        try:
            self.drafter.reset()
        except Exception as exc:
            self._fault("reset", None, exc)
            self._rebuild_drafter()

    def drafter_stats(self) -> dict:
        """Sessions, drafting faults absorbed (total and by stage) and the drafter's sizes."""
        stats: dict[str, Any] = {
            "sessions": len(self._sessions),
            "draft_faults": sum(self._faults.values()),
            "draft_faults_by_stage": dict(self._faults),
        }
        try:
            stats.update(self.drafter.stats())
        except Exception as exc:
            self._fault("stats", None, exc)
        if getattr(self, "_gate", None) is not None:
            stats.update(self._gate.stats())
        return stats

    def _maybe_log_stats(self) -> None:
        """Once per decode step (SUFFIX and HYBRID): the stats line when due, and the
        periodic snapshot when due (the keeper knows whether this rank writes it)."""
        if self._snapshots is not None:
            self._snapshots.maybe_save(self.drafter)
        now = time.monotonic()
        interval = self._stats_log_interval_s
        if self._stats_logged_at is not None and now - self._stats_logged_at < interval:
            return
        self._stats_logged_at = now
        stats = self.drafter_stats()
        logger.info("%s%s", STATS_LOG_MARK, json.dumps(stats, default=str))
        spec_metrics.publish_drafter(stats, self._config)

    # -- drafter faults ---------------------------------------------------------
    def _guarded(self, stage: str, rid: str, fn: Any, *args: Any) -> bool:
        """Run one drafter call for ``rid``; on a fault drop its session, return False."""
        try:
            fn(*args)
            return True
        except Exception as exc:
            self._fault(stage, rid, exc)
            return False

    def _fault(self, stage: str, rid: str | None, exc: BaseException) -> None:
        """Count and log a drafting fault; drop ``rid``'s (possibly broken) session."""
        self._faults[stage] += 1
        self._log_fault(stage, rid, exc)
        if rid is not None:
            self._drop_session(rid)

    def _drop_session(self, rid: str) -> None:
        self._sessions.pop(rid, None)
        if self._gate is not None:
            self._gate.forget(rid)
        if rid not in self.drafter:
            return
        try:
            self.drafter.abort_request(rid)
        except Exception as exc:
            # The drafter cannot even drop a request: start over with an empty one.
            self._faults["abort"] += 1
            self._log_fault("abort", rid, exc)
            self._sessions.clear()
            self._rebuild_drafter()

    def _rebuild_drafter(self) -> None:
        self._sessions.clear()
        try:
            self.drafter.reset()
        except Exception:
            self.drafter = SuffixDrafter(self.drafter.config, backend=self.drafter.backend)
            self.corpora.reattach()
        logger.warning("SUFFIX drafter reset after a fault; every request starts a new session")

    def _log_fault(self, stage: str, rid: str | None, exc: BaseException) -> None:
        self._fault_log.log(stage, rid, exc, sum(self._faults.values()))

    # -- the host's external-corpus requests (/add_external_corpus and friends) ---
    # The host's ExternalCorpusManager calls these (add on its loader thread).
    def add_external_corpus(self, corpus_id: str, token_chunks: list[list[int]]) -> int:
        return self.corpora.build(corpus_id, token_chunks)

    def commit_corpus_load(self, corpus_id: str, loaded_token_count: int) -> None:
        self.corpora.commit(corpus_id)

    def remove_external_corpus(self, corpus_id: str) -> None:
        self.corpora.remove(corpus_id)

    def list_external_corpora(self) -> dict[str, int]:
        return self.drafter.corpora()
