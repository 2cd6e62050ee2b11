"""With sampling, speculative decoding on the real CPU server keeps the target's distribution.

Hundreds of identical sampled requests (temperature 1.0, and once with top_k) go to
a plain server, to NGRAM and SUFFIX servers (8 draft tokens) and to a STANDALONE
(draft-model) server. The first output
token comes from the ordinary sampler in every server; tokens 2 and 3 come from
verify steps on the speculative ones. Their joint distribution must match the
plain server's by a two-sample chi-square test, and drafts must really have been
accepted (the host's own ``spec_num_correct_drafts``), so the sampling verify path
is what produced them. Without the plugin's CPU sampling verify the host commits
argmax tokens for every verified position and this test fails.

The model is the tests' tiny random Llama built with larger weights: the default one
is almost uniform at temperature 1, where drafts are rarely accepted and a
few hundred samples cannot tell distributions apart. ``sampling_seed`` only acts
with deterministic inference, which the CPU engine lacks (its hash op is missing),
so the samples are not reproducible; the threshold allows for that.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import time
from pathlib import Path

import pytest
import torch

from tests.harness.server import CPUServer, ServerConfig

WIDTH = "8"
SERVERS = {  # distinct seeds: independent samples (the harness passes --random-seed 0)
    "base": (),
    "NGRAM": ("--random-seed", "1", "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", WIDTH),
    "SUFFIX": ("--random-seed", "2", "--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", WIDTH),
    # A model draft (the peaked model as its own draft, so drafts are often accepted at
    # T=1); the draft path is added by the fixture (the model is built there).
    "STANDALONE": ("--random-seed", "3", "--speculative-algorithm", "STANDALONE",
                   "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                   "--speculative-num-draft-tokens", "3"),
}  # fmt: skip
PROMPT = "hello world"  # its likely continuations have 1-4 strong candidates per position
REQUESTS = 160
BATCH = 32  # requests per /generate call; calls to every server are in flight together
PASS_P = 1e-3
RUNS = {  # (server, sampling options); top_k = 3 cuts the tail of every position
    ("base", "T=1"): {},
    ("NGRAM", "T=1"): {},
    ("SUFFIX", "T=1"): {},
    ("STANDALONE", "T=1"): {},
    ("base", "top_k=3"): {"top_k": 3},
    ("SUFFIX", "top_k=3"): {"top_k": 3},
}


@pytest.fixture(scope="module")
def peaked_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sglang_spec_ext.models.testing.llama import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-peaked"), seed=0, initializer_range=1.0)


@pytest.fixture(scope="module")
def prompt_ids(peaked_model: Path) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(peaked_model)(PROMPT)["input_ids"]


@pytest.fixture(scope="module")
def servers(peaked_model: Path, start_module_server) -> dict[str, CPUServer]:
    """The four servers, started side by side."""
    draft = ("--speculative-draft-model-path", str(peaked_model))
    start = time.monotonic()
    made = start_module_server.start_all({
        name: ServerConfig(peaked_model, (*args, *draft) if name == "STANDALONE" else args)
        for name, args in SERVERS.items()
    })  # fmt: skip
    print(f"\n{len(made)} servers ready in {time.monotonic() - start:.1f} s")
    return made


@pytest.fixture(scope="module")
def samples(servers: dict[str, CPUServer], prompt_ids: list[int]) -> dict[tuple, list[dict]]:
    """Every run's responses. The drafters first see the prompt's greedy continuation
    (the same request sent before), then all runs go out at once."""
    for server in servers.values():
        for _ in range(3):
            server.generate(input_ids=prompt_ids, max_new_tokens=16, temperature=0, ignore_eos=True)

    def batch(key: tuple) -> list[dict]:
        return servers[key[0]].generate(
            input_ids=[prompt_ids] * BATCH,
            max_new_tokens=3,
            temperature=1.0,
            ignore_eos=True,
            **RUNS[key],
        )

    start = time.monotonic()
    jobs = [key for key in RUNS for _ in range(REQUESTS // BATCH)]
    with cf.ThreadPoolExecutor(len(jobs)) as pool:
        out = list(pool.map(batch, jobs))
    print(f"\n{REQUESTS * len(RUNS)} sampled requests in {time.monotonic() - start:.1f} s")
    return {key: sum((o for k, o in zip(jobs, out, strict=True) if k == key), []) for key in RUNS}


def two_sample_p(a: list[tuple], b: list[tuple], min_count: int = 10) -> tuple[float, int]:
    """Chi-square test of homogeneity over the categories seen at least ``min_count``
    times in both samples together; the rest is pooled. Returns (p, categories)."""
    ca, cb = collections.Counter(a), collections.Counter(b)
    common = sorted(k for k in ca.keys() | cb.keys() if ca[k] + cb[k] >= min_count)
    rows = [[c[k] for k in common] + [len(s) - sum(c[k] for k in common)] for c, s in ((ca, a), (cb, b))]  # fmt: skip
    table = torch.tensor(rows, dtype=torch.float64)
    table = table[:, table.sum(0) > 0]
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    stat = ((table - expected) ** 2 / expected).sum()
    dof = table.shape[1] - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), stat / 2)), table.shape[1]


def verified_tokens(responses: list[dict]) -> list[tuple[int, int]]:
    assert all(len(r["output_ids"]) == 3 for r in responses)
    return [tuple(r["output_ids"][1:3]) for r in responses]


@pytest.mark.parametrize(
    "algorithm,run",
    [("NGRAM", "T=1"), ("SUFFIX", "T=1"), ("SUFFIX", "top_k=3"), ("STANDALONE", "T=1")],
)
def test_verified_tokens_follow_the_plain_server(samples, algorithm, run):
    base, spec = samples[("base", run)], samples[(algorithm, run)]
    drafts = sum(r["meta_info"].get("spec_num_correct_drafts", 0) for r in spec)
    verifies = sum(r["meta_info"].get("spec_verify_ct", 0) for r in spec)
    p, categories = two_sample_p(verified_tokens(base), verified_tokens(spec))
    top = collections.Counter(verified_tokens(spec)).most_common(4)
    print(
        f"\n{algorithm} {run}: chi-square p = {p:.3g} over {categories} categories; "
        f"{drafts} drafts accepted in {verifies} verify steps; most common {top}"
    )
    # Drafts were accepted, so tokens 2-3 went through the sampling verify ...
    assert verifies >= REQUESTS and drafts >= REQUESTS // 4, (drafts, verifies)
    # ... and are distributed like the plain server's.
    assert p > PASS_P, f"{algorithm} {run}: verified tokens differ from plain decoding"


def test_top_k_is_respected_at_verified_positions(samples):
    """Top-k filtering reaches the verify: with k = 3, tokens outside the plain
    server's top-3 at a position never appear there."""
    for run in (("base", "top_k=3"), ("SUFFIX", "top_k=3")):
        per_prefix = collections.defaultdict(set)
        for r in samples[run]:
            ids = r["output_ids"]
            for pos in (1, 2):
                per_prefix[tuple(ids[:pos])].add(ids[pos])
        assert max(len(v) for v in per_prefix.values()) <= 3, run
