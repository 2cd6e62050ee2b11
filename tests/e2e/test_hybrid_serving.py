"""HYBRID on the real host's CPU engine: the host's model-draft path (STANDALONE with
a 1-layer draft of the tiny model; EAGLE3 with a random head) plus the suffix drafter,
chosen per request and step. Greedy output identical to plain serving for chains
(topk 1) and trees (topk 2), both sources verified, per-source figures in the log,
concurrency, an abort, sampling, and start-up errors naming the flag."""

from __future__ import annotations

import concurrent.futures as cf
import json

import pytest

from sglang_spec_ext.sglang.workers.hybrid_worker import STATS_LOG_MARK
from tests.e2e.spec_metrics import accept_length
from tests.e2e.test_standalone_serving import TOPK1, TOPK2, _cases, _greedy
from tests.e2e.test_suffix_serving import CODE
from tests.harness.server import abort_mid_stream

#: Stats line every decode step, so the test reads the latest figures.
STATS_ENV = {"SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}


def _hybrid(draft_dir, shape):
    return ("--speculative-algorithm", "HYBRID",
            "--speculative-draft-model-path", str(draft_dir), *shape)  # fmt: skip


@pytest.fixture(scope="module")
def chain_server(tiny_model_dir, weak_draft_dir, start_module_server):
    return start_module_server(tiny_model_dir, *_hybrid(weak_draft_dir, TOPK1), env=STATS_ENV)


@pytest.fixture(scope="module")
def tree_server(tiny_model_dir, weak_draft_dir, start_module_server):
    return start_module_server(tiny_model_dir, *_hybrid(weak_draft_dir, TOPK2), env=STATS_ENV)


def _stats(server) -> dict:
    text = server.log_path.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if STATS_LOG_MARK in ln]
    assert lines, "no HYBRID stats line in the server log"
    return json.loads(lines[-1].split(STATS_LOG_MARK, 1)[1])


def _parity(base, spec, tok, name, num_prompts=None):
    print(f"\n{name} accept length per prompt (tiny model, CPU engine):")
    accepted = []
    for label, ids in _cases(tok)[:num_prompts]:
        want = _greedy(base, ids)["output_ids"]
        got = _greedy(spec, ids)
        assert got["output_ids"] == want, f"{label}: {name} output differs from plain serving"
        accepted.append(accept_length(got["meta_info"]))
        print(f"  {label:<14} accept_len={accepted[-1]:5.2f}")
    return accepted


def test_hybrid_chain_parity_and_both_sources_used(tiny_baseline_server, chain_server, tok):
    accepted = _parity(tiny_baseline_server, chain_server, tok, "HYBRID topk 1 (1-layer draft)")
    assert all(1.0 <= a <= 16.0 for a in accepted)  # wide steps: up to the suffix width
    stats = _stats(chain_server)
    by = stats["by_source"]
    print("per source:", json.dumps(by))
    assert stats["choice_faults"] == 0
    assert by["suffix"]["steps"] > 0 and by["model"]["steps"] > 0
    # the suffix drafts that won were accepted better than one token per step
    assert by["suffix"]["accept_len"] > 1.2
    assert {"suffix", "model"} <= set(stats["learned"])


def test_hybrid_tree_parity(tiny_baseline_server, tree_server, tok):
    accepted = _parity(tiny_baseline_server, tree_server, tok, "HYBRID topk 2 (1-layer draft)")
    assert all(1.0 <= a <= 16.0 for a in accepted)  # wide steps: up to the suffix width
    stats = _stats(tree_server)
    assert stats["choice_faults"] == 0 and stats["by_source"]["suffix"]["steps"] > 0


def test_hybrid_concurrent_requests(tiny_baseline_server, chain_server, tok):
    prompts = [ids for _, ids in _cases(tok)]
    prompts = [ids + ids[: i % 5] for i, ids in enumerate(prompts * 2)][:12]
    want = [_greedy(tiny_baseline_server, ids, 16)["output_ids"] for ids in prompts]
    with cf.ThreadPoolExecutor(12) as pool:
        got = list(pool.map(lambda ids: _greedy(chain_server, ids, 16)["output_ids"], prompts))
    assert got == want


