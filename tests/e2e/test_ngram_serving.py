"""The host's own NGRAM on the CPU engine, made possible by the plugin's CPU
fallbacks: lossless greedy output, accepted drafts, sampling, concurrency."""

from __future__ import annotations

import concurrent.futures as cf

import pytest

from tests.e2e.spec_metrics import accept_length
from tests.e2e.test_suffix_serving import PROMPTS

WIDTH = 8
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tiny_baseline_server, start_module_server):
    ngram = start_module_server(
        tiny_model_dir,
        "--speculative-algorithm",
        "NGRAM",
        "--speculative-num-draft-tokens",
        str(WIDTH),
    )
    return tiny_baseline_server, ngram


def _greedy(server, ids, n=NEW_TOKENS):
    return server.generate(input_ids=ids, max_new_tokens=n, temperature=0, ignore_eos=True)


def test_ngram_greedy_parity_and_accept_length(servers, tok):
    base, ngram = servers
    # Every prompt once, then three of them again: NGRAM's corpus holds their answers.
    cases = [(label, tok(p)["input_ids"], rep) for label, p, rep in PROMPTS]
    cases += [(f"again: {label}", tok(p)["input_ids"], True) for label, p, _ in PROMPTS[:3]]
    assert len(cases) >= 8
    print(f"\nNGRAM accept length per prompt (tiny model, CPU engine, width {WIDTH}):")
    for label, ids, must_accept in cases:
        want = _greedy(base, ids)["output_ids"]
        got = _greedy(ngram, ids)
        assert got["output_ids"] == want, f"{label}: NGRAM output differs"
        acc = accept_length(got["meta_info"])
        print(
            f"  {label:<20} accept_len={acc:5.2f}  verify_steps={got['meta_info']['spec_verify_ct']}"
        )
        if must_accept:
            assert acc > 1.0, f"{label}: no draft accepted"


def test_ngram_sampling_and_concurrency(servers, tok):
    base, ngram = servers
    vocab = len(tok)
    prompts = [tok(p * 2)["input_ids"] for _, p, _ in PROMPTS]
    sampled = ngram.generate(
        input_ids=prompts[0], max_new_tokens=24, temperature=0.9, top_p=0.95, ignore_eos=True
    )["output_ids"]
    assert len(sampled) == 24 and all(0 <= t < vocab for t in sampled)
    want = [_greedy(base, ids, 24)["output_ids"] for ids in prompts]
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda ids: _greedy(ngram, ids, 24)["output_ids"], prompts))
    assert got == want
