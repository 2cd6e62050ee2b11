"""The host's LoRA serving with SUFFIX and HYBRID on the CPU engine (issue 28).

Three servers of the tiny model share two random adapters (``A``, ``B``; PEFT files
written by sglang_spec_ext/models/testing/lora.py, nonzero ``lora_B`` so each changes the greedy
output): plain LoRA serving (no speculation, the host's default ``--lora-backend``, which
the plugin resolves to ``torch_native`` on CPU), SUFFIX and HYBRID (the tiny model's first
layer as its unadapted draft). For adapter A, adapter B and the base model, greedy output
must be identical across the three servers; the adapters must change the output (or the
test could not fail); speculation must really happen (accept length above 1 from the
host's ``meta_info``). Also: requests for different adapters batched together, and a third
adapter loaded at run time through ``/load_lora_adapter``.
"""

from __future__ import annotations

import concurrent.futures as cf

import pytest
import requests

from tests.e2e.spec_metrics import accept_length
from tests.e2e.test_standalone_serving import TOPK1
from tests.e2e.test_suffix_serving import CODE
from tests.harness.server import ServerConfig

NEW_TOKENS = 32
WIDTH = 8
ADAPTERS = ("A", "B", None)  # None: the base model on the same server
PROMPTS = {
    "counting": ", ".join(str(i) for i in range(40)),
    "code x3": CODE * 3,
    "sentence x4": "The quick brown fox jumps over the lazy dog. " * 4,
}


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    from sglang_spec_ext.models.testing.lora import build_lora_adapter

    root = tmp_path_factory.mktemp("lora")
    return {
        name: build_lora_adapter(tiny_model_dir, root / name, seed=seed)
        for name, seed in (("A", 1), ("B", 2), ("C", 3))
    }


#: Graph batch sizes under ``pytest --gpu-path graphs|both`` (inert otherwise): with LoRA
#: each CPU graph capture takes seconds, the host's default list (24 sizes) minutes.
CAPTURE_BS = ("--cuda-graph-bs-decode", "1", "2", "4", "8")


def _lora_args(adapters, backend=True):
    args = ["--lora-paths", f"A={adapters['A']}", f"B={adapters['B']}"]
    return (*args, "--lora-backend", "torch_native", *CAPTURE_BS) if backend else tuple(args)


@pytest.fixture(scope="module")
def servers(tiny_model_dir, weak_draft_dir, adapters, start_module_server):
    """The three servers, started side by side. The plain one without --lora-backend: the
    host's default (csgmv, Triton) resolves to torch_native on CPU."""
    spec = (*_lora_args(adapters), "--speculative-algorithm")
    return start_module_server.start_all({
        "plain": ServerConfig(tiny_model_dir, _lora_args(adapters, backend=False)),
        "SUFFIX": ServerConfig(tiny_model_dir, (*spec, "SUFFIX",
                                                "--speculative-num-draft-tokens", str(WIDTH))),
        "HYBRID": ServerConfig(tiny_model_dir, (*spec, "HYBRID",
                                                "--speculative-draft-model-path",
                                                str(weak_draft_dir), *TOPK1)),
    })  # fmt: skip


@pytest.fixture(scope="module")
def plain(servers):
    return servers["plain"]


@pytest.fixture(scope="module")
def suffix(servers):
    return servers["SUFFIX"]


@pytest.fixture(scope="module")
def hybrid(servers):
    return servers["HYBRID"]


@pytest.fixture(scope="module")
def prompts(tok):
    return {label: tok(text)["input_ids"] for label, text in PROMPTS.items()}