def test_hybrid_abort_and_sampling(tiny_baseline_server, tree_server, tok):
    ids = tok(CODE)["input_ids"]
    last = abort_mid_stream(tree_server, ids, 3000)
    assert last["finish_reason"]["type"] == "abort", last["finish_reason"]
    out = tree_server.generate(input_ids=ids, max_new_tokens=16, temperature=0.8, top_p=0.95,
                               ignore_eos=True)  # fmt: skip
    assert len(out["output_ids"]) == 16 and all(0 <= t < len(tok) for t in out["output_ids"])
    assert (
        _greedy(tree_server, ids, 16)["output_ids"]
        == _greedy(tiny_baseline_server, ids, 16)["output_ids"]
    )
    assert tree_server.healthy()


def test_hybrid_without_a_draft_model_is_refused(tiny_model_dir, start_server):
    from tests.harness.server import ServerStartError

    with pytest.raises(ServerStartError) as err:
        start_server(tiny_model_dir, "--speculative-algorithm", "HYBRID", *TOPK1)
    assert "--speculative-draft-model-path is missing" in str(err.value)


@pytest.fixture(scope="module")
def eagle3_server(tiny_model_dir, tmp_path_factory, start_module_server):
    from sglang_spec_ext.models.testing.llama import build_eagle3_head

    head = build_eagle3_head(tiny_model_dir, tmp_path_factory.mktemp("eagle3") / "head")
    return start_module_server(tiny_model_dir, *_hybrid(head, TOPK1), env=STATS_ENV)


def test_hybrid_with_an_eagle3_head_parity(tiny_baseline_server, eagle3_server, tok):
    """The head's architecture selects the host's EAGLE3 path (random weights: parity
    needs no good head; the suffix drafts carry the acceptance)."""
    _parity(tiny_baseline_server, eagle3_server, tok, "HYBRID EAGLE3 (random head)", 6)
    text = eagle3_server.log_path.read_text(errors="replace")
    assert "HybridEagle3Worker" in text
    assert _stats(eagle3_server)["choice_faults"] == 0


def test_hybrid_honours_per_request_caps(tiny_baseline_server, chain_server, tok):
    """sampling_params.custom_params.spec_ext.max_draft_tokens under HYBRID: 0 verifies
    no draft for that request (no draft token accepted) while its neighbours speculate,
    a cap bounds the accepted drafts per step; greedy output stays plain serving's."""
    ids = tok(", ".join(str(i) for i in range(40)))["input_ids"]
    want = _greedy(tiny_baseline_server, ids)["output_ids"]
    caps = [None, 0, 1, 0]

    def run(cap):
        extra = {} if cap is None else {"custom_params": {"spec_ext": {"max_draft_tokens": cap}}}
        return chain_server.generate(
            input_ids=ids, max_new_tokens=len(want), temperature=0, ignore_eos=True, **extra
        )

    with cf.ThreadPoolExecutor(len(caps)) as pool:
        got = list(pool.map(run, caps))
    for cap, out in zip(caps, got, strict=True):
        meta = out["meta_info"]
        assert out["output_ids"] == want, f"max_draft_tokens={cap} changed the output"
        if cap is not None:
            assert meta["spec_num_correct_drafts"] <= cap * meta["spec_verify_ct"], meta
    print("\nHYBRID per-request caps", caps, [accept_length(o["meta_info"]) for o in got])
    assert accept_length(got[0]["meta_info"]) > 1.0


