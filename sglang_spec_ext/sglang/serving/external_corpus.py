"""External corpora for SUFFIX and HYBRID: the host's NGRAM corpus API served by our drafter.

The host serves ``POST /add_external_corpus`` (``documents`` or a JSONL
``file_path``, an optional ``corpus_id``), ``POST /remove_external_corpus`` and
``GET /list_external_corpora`` for NGRAM: the tokenizer manager tokenizes the
documents and fans the tokens out to every scheduler, whose
``ExternalCorpusManager`` builds the corpus on a loader thread through the draft
worker's ``add_external_corpus`` and attaches it on the scheduler thread
(``commit_corpus_load``). Two pieces make that path serve SUFFIX:

* :class:`CorpusStore`, the worker side: builds a read-only suffix tree per
  corpus off the scheduler thread, checks the plugin's bound
  (``SGLANG_SPEC_EXT_MAX_CORPUS_TOKENS``, all corpora together) before building,
  attaches it on commit. A refused or failed load changes nothing that drafts.
* AROUND hooks on the tokenizer manager's three methods, which answer "Ngram
  speculative decoding is not enabled" for any other algorithm: for SUFFIX they
  run the same steps with our bound (documents over it are refused, not
  truncated) and also take ``token_chunks`` (token ids, documents separated by
  the host's separator id) as given; every other algorithm keeps the host's
  behaviour.

A corpus id ``name@salt1,salt2`` limits the corpus to requests with one of those
cache salts (``suffix/scopes.py``); a plain name feeds every request.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sglang_spec_ext.suffix.scopes import parse_corpus_id

logger = logging.getLogger("sglang_spec_ext")

#: The host's document separator in corpus token streams
#: (sglang/srt/speculative/cpp_ngram/external_corpus.py SEPARATOR_TOKEN).
SEPARATOR_TOKEN = -(2**31)
_MIXIN = "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin"
#: Algorithms whose corpus requests these hooks serve. The host creates the scheduler's
#: corpus manager for NGRAM-route algorithms only (SUFFIX is one); for HYBRID the AFTER
#: hook on ``Scheduler.maybe_init_draft_worker`` creates it (``workers/hybrid_corpora.py``).
CORPUS_ALGORITHMS = ("SUFFIX", "HYBRID")
SCHEDULER_TARGET = "sglang.srt.managers.scheduler.Scheduler.maybe_init_draft_worker"
BOUND_ENV = "SGLANG_SPEC_EXT_MAX_CORPUS_TOKENS"


def _refuse_if_off(max_tokens: int) -> None:
    if max_tokens == 0:
        raise ValueError(f"external corpora are off on this server ({BOUND_ENV}=0)")


def _over_bound(what: str, total: int, max_tokens: int) -> ValueError:
    return ValueError(
        f"{what} hold {total} tokens, over the external corpus bound of {max_tokens} "
        f"({BOUND_ENV}); nothing was loaded"
    )


def split_documents(token_chunks: list[list[int]]) -> list[list[int]]:
    """The host's chunked stream (documents joined by SEPARATOR_TOKEN) -> documents."""
    docs: list[list[int]] = [[]]
    for n, chunk in enumerate(token_chunks):
        if not isinstance(chunk, (list, tuple)):
            raise ValueError(f"token chunk {n} is a {type(chunk).__name__}, not a list of ids")
        for t in chunk:
            if t == SEPARATOR_TOKEN:
                docs.append([])
            elif isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**31:
                raise ValueError(f"token chunk {n} holds {t!r}, not a token id")
            else:
                docs[-1].append(t)
    return [d for d in docs if d]


