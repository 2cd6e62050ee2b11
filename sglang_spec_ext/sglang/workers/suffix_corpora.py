"""The host's external-corpus requests (``/add_external_corpus`` and friends) on SUFFIX.

The host's ``ExternalCorpusManager`` calls these four methods of the speculative
worker (``add_external_corpus`` on its loader thread); the host's NGRAM worker answers
them from its C++ n-gram corpus, the SUFFIX worker from its suffix drafter through the
worker's :class:`~sglang_spec_ext.sglang.serving.external_corpus.CorpusStore`
(``corpora``: bounds, scopes, and the reattachment after a drafter rebuild).
"""

from __future__ import annotations

from sglang_spec_ext.sglang.serving.external_corpus import CorpusStore
from sglang_spec_ext.suffix import SuffixDrafter


class ExternalCorporaMixin:
    """Answers the host's external-corpus calls (before ``NGRAMWorker`` in the MRO)."""

    drafter: SuffixDrafter
    corpora: CorpusStore

    def add_external_corpus(self, corpus_id: str, token_chunks: list[list[int]]) -> int:
        return self.corpora.build(corpus_id, token_chunks)

    def commit_corpus_load(self, corpus_id: str, loaded_token_count: int) -> None:
        self.corpora.commit(corpus_id)

    def remove_external_corpus(self, corpus_id: str) -> None:
        self.corpora.remove(corpus_id)

    def list_external_corpora(self) -> dict[str, int]:
        return self.drafter.corpora()