def test_hybrid_grammar_requests_parity_and_shaped_suffix_drafts(
    tiny_baseline_server, tree_server, tok
):
    """Structured requests (JSON schema tool call, regex, JSON mode, free) under HYBRID:
    its suffix drafts are shaped by each request's grammar (suffix_grammar.py); greedy
    output stays plain constrained decoding's."""
    from tests.e2e.test_grammar_drafts import CONSTRAINTS, PROMPTS

    def ask(server, prompt, constraint):
        ids = tok(prompt)["input_ids"]
        return server.generate(input_ids=ids, max_new_tokens=40, temperature=0,
                               **constraint)["output_ids"]  # fmt: skip

    want = [ask(tiny_baseline_server, p, c) for p, c in zip(PROMPTS, CONSTRAINTS, strict=True)]
    for _ in range(2):
        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
            pairs = list(zip(PROMPTS, CONSTRAINTS, strict=True))
            got = list(pool.map(lambda pc: ask(tree_server, *pc), pairs))
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert a == b, f"request {i} ({CONSTRAINTS[i] or 'free'}) differs from plain"
    suffix = _stats(tree_server)["suffix"]
    assert suffix["grammar_requests"] > 0 and suffix["grammar_faults"] == 0, suffix


def test_hybrid_serves_external_corpora(tiny_baseline_server, chain_server, tok):
    """The host's corpus endpoints on HYBRID (the host gives only NGRAM-route algorithms
    a corpus manager; hybrid_corpora.py): a corpus of the model's own answers makes the
    suffix drafts win on fresh tenants' requests (fewer verify steps), one limited to a
    salt helps that salt only, removal takes the help away, bad input gets a 400; output
    stays plain serving's."""
    import requests

    starts = ["The quick brown fox", "def reverse(items):", "A speculative decoder proposes"]
    questions = [f"Question {i}: {q}" for i, q in enumerate(starts)]
    prompts = [tok(q)["input_ids"] for q in questions]
    want = [_greedy(tiny_baseline_server, ids, 40)["output_ids"] for ids in prompts]

    def steps(salt):
        out = []
        for ids, expected in zip(prompts, want, strict=True):
            got = chain_server.generate(input_ids=ids, max_new_tokens=40, temperature=0,
                                        ignore_eos=True, fields={"cache_salt": salt})  # fmt: skip
            assert got["output_ids"] == expected, f"salt {salt}: output differs from plain"
            out.append(got["meta_info"]["spec_verify_ct"])
        return out

    def post(path, body):
        return requests.post(chain_server.base_url + path, json=body, timeout=120)

    def corpora():
        r = requests.get(chain_server.base_url + "/list_external_corpora", timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["corpus_token_counts"]

    before = steps("hybrid-fresh-1")
    sep = -(2**31)
    chunks = [([sep] if i else []) + ids + out
              for i, (ids, out) in enumerate(zip(prompts, want, strict=True))]  # fmt: skip
    r = post("/add_external_corpus", {"corpus_id": "answers", "token_chunks": chunks})
    assert r.status_code == 200, r.text
    assert set(corpora()) == {"answers"}
    with_corpus = steps("hybrid-fresh-2")
    print(f"\nHYBRID verify steps: without corpus {before}, with corpus {with_corpus}")
    assert sum(with_corpus) < 0.6 * sum(before)
    r = post("/remove_external_corpus", {"corpus_id": "answers"})
    assert r.status_code == 200, r.text
    assert corpora() == {}
    # (HYBRID's learned choice moves between rounds: steps as before within a step or two)
    assert sum(steps("hybrid-fresh-3")) > 0.9 * sum(before)
    r = post("/add_external_corpus", {"corpus_id": "answers@vip", "token_chunks": chunks})
    assert r.status_code == 200, r.text
    assert sum(steps("hybrid-fresh-4")) > 0.9 * sum(before)
    assert sum(steps("vip")) < 0.6 * sum(before)
    r = post("/add_external_corpus", {"corpus_id": "bad", "documents": "not a list"})
    assert r.status_code == 400
    r = post("/remove_external_corpus", {"corpus_id": "never-added"})
    assert r.status_code == 400
    r = post("/remove_external_corpus", {"corpus_id": "answers@vip"})
    assert r.status_code == 200 and corpora() == {}
    assert chain_server.healthy()