class CorpusStore:
    """The SUFFIX worker's corpora: built on the loader thread, attached on commit."""

    def __init__(self, worker: Any, max_tokens: int) -> None:
        self._worker = worker
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[Any, list[str]]] = {}
        self._attached: dict[str, tuple[Any, list[str]]] = {}

    def build(self, corpus_id: str, token_chunks: list[list[int]]) -> int:
        """Build (any thread); raises ValueError with the reason when refused."""
        name_scopes = parse_corpus_id(corpus_id)
        _refuse_if_off(self.max_tokens)
        docs = split_documents(token_chunks or [])
        tokens = sum(len(d) for d in docs)
        if tokens == 0:
            raise ValueError(f"corpus {corpus_id!r} has no tokens")
        with self._lock:
            used = sum(c.tokens for n, (c, _) in self._attached.items() if n != corpus_id)
        if used + tokens > self.max_tokens:
            raise ValueError(
                f"corpus {corpus_id!r} has {tokens} tokens; the corpora together may hold "
                f"{self.max_tokens} ({BOUND_ENV}) and {used} are in use"
            )
        corpus = self._worker.drafter.build_corpus(docs)
        with self._lock:
            self._pending[corpus_id] = (corpus, name_scopes[1])
        return int(corpus.tokens)

    def commit(self, corpus_id: str) -> None:
        """Attach a built corpus (the scheduler thread)."""
        with self._lock:
            corpus, scopes = self._pending.pop(corpus_id)
            self._worker.drafter.attach_corpus(corpus_id, corpus, scopes)
            self._attached[corpus_id] = (corpus, scopes)
        logger.info(
            "sglang-spec-ext: external corpus %r attached: %d tokens%s",
            corpus_id,
            corpus.tokens,
            f" for {len(scopes)} cache salt(s)" if scopes else " for every request",
        )

    def remove(self, corpus_id: str) -> None:
        with self._lock:
            if not self._worker.drafter.remove_corpus(corpus_id):
                raise ValueError(f"no external corpus {corpus_id!r} is loaded")
            self._attached.pop(corpus_id, None)

    def reattach(self) -> None:
        """After the drafter was rebuilt (a fault): its corpora again."""
        with self._lock:
            for corpus_id, (corpus, scopes) in self._attached.items():
                self._worker.drafter.attach_corpus(corpus_id, corpus, scopes)


# -- tokenizer manager (the HTTP process) ----------------------------------------------
def _serves_corpora() -> bool:
    from sglang.srt.runtime_context import get_spec

    try:
        return get_spec().speculative_algorithm in CORPUS_ALGORITHMS
    except Exception:
        return False


def _max_tokens() -> int:
    from sglang_spec_ext.sglang.serving.server_args import plugin_config

    return plugin_config().max_corpus_tokens


def _tokenize_documents(tokenizer: Any, documents: list[str], max_tokens: int) -> list[list[int]]:
    if not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
        raise ValueError("documents must be a list of strings")
    chunks: list[list[int]] = []
    total = 0
    for doc in documents:
        ids = list(tokenizer.encode(doc, add_special_tokens=False)) if doc else []
        if not ids:
            continue
        if chunks:
            ids = [SEPARATOR_TOKEN, *ids]
        total += len(ids)
        if total > max_tokens:
            raise _over_bound("the documents", total, max_tokens)
        chunks.append(ids)
    return chunks


def _check_token_chunks(chunks: Any, max_tokens: int) -> None:
    if not isinstance(chunks, list) or not all(isinstance(c, list) for c in chunks):
        raise ValueError("token_chunks must be a list of lists of token ids")
    total = sum(len(c) for c in chunks)
    if total > max_tokens:
        raise _over_bound("token_chunks", total, max_tokens)
    split_documents(chunks)  # token ids and separators only


