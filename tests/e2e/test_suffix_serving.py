"""--speculative-algorithm SUFFIX served by the real SGLang server on CPU (tiny model).

Greedy output must equal the non-speculative server's token for token; the
accept length (from the host's own ``meta_info``) is printed and must exceed 2
where the text repeats or an earlier answer is asked for again.
"""

from __future__ import annotations

import concurrent.futures as cf

import pytest

from tests.e2e.spec_metrics import accept_length, plain_step_counts
from tests.harness.server import abort_mid_stream

WIDTH = 8
NEW_TOKENS = 48
SUFFIX_ARGS = ("--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH))

CODE = "def reverse(items):\n    result = []\n    for item in items:\n        result.insert(0, item)\n    return result\n"
# (label, prompt, must accept > 2?). A random-weight model does not copy its prompt,
# so prompt repetition alone is no reason for acceptance here (the SmolLM2 test
# checks that on real text); what must be accepted is output that repeats itself
# ("counting" makes this model loop) and answers the global tree has seen before.
PROMPTS = [
    ("code x3", CODE * 3, False),
    ("sentence x4", "The quick brown fox jumps over the lazy dog. " * 4, False),
    ("counting", ", ".join(str(i) for i in range(40)), True),
    ("list x3", "for i in range(10):\n    print(i, add(i, i))\n" * 3, False),
    ("short", "hello world", False),
    ("prose", "A speculative decoder proposes several tokens and the target model", False),
    ("class", "class Counter:\n    def __init__(self):\n        self.count = 0\n", False),
    ("question", "Please write a short answer. Here is the summary of", False),
    ("main", 'if __name__ == "__main__":\n    import sys\n', False),
    ("suffix", "Suffix trees index the text seen so far; the longest", False),
]


def _chat(tok, turns: list[tuple[str, str]]) -> list[int]:
    return tok.apply_chat_template(
        [{"role": r, "content": c} for r, c in turns],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tiny_baseline_server, start_module_server):
    base = tiny_baseline_server
    import os

    env = {"SGLANG_SPEC_EXT_BACKEND": os.environ.get("SPEC_EXT_TEST_BACKEND", "auto")}
    spec = start_module_server(tiny_model_dir, *SUFFIX_ARGS, env=env)
    return base, spec


def _greedy(server, ids, n=NEW_TOKENS, **kw):
    return server.generate(input_ids=ids, max_new_tokens=n, temperature=0, ignore_eos=True, **kw)


def test_greedy_parity_and_accept_length(servers, tok):
    base, spec = servers
    cases = [(label, tok(p)["input_ids"], rep) for label, p, rep in PROMPTS]
    # Multi-turn: a later conversation carries an earlier answer and asks again.
    first = _greedy(base, _chat(tok, [("user", CODE)]))["output_ids"]
    answer = tok.decode(first)
    cases.append(("turn 1", _chat(tok, [("user", CODE)]), False))
    cases.append(
        (
            "turn 2 (repeat)",
            _chat(tok, [("user", CODE), ("assistant", answer), ("user", CODE)]),
            False,
        )
    )
    # Earlier requests sent again: the global tree holds their answers.
    for label, p, _ in PROMPTS[:3]:
        cases.append((f"again: {label}", tok(p)["input_ids"], True))

    rows = []
    for label, ids, must_accept in cases:
        want = _greedy(base, ids)
        got = _greedy(spec, ids)
        assert got["output_ids"] == want["output_ids"], f"{label}: SUFFIX output differs"
        acc = accept_length(got["meta_info"])
        rows.append((label, acc, got["meta_info"].get("spec_verify_ct")))
        if must_accept:
            assert acc > 2.0, f"{label}: accept length {acc:.2f} <= 2"
    print(f"\nSUFFIX accept length per prompt (tiny model, width {WIDTH}):")
    for label, acc, verify in rows:
        print(f"  {label:<20} accept_len={acc:5.2f}  verify_steps={verify}")
    assert len(rows) >= 12


def test_sampling_requests_complete_with_valid_tokens(servers, tok):
    _, spec = servers
    vocab = len(tok)
    for seed in range(3):
        out = spec.generate(
            input_ids=tok(CODE * 2)["input_ids"],
            max_new_tokens=32,
            temperature=0.8,
            top_p=0.95,
            ignore_eos=True,
            sampling_seed=seed,
        )
        ids = out["output_ids"]
        assert len(ids) == 32 and all(0 <= t < vocab for t in ids), ids


def test_concurrent_requests_match_baseline(servers, tok):
    base, spec = servers
    prompts = [tok(p * 2)["input_ids"] for _, p, _ in PROMPTS] + [
        tok(f"item {i}: " + CODE)["input_ids"] for i in range(8)
    ]
    assert len(prompts) >= 16
    want = [_greedy(base, ids, 32)["output_ids"] for ids in prompts]
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda ids: _greedy(spec, ids, 32)["output_ids"], prompts))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"concurrent request {i} differs"


