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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sglang.srt.runtime_context import get_device, get_schedule, get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.ngram_worker import NGRAMWorker

from sglang_spec_ext.sglang.server_args import plugin_config
from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter
from sglang_spec_ext.tree import pack_batch

logger = logging.getLogger("sglang_spec_ext")


@dataclass
class _Session:
    """What the drafter has been told about one request."""

    synced: int = 0  # output tokens already pushed to the drafter
    req: Any = field(default=None, repr=False)  # the host Req, for the final push


def suffix_config_from_plugin_config() -> SuffixConfig:
    cfg = plugin_config()
    return SuffixConfig(
        max_depth=cfg.max_depth,
        max_spec_factor=cfg.spec_factor,
        max_spec_offset=cfg.spec_offset,
        min_token_prob=cfg.min_token_prob,
        max_cached_requests=cfg.max_cached_requests,
        max_cached_tokens=cfg.max_cached_tokens,
        cache_prompts=cfg.cache_prompts,
        use_tree=cfg.use_tree,
    )


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


class SuffixWorker(NGRAMWorker):
    """``--speculative-algorithm SUFFIX``."""

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
        logger.info(
            "SUFFIX worker: verify width %d, drafter backend %s, overlap %s",
            self.draft_token_num,
            self.drafter.backend,
            self.enable_overlap,
        )

    def _init_drafter(self) -> None:
        """The drafter and its per-request sessions (no host runtime context needed)."""
        config = plugin_config()
        self.drafter = SuffixDrafter(suffix_config_from_plugin_config(), backend=config.backend)
        self.ngram_corpus = _SessionCloser(self)
        self._sessions: dict[str, _Session] = {}

    # -- host NGRAM hooks we replace -----------------------------------------
    def _prepare_draft_tokens(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        bs = len(batch.reqs)
        width = self.draft_token_num
        # Same splice rule as the host's NGRAM: only overlap mode has accepted
        # tokens that are not yet in req.output_ids.
        use_prev = self.enable_overlap and not batch.grammar_needs_sync()
        if use_prev:
            # The relayed step declares its own row stride (the adaptive worker
            # relays at the startup width whatever width it verified).
            stride = getattr(batch.spec_info, "draft_token_num", None) or width
            prev_ids = batch.spec_info.accept_tokens
            prev_lens = batch.spec_info.accept_lens
            if not prev_ids.is_cpu:
                prev_ids, prev_lens = prev_ids.cpu(), prev_lens.cpu()
            prev_ids, prev_lens = prev_ids.tolist(), prev_lens.tolist()
            assert len(prev_lens) == bs, (len(prev_lens), bs)

        rids, roots = [], []
        for i, req in enumerate(batch.reqs):
            prev = prev_ids[i * stride : i * stride + prev_lens[i]] if use_prev else []
            root = self._sync(req, prev)
            rids.append(req.rid)
            roots.append(root)

        trees = self.drafter.speculate_batch(rids, width - 1)
        tokens, mask = pack_batch(trees, roots, width)
        return tokens, mask

    def _update_ngram_corpus(self, batch: Any) -> None:
        # The drafter is updated from committed tokens at the next draft
        # preparation (see _sync); nothing to insert after verify.
        return None

    # -- session bookkeeping --------------------------------------------------
    def _sync(self, req: Any, prev: list[int]) -> int:
        """Push what ``req`` committed since the last step; return its last token.

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
            self.drafter.start_request(req.rid, req.origin_input_ids_unpadded)
            session = self._sessions[req.rid] = _Session()
        if total > session.synced:
            start = session.synced
            new = list(out[start:]) + prev if start < len(out) else prev[start - len(out) :]
            self.drafter.extend_request(req.rid, new)
            session.synced = total
        session.req = req
        if prev:
            return prev[-1]
        return out[-1] if len(out) else req.origin_input_ids_unpadded[-1]

    def _close(self, rid: str) -> None:
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
            self._close(rid)

    def reset_drafter(self) -> None:
        self._sessions.clear()
        self.drafter.reset()

    def drafter_stats(self) -> dict:
        return {"sessions": len(self._sessions), **self.drafter.stats()}

    # -- NGRAM features that do not apply ------------------------------------
    def add_external_corpus(self, corpus_id: str, token_chunks: list[list[int]]) -> int:
        raise NotImplementedError(
            "external corpora are a feature of --speculative-algorithm NGRAM; SUFFIX "
            "learns from served requests only"
        )

    def commit_corpus_load(self, corpus_id: str, loaded_token_count: int) -> None:
        self.add_external_corpus(corpus_id, [])

    def remove_external_corpus(self, corpus_id: str) -> None:
        self.add_external_corpus(corpus_id, [])

    def list_external_corpora(self) -> dict[str, int]:
        return {}
