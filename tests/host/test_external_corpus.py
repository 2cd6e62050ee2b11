"""The SUFFIX worker's external corpora (sglang/serving/external_corpus.py) with a real drafter,
the tokenizer-manager hooks leaving other algorithms to the host, and HYBRID's scheduler
getting the host's corpus manager (served: tests/e2e/test_hybrid_serving.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sglang_spec_ext.sglang.serving.external_corpus import (
    SCHEDULER_TARGET,
    SEPARATOR_TOKEN,
    CorpusStore,
    add_corpus_around,
    corpus_manager_after_draft_worker,
    install_external_corpus,
    list_corpora_around,
    remove_corpus_around,
    split_documents,
)
from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter
from sglang_spec_ext.suffix.scopes import scope_key


class _Worker:  # what CorpusStore reads of the SUFFIX worker: its drafter
    def __init__(self) -> None:
        self.drafter = SuffixDrafter(SuffixConfig(max_depth=8))


def test_split_documents():
    chunks = [[1, 2, SEPARATOR_TOKEN, 3], [4, SEPARATOR_TOKEN], [SEPARATOR_TOKEN, 5]]
    assert split_documents(chunks) == [[1, 2], [3, 4], [5]]
    for bad in ([[1, -5]], [[1, 2**31]], [[1, True]], [[1.5]], ["abc"]):
        with pytest.raises(ValueError, match="token"):
            split_documents(bad)


def test_build_off_thread_commit_and_bounds():
    worker = _Worker()
    store = CorpusStore(worker, max_tokens=20)
    out = {}
    t = threading.Thread(target=lambda: out.update(n=store.build("docs", [[1, 2, 3, 4, 5, 6]])))
    t.start()
    t.join()
    assert out["n"] == 6 and worker.drafter.corpora() == {}  # nothing drafts before commit
    store.commit("docs")
    assert worker.drafter.corpora() == {"docs": 6}
    worker.drafter.start_request("r", [1, 2, 3], scope=scope_key("t"))
    assert worker.drafter.speculate("r", 4).tokens[:3] == [4, 5, 6]

    with pytest.raises(ValueError, match="SGLANG_SPEC_EXT_MAX_CORPUS_TOKENS"):
        store.build("big", [list(range(15))])  # 6 in use + 15 > 20
    assert store.build("docs", [list(range(15))]) == 15  # replacing docs: 15 <= 20
    with pytest.raises(ValueError, match="no tokens"):
        store.build("empty", [[SEPARATOR_TOKEN]])
    with pytest.raises(ValueError, match="name"):
        store.build("@t", [[1, 2]])
    assert worker.drafter.corpora() == {"docs": 6}  # refusals and builds changed nothing
    with pytest.raises(ValueError, match="no external corpus"):
        store.remove("never")
    store.remove("docs")
    assert worker.drafter.corpora() == {}
    with pytest.raises(ValueError, match="are off"):
        CorpusStore(worker, max_tokens=0).build("docs", [[1, 2]])


def test_salt_limited_corpus_and_reattach_after_a_rebuild():
    worker = _Worker()
    store = CorpusStore(worker, max_tokens=100)
    store.build("docs@vip", [[1, 2, 3, 4, 5, 6]])
    store.commit("docs@vip")
    worker.drafter = SuffixDrafter(worker.drafter.config)  # the worker's fault path
    store.reattach()
    worker.drafter.start_request("v", [1, 2, 3], scope=scope_key("vip"))
    worker.drafter.start_request("o", [1, 2, 3], scope=scope_key("other"))
    assert worker.drafter.speculate("v", 4).tokens[:3] == [4, 5, 6]
    assert worker.drafter.speculate("o", 4).tokens == []


def test_hooks_leave_other_algorithms_to_the_host():
    """No published SUFFIX config in this process: each hook calls the host's method."""
    calls = []

    async def original(self, *args):
        calls.append(args)
        return "host"

    async def run():
        return [
            await add_corpus_around(original, object(), "obj"),
            await remove_corpus_around(original, object(), "id"),
            await list_corpora_around(original, object()),
        ]

    assert asyncio.run(run()) == ["host", "host", "host"]
    assert calls == [("obj",), ("id",), ()]


def test_hooks_are_registered_on_the_host_mixin():
    from sglang.srt.plugins.hook_registry import HookRegistry

    install_external_corpus()
    assert install_external_corpus() == []  # idempotent
    target = "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin"
    for method, hook in (
        ("add_external_corpus", add_corpus_around),
        ("remove_external_corpus", remove_corpus_around),
        ("list_external_corpora", list_corpora_around),
    ):
        assert any(h is hook for _t, h, _s in HookRegistry._hooks[f"{target}.{method}"])
    assert any(
        h is corpus_manager_after_draft_worker
        for _t, h, _s in HookRegistry._hooks[SCHEDULER_TARGET]
    )


def test_a_hybrid_scheduler_gets_the_hosts_corpus_manager_others_keep_theirs():
    from types import SimpleNamespace

    from sglang.srt.speculative.external_corpus_manager import ExternalCorpusManager

    from sglang_spec_ext.sglang.workers.hybrid_corpora import HybridCorporaMixin

    class Hybrid(HybridCorporaMixin):  # what the manager calls: the mixin's four methods
        def __init__(self) -> None:
            self._suffix = None

    sent = []
    ipc = SimpleNamespace(send_to_tokenizer=SimpleNamespace(send_output=sent.append))
    hybrid = SimpleNamespace(draft_worker=Hybrid(), external_corpus_manager=None,
                             ipc_channels=ipc)  # fmt: skip
    assert corpus_manager_after_draft_worker("r", hybrid) == "r"
    manager = hybrid.external_corpus_manager
    assert isinstance(manager, ExternalCorpusManager) and manager._worker is hybrid.draft_worker
    # Before HYBRID's suffix drafter exists, a corpus call says so (the manager answers
    # the request with the message, the server goes on).
    with pytest.raises(ValueError, match="suffix drafter is not built yet"):
        hybrid.draft_worker.list_external_corpora()
    # Any other worker: the host's decision stands (NGRAM's manager, or none).
    kept = object()
    ngram = SimpleNamespace(draft_worker=_Worker(), external_corpus_manager=kept)
    corpus_manager_after_draft_worker(None, ngram)
    assert ngram.external_corpus_manager is kept
    other = SimpleNamespace(draft_worker=object(), external_corpus_manager=None)
    corpus_manager_after_draft_worker(None, other)
    assert other.external_corpus_manager is None