def test_random_token_prompts_run_as_plain_decode_steps(servers, tok):
    """Random-token prompts: the drafter finds nothing for any request of a batch, and
    those steps run as plain decode steps (sglang/workers/plain_step.py), with plain serving's
    greedy output and one token per step."""
    import random

    base, spec = servers
    rng = random.Random(7)
    prompts = [[rng.randrange(100, len(tok) - 1) for _ in range(48)] for _ in range(3)]
    want = [_greedy(base, ids, 24)["output_ids"] for ids in prompts]
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda ids: _greedy(spec, ids, 24), prompts))
    assert [g["output_ids"] for g in got] == want
    plain = plain_step_counts(spec.log_path.read_text())
    print(f"\nSUFFIX on random tokens, plain-step counters: {plain}")
    assert plain.get("plain", 0) >= 1, "no plain decode step ran"


def test_abort_mid_generation_leaves_server_healthy(servers, tok):
    base, spec = servers
    ids = tok(CODE * 2)["input_ids"]
    last = abort_mid_stream(spec, ids, 4000)
    assert last["finish_reason"]["type"] == "abort", last["finish_reason"]
    assert last["completion_tokens"] < 4000
    assert spec.healthy()
    # The server keeps serving correctly after the abort.
    want = _greedy(base, ids, 24)["output_ids"]
    assert _greedy(spec, ids, 24)["output_ids"] == want


def test_bad_config_value_stops_start_up(tiny_model_dir, start_server):
    from tests.harness.server import ServerStartError

    with pytest.raises(ServerStartError) as err:
        start_server(tiny_model_dir, *SUFFIX_ARGS, env={"SGLANG_SPEC_EXT_MIN_TOKEN_PROB": "2"})
    assert "SGLANG_SPEC_EXT_MIN_TOKEN_PROB='2' is invalid" in str(err.value)


def _spec_ext(cap: int) -> dict:
    return {"custom_params": {"spec_ext": {"max_draft_tokens": cap}}}


def test_a_request_can_switch_its_speculation_off_or_cap_it(servers, tok):
    """Per-request control (sampling_params.custom_params.spec_ext.max_draft_tokens): sent
    together with speculating neighbours on text this model repeats, the request with 0
    commits exactly one token per verify step (no draft accepted), a capped one at most
    cap + 1, and every output is plain serving's; a bad value is a 400 naming the field."""
    base, spec = servers
    ids = tok(", ".join(str(i) for i in range(40)))["input_ids"]  # "counting": repeats
    want = _greedy(base, ids)["output_ids"]
    caps = [None, 0, 2, None, 0]
    with cf.ThreadPoolExecutor(len(caps)) as pool:
        got = list(
            pool.map(lambda c: _greedy(spec, ids, **(_spec_ext(c) if c is not None else {})), caps)
        )
    lengths = []
    for cap, out in zip(caps, got, strict=True):
        assert out["output_ids"] == want, f"max_draft_tokens={cap} changed the output"
        meta = out["meta_info"]
        lengths.append(accept_length(meta))
        if cap == 0:
            assert meta["spec_num_correct_drafts"] == 0, meta
        elif cap is not None:
            assert meta["spec_num_correct_drafts"] <= cap * meta["spec_verify_ct"], meta
    print(f"\nper-request caps {caps}: accept lengths {[round(x, 2) for x in lengths]}")
    assert min(lengths[0], lengths[3]) > 2, "the uncapped neighbours did not speculate"
    capped = got[2]["meta_info"]  # the prefill's token is in completion_tokens, not a verify
    assert lengths[2] <= 3.0 + 1.0 / capped["spec_verify_ct"] + 1e-9, capped
    import requests

    with pytest.raises(requests.HTTPError) as err:
        _greedy(spec, ids, 4, **_spec_ext(-1))
    assert err.value.response.status_code == 400
    assert "custom_params.spec_ext.max_draft_tokens=-1" in err.value.response.text
    assert spec.healthy()
