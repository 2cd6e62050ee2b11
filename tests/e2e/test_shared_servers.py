"""SUFFIX on a shared server (issue 28): tenant scopes and external corpora, served.

One SUFFIX server with the tiny model and default isolation (``scoped``):

* tenant isolation: tenant A asks questions, tenant B (another ``cache_salt``) asks
  the same ones, then A asks again. B's requests must commit no more tokens per
  verify step than A's first ones did on the fresh server (with the greedy tiny
  model they are the same steps: nothing of A's reaches B's drafts), while A's
  repeat is accelerated by A's own scope;
* the host's corpus endpoints (``/add_external_corpus``, ``/list_external_corpora``,
  ``/remove_external_corpus``): a corpus of the model's own answers raises the
  accept length of fresh tenants' requests; one limited to a salt helps that salt
  only; bad corpora (too large, not a list, a missing file) get a 400 with the
  reason and leave the server's trees as they were;
* every output equals the non-speculative server's.
"""

from __future__ import annotations

import json

import pytest
import requests

from tests.e2e.spec_metrics import accept_length

WIDTH = 8
NEW_TOKENS = 40
MAX_CORPUS_TOKENS = 4000
QUESTIONS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def reverse(items):\n    result = []\n    for item in items:\n",
    "A speculative decoder proposes several tokens and the target model",
]


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tiny_baseline_server, start_module_server):
    # Without the recycled top-k: its rank rates and suffix calibration are learned from
    # every tenant's steps (aggregate figures, no tenant's tokens), so a fresh tenant's
    # verify-step counts would drift from an earlier fresh tenant's; these tests compare
    # them exactly (corpora and scopes, not the recycled source: test_recycle_serving.py).
    env = {"SGLANG_SPEC_EXT_MAX_CORPUS_TOKENS": str(MAX_CORPUS_TOKENS),
           "SGLANG_SPEC_EXT_RECYCLE_TOPK": "0"}  # fmt: skip
    spec = start_module_server(
        tiny_model_dir,
        "--speculative-algorithm",
        "SUFFIX",
        "--speculative-num-draft-tokens",
        str(WIDTH),
        env=env,
    )
    return tiny_baseline_server, spec


def _ask(server, ids, salt=None):
    fields = {"cache_salt": salt} if salt else None
    return server.generate(
        input_ids=ids, max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True, fields=fields
    )


def _steps(server, prompts, salt, want):
    """Verify steps per request (fewer: more tokens accepted per step); outputs checked."""
    out = []
    for ids, expected in zip(prompts, want, strict=True):
        got = _ask(server, ids, salt)
        assert got["output_ids"] == expected, f"salt {salt}: output differs from plain serving"
        accept_length(got["meta_info"])  # speculation ran
        out.append(got["meta_info"]["spec_verify_ct"])
    return out


def test_tenant_b_gets_nothing_from_tenant_a(servers, tok):
    base, spec = servers
    prompts = [tok(q)["input_ids"] for q in QUESTIONS]
    want = [_ask(base, ids)["output_ids"] for ids in prompts]
    a_first = _steps(spec, prompts, "tenant-a", want)
    b = _steps(spec, prompts, "tenant-b", want)
    a_again = _steps(spec, prompts, "tenant-a", want)
    print(f"\nverify steps per request: A first {a_first}, B {b}, A again {a_again}")
    # B decodes as on a fresh server: exactly A's first steps, request by request.
    assert b == a_first
    # A's repeat drafts from A's scope: far fewer steps.
    assert sum(a_again) < 0.6 * sum(a_first)


def _post(server, path, body):
    return requests.post(server.base_url + path, json=body, timeout=120)


def _corpora(server):
    r = requests.get(server.base_url + "/list_external_corpora", timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["corpus_token_counts"]


def test_external_corpus_feeds_drafts_and_bad_ones_are_refused(servers, tok, tmp_path):
    base, spec = servers
    prompts = [tok(f"Question {i}: " + q)["input_ids"] for i, q in enumerate(QUESTIONS)]
    want = [_ask(base, ids)["output_ids"] for ids in prompts]
    before = _steps(spec, prompts, "fresh-1", want)

    # The model's own answers as token ids (the random tiny model's text does not
    # survive decode + encode; documents as text are checked below and measured with
    # a real model in benchmarks/external_corpus.py).
    sep = -(2**31)
    chunks = [
        ([sep] if i else []) + ids + out
        for i, (ids, out) in enumerate(zip(prompts, want, strict=True))
    ]
    docs = {"token_chunks": chunks}
    r = _post(spec, "/add_external_corpus", {"corpus_id": "answers", **docs})
    assert r.status_code == 200, r.text
    assert r.json()["loaded_token_count"] > 0
    assert set(_corpora(spec)) == {"answers"}
    with_corpus = _steps(spec, prompts, "fresh-2", want)
    print(f"\nverify steps: without corpus {before}, with corpus {with_corpus}")
    assert sum(with_corpus) < 0.6 * sum(before)

    # Removed: a fresh tenant decodes as before.
    r = _post(spec, "/remove_external_corpus", {"corpus_id": "answers"})
    assert r.status_code == 200, r.text
    assert _corpora(spec) == {}
    assert _steps(spec, prompts, "fresh-3", want) == before

    # Limited to one salt: that salt only.
    r = _post(spec, "/add_external_corpus", {"corpus_id": "answers@vip", **docs})
    assert r.status_code == 200, r.text
    assert _steps(spec, prompts, "fresh-4", want) == before
    assert sum(_steps(spec, prompts, "vip", want)) < 0.6 * sum(before)

    # Refusals: clear reasons, nothing attached or dropped.
    too_big = ["word " * (MAX_CORPUS_TOKENS + 10)]
    r = _post(spec, "/add_external_corpus", {"corpus_id": "big", "documents": too_big})
    assert r.status_code == 400 and "SGLANG_SPEC_EXT_MAX_CORPUS_TOKENS" in r.json()["message"]
    r = _post(spec, "/add_external_corpus", {"corpus_id": "bad", "documents": "not a list"})
    assert r.status_code == 400
    bad_file = tmp_path / "corpus.jsonl"
    bad_file.write_text('"fine"\n{not json\n')
    r = _post(spec, "/add_external_corpus", {"corpus_id": "bad", "file_path": str(bad_file)})
    assert r.status_code == 400 and "line 2" in r.json()["message"], r.text
    r = _post(spec, "/add_external_corpus", {"corpus_id": "@x", "documents": ["a b c"]})
    assert r.status_code == 400 and "name" in r.json()["message"]
    r = _post(spec, "/remove_external_corpus", {"corpus_id": "never-added"})
    assert r.status_code == 400
    assert set(_corpora(spec)) == {"answers@vip"}
    assert sum(_steps(spec, prompts, "vip", want)) < 0.6 * sum(before)

    # Text: a JSONL file as the host documents it, and documents.
    texts = [tok.decode(ids + out) for ids, out in zip(prompts, want, strict=True)]
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(d) + "\n" for d in texts))
    r = _post(spec, "/add_external_corpus", {"corpus_id": "from-file", "file_path": str(good)})
    assert r.status_code == 200, r.text
    r = _post(spec, "/add_external_corpus", {"corpus_id": "texts", "documents": texts})
    assert r.status_code == 200, r.text
    assert set(_corpora(spec)) == {"answers@vip", "from-file", "texts"}
    assert spec.healthy()