def _generate(server, ids, lora, n=NEW_TOKENS) -> dict:
    payload = {"input_ids": list(ids), "lora_path": lora,
               "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    r = requests.post(server.base_url + "/generate", json=payload, timeout=300)
    assert r.status_code == 200, f"/generate ({lora=}) answered {r.status_code}: {r.text[:2000]}"
    return r.json()


@pytest.fixture(scope="module")
def want(plain, prompts):
    """Plain LoRA serving's greedy output per (prompt, adapter)."""
    return {
        (label, lora): _generate(plain, ids, lora)["output_ids"]
        for label, ids in prompts.items()
        for lora in ADAPTERS
    }


def test_adapters_change_the_greedy_output(want, prompts, tiny_model_dir, adapters):
    for label in prompts:
        a, b, base = (want[label, lora] for lora in ADAPTERS)
        assert len(a) == len(b) == len(base) == NEW_TOKENS
        assert a != b and a != base and b != base, f"{label}: an adapter changes nothing"
    # The host's LoRA on CPU is right, not just different: transformers with the
    # adapter merged into the weights gives the same tokens.
    from sglang_spec_ext.models.testing.lora import reference_lora_generate

    ids = prompts["counting"]
    assert (
        reference_lora_generate(tiny_model_dir, adapters["A"], ids, NEW_TOKENS)
        == want["counting", "A"]
    )


def _parity(server, name, prompts, want) -> dict:
    """Every (prompt, adapter) twice: identical to plain serving each time. Returns the
    accept lengths seen; the second round finds the first round's answers in the tree."""
    print(f"\n{name} with LoRA: accept length per request (tiny model, CPU engine)")
    seen: dict = {}
    for rnd in (1, 2):
        for label, ids in prompts.items():
            for lora in ADAPTERS:
                got = _generate(server, ids, lora)
                assert got["output_ids"] == want[label, lora], (
                    f"{name}, {label}, adapter {lora}, round {rnd}: output differs from plain "
                    "LoRA serving"
                )
                acc = accept_length(got["meta_info"])
                seen[rnd, label, lora] = got["meta_info"]
                print(f"  round {rnd} {label:<12} adapter={lora!s:<5} accept_len={acc:5.2f}")
    return seen


def test_suffix_lora_parity_and_speculation(suffix, prompts, want):
    seen = _parity(suffix, "SUFFIX", prompts, want)
    accepted = {key: accept_length(meta) for key, meta in seen.items()}
    assert all(a >= 1.0 for a in accepted.values())
    # A repeated answer is drafted from the tree for every adapter.
    for lora in ADAPTERS:
        best = max(accepted[2, label, lora] for label in prompts)
        assert best > 2.0, f"adapter {lora}: no real speculation in round 2 ({accepted})"


def test_hybrid_lora_parity_and_speculation(hybrid, prompts, want):
    seen = _parity(hybrid, "HYBRID", prompts, want)
    accepted = [accept_length(meta) for meta in seen.values()]
    # up to the suffix width: a winning suffix draft may verify whole (wide steps)
    assert all(1.0 <= a <= 16.0 for a in accepted)
    assert max(accepted) > 2.0
    steps = {"suffix": 0, "model": 0}
    for meta in seen.values():
        for source, row in meta.get("spec_ext", {}).get("drafted_by", {}).items():
            steps[source] = steps.get(source, 0) + row["steps"]
    print("HYBRID steps by draft source:", steps)
    assert steps["suffix"] > 0 and steps["model"] > 0, steps


def test_suffix_mixed_adapters_in_one_batch(suffix, prompts, want):
    jobs = [(label, lora) for label in prompts for lora in ADAPTERS] * 2
    with cf.ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: _generate(suffix, prompts[job[0]], job[1]), jobs))
    for (label, lora), out in zip(jobs, got, strict=True):
        assert out["output_ids"] == want[label, lora], f"{label}, adapter {lora} (batched)"


def _load(server, name, path) -> None:
    r = requests.post(server.base_url + "/load_lora_adapter",
                      json={"lora_name": name, "lora_path": str(path)}, timeout=120)  # fmt: skip
    assert r.status_code == 200 and r.json().get("success"), r.text[:2000]


def test_adapter_loaded_at_run_time_on_suffix(plain, suffix, prompts, want, adapters):
    for server in (plain, suffix):
        _load(server, "C", adapters["C"])
    for label, ids in prompts.items():
        ref = _generate(plain, ids, "C")["output_ids"]
        assert ref not in (want[label, "A"], want[label, "B"], want[label, None])
        for rnd in (1, 2):
            got = _generate(suffix, ids, "C")
            assert got["output_ids"] == ref, f"{label}, run-time adapter C, round {rnd}"
        print(f"  {label:<12} adapter=C     accept_len={accept_length(got['meta_info']):5.2f}")
    r = requests.post(suffix.base_url + "/unload_lora_adapter", json={"lora_name": "C"}, timeout=60)
    assert r.status_code == 200, r.text[:2000]
    assert _generate(suffix, prompts["counting"], "A")["output_ids"] == want["counting", "A"]
    assert suffix.healthy()
