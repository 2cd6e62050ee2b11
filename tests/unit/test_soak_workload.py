"""The soak workload's tenant, adapter and corpus-operation kinds (engine-agnostic)."""

from __future__ import annotations

import json

from sglang_spec_ext.soak.workload import (
    ADAPTERS,
    CORPUS_SEPARATOR,
    DEFAULT_MIX,
    SOAK_CORPUS_TOKENS,
    TENANTS,
    build_workload,
)


def _build(mix, n=300):
    return build_workload(n, token_pool=list(range(100, 400)), context_len=512, mix=mix)


def test_tenant_requests_are_salted_or_not_and_compared():
    reqs = _build({"tenant": 1})
    salts = {r.payload.get("cache_salt") for r in reqs}
    assert salts == set(TENANTS)
    assert all(r.parity and r.expect == "ok" and r.endpoint == "/generate" for r in reqs)
    # Prompts repeat within a tenant, so a tenant's own scope has something to draft.
    prompts = [tuple(r.payload["input_ids"]) for r in reqs]
    assert len(set(prompts)) < len(prompts) * 0.7


def test_adapter_requests_name_the_soak_adapters():
    reqs = _build({"adapter": 1})
    assert {r.payload.get("lora_path") for r in reqs} == set(ADAPTERS)
    assert DEFAULT_MIX["adapter"] == 0  # only with servers that load the adapters


def test_corpus_operations():
    reqs = _build({"corpus": 1})
    notes = {r.note for r in reqs}
    assert notes == {"add", "list", "remove", "too big", "bad ids"}
    for r in reqs:
        assert r.expect == "admin" and not r.parity
        json.dumps(r.payload)  # a JSON body
        if r.note == "add":
            chunks = r.payload["token_chunks"]
            assert all(c[0] == CORPUS_SEPARATOR for c in chunks[1:])
            assert r.payload["corpus_id"].startswith("soak-")
        if r.note == "too big":
            assert sum(map(len, r.payload["token_chunks"])) > SOAK_CORPUS_TOKENS
    assert {r.endpoint for r in reqs} == {
        "/add_external_corpus",
        "/remove_external_corpus",
        "GET /list_external_corpora",
    }


def test_structured_requests_carry_the_tool_call_schema_greedy_ones_compared():
    reqs = _build({"structured": 1}, n=200)
    schemas = {r.payload["sampling_params"]["json_schema"] for r in reqs}
    assert len(schemas) == 1 and "anyOf" in json.loads(schemas.pop())
    greedy = [r for r in reqs if r.payload["sampling_params"]["temperature"] == 0]
    sampled = [r for r in reqs if r.payload["sampling_params"]["temperature"] > 0]
    assert greedy and sampled
    assert all(r.parity for r in greedy) and not any(r.parity for r in sampled)
    assert DEFAULT_MIX["structured"] > 0
