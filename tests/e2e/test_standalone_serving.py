"""The host's own STANDALONE (draft-model) and EAGLE3 speculation on the CPU engine, made possible
by the plugin's torch_native draft attention (sglang_spec_ext/sglang/cpu/draft_attention.py)
and CPU kernel fallbacks: lossless greedy output for topk 1 and topk > 1, accept length,
concurrency, an abort, and a start-up error naming the flag.

Drafts: the tiny model as its own draft (topk 1: the mechanics; the host feeds the
draft its input shifted by one token, so even a self-draft of a random tiny model
accepts well below the maximum) and the tiny model's first layer (topk 2: a weak
same-vocabulary draft); for EAGLE3 a random-weight head with the host's draft
architecture (build_eagle3_head: parity needs no good head)."""

from __future__ import annotations

import concurrent.futures as cf

import pytest

from tests.e2e.spec_metrics import accept_length
from tests.e2e.test_suffix_serving import CODE, PROMPTS
from tests.harness.server import ServerConfig, abort_mid_stream

NEW_TOKENS = 20
TOPK1 = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4")  # fmt: skip
TOPK2 = ("--speculative-num-steps", "2", "--speculative-eagle-topk", "2",
         "--speculative-num-draft-tokens", "4")  # fmt: skip


def _standalone(draft_dir, shape):
    return ("--speculative-algorithm", "STANDALONE",
            "--speculative-draft-model-path", str(draft_dir), *shape)  # fmt: skip


@pytest.fixture(scope="module")
def servers(tiny_model_dir, weak_draft_dir, tmp_path_factory, start_module_server):
    """The module's three speculative servers, started side by side."""
    from sglang_spec_ext.models.testing.llama import build_eagle3_head

    head = build_eagle3_head(tiny_model_dir, tmp_path_factory.mktemp("eagle3") / "head")
    return start_module_server.start_all({
        "topk1": ServerConfig(tiny_model_dir, _standalone(tiny_model_dir, TOPK1)),
        "topk2": ServerConfig(tiny_model_dir, _standalone(weak_draft_dir, TOPK2)),
        "eagle3": ServerConfig(tiny_model_dir, ("--speculative-algorithm", "EAGLE3",
                                                "--speculative-draft-model-path", str(head), *TOPK1)),
    })  # fmt: skip


@pytest.fixture(scope="module")
def topk1_server(servers):
    return servers["topk1"]


@pytest.fixture(scope="module")
def topk2_server(servers):
    return servers["topk2"]


@pytest.fixture(scope="module")
def eagle3_server(servers):
    return servers["eagle3"]


def _greedy(server, ids, n=NEW_TOKENS):
    return server.generate(input_ids=ids, max_new_tokens=n, temperature=0, ignore_eos=True)


def _cases(tok):
    cases = [(label, tok(p)["input_ids"]) for label, p, _ in PROMPTS]
    cases += [
        ("code", tok(CODE)["input_ids"]),
        ("chat", tok("Please write a short answer.")["input_ids"]),
    ]
    cases += [("sentence x1", tok("The quick brown fox jumps over the lazy dog.")["input_ids"])]
    assert len(cases) >= 8
    return cases


def _parity(base, spec, tok, name, num_prompts=None):
    print(f"\n{name} accept length per prompt (tiny model, CPU engine):")
    accepted = []
    for label, ids in _cases(tok)[:num_prompts]:
        want = _greedy(base, ids)["output_ids"]
        got = _greedy(spec, ids)
        assert got["output_ids"] == want, f"{label}: {name} output differs from plain serving"
        acc = accept_length(got["meta_info"])
        accepted.append(acc)
        print(
            f"  {label:<14} accept_len={acc:5.2f}  verify_steps={got['meta_info']['spec_verify_ct']}"
        )
    print(f"  mean accept length {sum(accepted) / len(accepted):.2f}")
    return accepted


def test_standalone_topk1_self_draft_parity(tiny_baseline_server, topk1_server, tok):
    accepted = _parity(tiny_baseline_server, topk1_server, tok, "STANDALONE topk 1 (self-draft)")
    # a self-draft is right often enough that some drafts must be accepted
    assert sum(accepted) / len(accepted) > 1.2


def test_standalone_topk2_weak_draft_parity(tiny_baseline_server, topk2_server, tok):
    accepted = _parity(
        tiny_baseline_server, topk2_server, tok, "STANDALONE topk 2 (1-layer draft)", 8
    )
    assert all(1.0 <= a <= 3.0 for a in accepted)  # at most num_steps + 1 per verify


def test_eagle3_random_head_parity(tiny_baseline_server, eagle3_server, tok):
    accepted = _parity(tiny_baseline_server, eagle3_server, tok, "EAGLE3 topk 1 (random head)", 8)
    assert all(1.0 <= a <= 4.0 for a in accepted)


def test_standalone_16_concurrent_requests(tiny_baseline_server, topk1_server, tok):
    prompts = [ids for _, ids in _cases(tok)]
    prompts = [ids + ids[: i % 5] for i, ids in enumerate(prompts * 2)][:16]
    want = [_greedy(tiny_baseline_server, ids, 16)["output_ids"] for ids in prompts]
    with cf.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda ids: _greedy(topk1_server, ids, 16)["output_ids"], prompts))
    assert got == want


def test_standalone_sampling_stays_in_vocabulary(topk2_server, tok):
    out = topk2_server.generate(
        input_ids=tok(CODE)["input_ids"], max_new_tokens=16, temperature=0.8, top_p=0.95,
        ignore_eos=True,
    )  # fmt: skip
    assert len(out["output_ids"]) == 16 and all(0 <= t < len(tok) for t in out["output_ids"])


def test_standalone_abort_mid_generation(tiny_baseline_server, topk2_server, tok):
    ids = tok(CODE)["input_ids"]
    last = abort_mid_stream(topk2_server, ids, 3000)
    assert last["finish_reason"]["type"] == "abort", last["finish_reason"]
    assert topk2_server.healthy()
    assert (
        _greedy(topk2_server, ids, 16)["output_ids"]
        == _greedy(tiny_baseline_server, ids, 16)["output_ids"]
    )


def test_gpu_draft_attention_backend_is_refused_at_start_up(tiny_model_dir, start_server):
    from tests.harness.server import ServerStartError

    with pytest.raises(ServerStartError) as err:
        start_server(
            tiny_model_dir,
            *_standalone(tiny_model_dir, TOPK1),
            "--speculative-draft-attention-backend",
            "triton",
        )
    assert "--speculative-draft-attention-backend triton" in str(err.value)
    assert "torch_native" in str(err.value)
