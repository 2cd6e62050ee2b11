"""With sampling, the host's STANDALONE (draft-model) speculation on the CPU engine keeps
the target's distribution (the chi-square check of test_sampling_distribution.py,
applied to a model draft).

A plain server and a STANDALONE server (the peaked tiny model as its own draft, so drafts
are often accepted at temperature 1) answer the same sampled requests; tokens 2 and 3
come from verify steps on the speculative server, through the plugin's CPU sampling
verify. Their joint distribution must match the plain server's, and drafts must really
have been accepted."""

from __future__ import annotations

import collections
import concurrent.futures as cf
import time

import pytest

from tests.e2e.test_sampling_distribution import (
    PASS_P,
    PROMPT,
    peaked_model,  # noqa: F401 - module fixture reused
    two_sample_p,
    verified_tokens,
)
from tests.harness.server import CPUServer

REQUESTS = 160
BATCH = 32


@pytest.fixture(scope="module")
def servers(peaked_model, tmp_path_factory):  # noqa: F811
    logs = tmp_path_factory.mktemp("standalone-sampling")
    spec_args = ("--random-seed", "5", "--speculative-algorithm", "STANDALONE",
                 "--speculative-draft-model-path", str(peaked_model),
                 "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", "3")  # fmt: skip
    made = {
        "base": CPUServer(peaked_model, ("--random-seed", "4"), log_path=logs / "base.log"),
        "STANDALONE": CPUServer(peaked_model, spec_args, log_path=logs / "spec.log"),
    }
    pool = cf.ThreadPoolExecutor(len(made))  # outlives the servers (PR_SET_PDEATHSIG)
    try:
        for future in [pool.submit(s.start) for s in made.values()]:
            future.result()
        yield made
    finally:
        list(pool.map(CPUServer.stop, made.values()))
        pool.shutdown()


def test_standalone_sampled_tokens_follow_the_plain_server(servers, peaked_model):  # noqa: F811
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(peaked_model)(PROMPT)["input_ids"]

    def batch(name: str) -> list[dict]:
        return servers[name].generate(
            input_ids=[ids] * BATCH, max_new_tokens=3, temperature=1.0, ignore_eos=True
        )

    start = time.monotonic()
    jobs = [name for name in servers for _ in range(REQUESTS // BATCH)]
    with cf.ThreadPoolExecutor(len(jobs)) as pool:
        out = list(pool.map(batch, jobs))
    got = {n: sum((o for j, o in zip(jobs, out, strict=True) if j == n), []) for n in servers}
    spec = got["STANDALONE"]
    drafts = sum(r["meta_info"].get("spec_num_correct_drafts", 0) for r in spec)
    verifies = sum(r["meta_info"].get("spec_verify_ct", 0) for r in spec)
    p, categories = two_sample_p(verified_tokens(got["base"]), verified_tokens(spec))
    top = collections.Counter(verified_tokens(spec)).most_common(4)
    print(
        f"\nSTANDALONE T=1 ({time.monotonic() - start:.1f} s): chi-square p = {p:.3g} over "
        f"{categories} categories; {drafts} drafts accepted in {verifies} verify steps; "
        f"most common {top}"
    )
    assert verifies >= REQUESTS and drafts >= REQUESTS // 4, (drafts, verifies)
    assert p > PASS_P, "STANDALONE sampled tokens differ from plain decoding"
