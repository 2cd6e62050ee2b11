"""The SUFFIX worker's external corpora (sglang/serving/external_corpus.py) with a real drafter,
and the tokenizer-manager hooks leaving other algorithms to the host."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sglang_spec_ext.sglang.serving.external_corpus import (
    SEPARATOR_TOKEN,
    CorpusStore,
    add_corpus_around,
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
