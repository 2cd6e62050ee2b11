"""The host's external-corpus requests on HYBRID: served by its suffix drafter.

SGLang creates the scheduler's ``ExternalCorpusManager`` for NGRAM-route algorithms
only, so a HYBRID server answered ``/add_external_corpus`` with "Ngram speculative
decoding is not enabled". ``serving/external_corpus.py`` creates one for HYBRID too
(an AFTER hook on ``Scheduler.maybe_init_draft_worker``) and serves the tokenizer side
as for SUFFIX; this mixin answers the manager's four calls from HYBRID's suffix drafter
(the drafting-only SUFFIX worker HYBRID composes, ``hybrid_worker._suffix_drafter``)
and its ``CorpusStore``: the same bound (``SGLANG_SPEC_EXT_MAX_CORPUS_TOKENS``), scopes
(``name@salt``), build off the scheduler thread and attach on commit, reattachment
after a drafter rebuild. A corpus feeds the suffix drafts HYBRID chooses between, so
on text the corpus holds the suffix draft wins (up to the suffix width on wide steps).
"""

from __future__ import annotations

from typing import Any


class HybridCorporaMixin:
    """The four calls of the host's ``ExternalCorpusManager`` (see the module doc)."""

    _suffix: Any

    def _corpus_worker(self) -> Any:
        """HYBRID's suffix drafter: built at start-up once the target's attention backends
        exist, before the server takes requests (``hybrid_wide._resolve_wide``)."""
        if self._suffix is None:
            raise ValueError(
                "HYBRID's suffix drafter is not built yet (it is built at start-up, before "
                "the server takes requests); retry the corpus request"
            )
        return self._suffix

    def add_external_corpus(self, corpus_id: str, token_chunks: list[list[int]]) -> int:
        return self._corpus_worker().add_external_corpus(corpus_id, token_chunks)

    def commit_corpus_load(self, corpus_id: str, loaded_token_count: int) -> None:
        self._corpus_worker().commit_corpus_load(corpus_id, loaded_token_count)

    def remove_external_corpus(self, corpus_id: str) -> None:
        self._corpus_worker().remove_external_corpus(corpus_id)

    def list_external_corpora(self) -> dict[str, int]:
        return self._corpus_worker().list_external_corpora()