async def add_corpus_around(original: Any, self: Any, obj: Any) -> Any:
    """AROUND ``TokenizerControlMixin.add_external_corpus``."""
    if not _serves_corpora():
        return await original(self, obj)
    from sglang.srt.managers.communicator import FanOutCommunicator
    from sglang.srt.managers.io_struct import AddExternalCorpusReqOutput

    self.auto_create_handle_loop()
    try:
        max_tokens = _max_tokens()
        _refuse_if_off(max_tokens)
        if not obj.corpus_id:
            import uuid

            obj.corpus_id = uuid.uuid4().hex
        parse_corpus_id(obj.corpus_id)
        if obj.file_path is not None:
            from sglang.srt.speculative.cpp_ngram.external_corpus import (
                iter_external_corpus_chunks,
            )

            obj.token_chunks = list(
                iter_external_corpus_chunks(obj.file_path, self.tokenizer, max_tokens)
            )
        elif obj.documents is not None:
            obj.token_chunks = _tokenize_documents(self.tokenizer, obj.documents, max_tokens)
        elif obj.token_chunks is not None:  # token ids as they are (SUFFIX only)
            _check_token_chunks(obj.token_chunks, max_tokens)
        else:
            raise ValueError("Either file_path, documents or token_chunks must be provided.")
        obj.file_path = None
        obj.documents = None
        results = await self.add_external_corpus_communicator(obj)
        ok, message = FanOutCommunicator.merge_results(results)
        return AddExternalCorpusReqOutput(
            success=ok,
            corpus_id=results[0].corpus_id if ok else "",
            message=message,
            loaded_token_count=results[0].loaded_token_count if ok else 0,
        )
    except Exception as e:
        return AddExternalCorpusReqOutput(success=False, message=str(e))


async def remove_corpus_around(original: Any, self: Any, corpus_id: str) -> Any:
    """AROUND ``TokenizerControlMixin.remove_external_corpus``."""
    if not _serves_corpora():
        return await original(self, corpus_id)
    from sglang.srt.managers.communicator import FanOutCommunicator
    from sglang.srt.managers.io_struct import (
        RemoveExternalCorpusReqInput,
        RemoveExternalCorpusReqOutput,
    )

    self.auto_create_handle_loop()
    results = await self.remove_external_corpus_communicator(
        RemoveExternalCorpusReqInput(corpus_id=corpus_id)
    )
    ok, message = FanOutCommunicator.merge_results(results)
    return RemoveExternalCorpusReqOutput(success=ok, message=message)


async def list_corpora_around(original: Any, self: Any) -> Any:
    """AROUND ``TokenizerControlMixin.list_external_corpora``."""
    if not _serves_corpora():
        return await original(self)
    from sglang.srt.managers.communicator import FanOutCommunicator
    from sglang.srt.managers.io_struct import (
        ListExternalCorporaReqInput,
        ListExternalCorporaReqOutput,
    )

    self.auto_create_handle_loop()
    results = await self.list_external_corpora_communicator(ListExternalCorporaReqInput())
    ok, message = FanOutCommunicator.merge_results(results)
    counts = results[0].corpus_token_counts if ok else {}
    return ListExternalCorporaReqOutput(success=ok, corpus_token_counts=counts, message=message)


# -- scheduler ---------------------------------------------------------------------------
def corpus_manager_after_draft_worker(result: Any, scheduler: Any, *args: Any, **kw: Any) -> Any:
    """AFTER ``Scheduler.maybe_init_draft_worker``: a HYBRID draft worker gets the host's
    ``ExternalCorpusManager``, as the host gives NGRAM's (any other worker: unchanged)."""
    from sglang_spec_ext.sglang.workers.hybrid_corpora import HybridCorporaMixin

    worker = getattr(scheduler, "draft_worker", None)
    if getattr(scheduler, "external_corpus_manager", None) is not None or not isinstance(
        worker, HybridCorporaMixin
    ):
        return result
    from sglang.srt.speculative.external_corpus_manager import ExternalCorpusManager

    scheduler.external_corpus_manager = ExternalCorpusManager(
        worker, scheduler.ipc_channels.send_to_tokenizer.send_output
    )
    return result


def install_external_corpus() -> list[str]:
    """Register the tokenizer-manager and scheduler hooks (idempotent)."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    hooks = [
        (f"{_MIXIN}.add_external_corpus", add_corpus_around, HookType.AROUND),
        (f"{_MIXIN}.remove_external_corpus", remove_corpus_around, HookType.AROUND),
        (f"{_MIXIN}.list_external_corpora", list_corpora_around, HookType.AROUND),
        (SCHEDULER_TARGET, corpus_manager_after_draft_worker, HookType.AFTER),
    ]
    return ["external_corpus"] if register_hooks_once(hooks) else []
