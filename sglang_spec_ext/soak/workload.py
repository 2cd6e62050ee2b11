"""The soak workload: a seeded mix of request kinds for SGLang's native ``/generate``.

Engine-agnostic (no SGLang import): each :class:`SoakRequest` is a JSON body plus
what the harness expects of the answer. Prompts are token ids drawn from a pool the
caller supplies (tokenised real text, so ids are in the vocabulary), with repeated
prompts and repeated chunks so a suffix drafter has something to match, and with
exact lengths where a kind needs them (prompts right at the context limit).

Inputs on which the host itself fails without any speculation (out-of-vocabulary
``input_ids``, an empty prompt with a tokenizer that adds no BOS token) are never
generated: docs/operations.md lists them under known host issues.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: Kind -> weight in the default mix. Every kind is described in :func:`build_workload`.
DEFAULT_MIX: dict[str, float] = {
    "greedy": 24,
    "repeat": 8,
    "capped": 6,
    "near_limit": 14,
    "one_token": 5,
    "stop": 5,
    "logprobs": 5,
    "sampled": 10,
    "n2": 4,
    "json": 3,
    "regex": 2,
    "structured": 6,
    "disconnect": 10,
    "invalid": 10,
    "penalty": 3,
    "tenant": 10,
    "corpus": 6,
    "adapter": 0,  # only where both servers load the soak's LoRA adapters (--lora)
}

#: Kinds whose greedy output must equal the plain server's.
PARITY_KINDS = frozenset(
    {
        "greedy",
        "repeat",
        "capped",
        "structured",
        "near_limit",
        "one_token",
        "stop",
        "logprobs",
        "tenant",
        "adapter",
    }  # fmt: skip
)
#: Tenants of "tenant" requests (None: unsalted), and the soak's LoRA adapter names
#: (None: the base model).
TENANTS = ("tenant-a", "tenant-b", "tenant-c", None)
ADAPTERS = ("soak-a", "soak-b", None)
#: Kind -> (the request field naming its owner, the owners).
SCOPED_FIELDS = {"tenant": ("cache_salt", TENANTS), "adapter": ("lora_path", ADAPTERS)}
#: The corpus bound the soak's servers run with (SGLANG_SPEC_EXT_MAX_CORPUS_TOKENS):
#: its "too big" corpus operations exceed it.
SOAK_CORPUS_TOKENS = 20_000
#: The host's document separator in corpus token streams.
CORPUS_SEPARATOR = -(2**31)

JSON_SCHEMA = (
    '{"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, '
    '"count": {"type": "integer"}}, "required": ["name", "count"]}'
)
REGEX = r"(yes|no|maybe)(, (yes|no|maybe)){0,6}\."


@dataclass
class SoakRequest:
    """One request: its ``/generate`` body and what a correct server does with it."""

    index: int
    kind: str
    payload: dict[str, Any]
    # "ok" | "refused" (a 4xx answer) | "disconnect" | "guarded" (refused by a server
    # running one of this package's algorithms, answered by any other) | "admin" (an
    # operator request: answered or refused with a 4xx, never an error)
    expect: str = "ok"
    parity: bool = False  # greedy output compared with the plain server's
    read_chunks: int = 0  # "disconnect": stream chunks read before closing
    note: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    endpoint: str = "/generate"  # "GET /path" for a GET


def _take(pool: Sequence[int], rng: random.Random, n: int) -> list[int]:
    """``n`` ids: a random window of the pool, wrapped around if needed."""
    if n <= 0:
        return []
    start = rng.randrange(len(pool))
    out = list(pool[start : start + n])
    while len(out) < n:
        out += list(pool[: n - len(out)])
    return out


def _greedy(max_new: int, **extra: Any) -> dict[str, Any]:
    return {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True, **extra}


def build_workload(
    n: int,
    *,
    token_pool: Sequence[int],
    context_len: int,
    seed: int = 0,
    mix: dict[str, float] | None = None,
    max_new: int = 48,
    prompt_len: tuple[int, int] = (8, 160),
) -> list[SoakRequest]:
    """``n`` requests of the kinds in ``mix`` (default :data:`DEFAULT_MIX`).

    ``token_pool``: in-vocabulary ids prompts are cut from (at least 64 of them).
    ``context_len``: the server's ``--context-length``; ``near_limit`` prompts end
    0-3 tokens short of it once their ``max_new_tokens`` are generated, and
    ``invalid`` requests include prompts over it.
    """
    if len(token_pool) < 64:
        raise ValueError(f"token_pool needs at least 64 ids, got {len(token_pool)}")
    if context_len < 64:
        raise ValueError(f"context_len must be at least 64, got {context_len}")
    mix = dict(DEFAULT_MIX if mix is None else mix)
    unknown = set(mix) - set(DEFAULT_MIX)
    if unknown:
        raise ValueError(f"unknown request kinds {sorted(unknown)}; known: {sorted(DEFAULT_MIX)}")
    rng = random.Random(seed)
    kinds, weights = zip(*((k, w) for k, w in mix.items() if w > 0), strict=True)
    lo, hi = prompt_len
    hi = min(hi, context_len - max_new - 4)
    # A few base prompts reused by "repeat" requests (the global tree sees them again),
    # and per tenant and adapter (its own scope sees them again).
    bases = [_take(token_pool, rng, rng.randint(lo, hi)) for _ in range(8)]
    scoped = {
        k: [_take(token_pool, rng, rng.randint(lo, hi)) for _ in range(3)]
        for k in (*TENANTS, *ADAPTERS)
    }
    out: list[SoakRequest] = []
    for i in range(n):
        kind = rng.choices(kinds, weights)[0]
        new = rng.randint(8, max_new)
        ids = _take(token_pool, rng, rng.randint(lo, hi))
        req = SoakRequest(i, kind, {}, parity=kind in PARITY_KINDS)
        if kind == "greedy":
            if rng.random() < 0.5:  # a chunk repeated: the request's own tree can match it
                chunk = ids[: max(4, len(ids) // 3)]
                ids = (chunk * 3)[:hi]
            req.payload = {"input_ids": ids, "sampling_params": _greedy(new)}
        elif kind == "repeat":
            req.payload = {"input_ids": rng.choice(bases), "sampling_params": _greedy(new)}
        elif kind == "capped":
            # Per-request speculation control (docs/suffix.md): off or capped, often on
            # a text the trees know, beside uncapped neighbours; ragged verify gives it
            # its own verify length. Plain serving and the host's algorithms ignore it.
            cap = rng.choice([0, 1, 4])
            req.payload = {
                "input_ids": rng.choice(bases) if rng.random() < 0.5 else ids,
                "sampling_params": _greedy(
                    new, custom_params={"spec_ext": {"max_draft_tokens": cap}}
                ),
            }
        elif kind == "near_limit":
            new = rng.randint(8, max_new)
            length = context_len - new - rng.randint(0, 3)
            req.payload = {
                "input_ids": _take(token_pool, rng, length),
                "sampling_params": _greedy(new),
            }
        elif kind == "one_token":
            req.payload = {"input_ids": ids, "sampling_params": _greedy(1)}
        elif kind == "stop":
            # Stop ids taken from the prompt: a greedy model often emits them.
            stops = sorted(set(rng.sample(ids, min(3, len(ids)))))
            req.payload = {
                "input_ids": ids,
                "sampling_params": {**_greedy(new, ignore_eos=False), "stop_token_ids": stops},
            }
        elif kind == "logprobs":
            req.payload = {
                "input_ids": ids,
                "sampling_params": _greedy(new),
                "return_logprob": True,
                "top_logprobs_num": 2,
            }
        elif kind == "sampled":
            req.payload = {
                "input_ids": ids,
                "sampling_params": {
                    "max_new_tokens": new,
                    "temperature": rng.choice([0.6, 1.0]),
                    "top_p": rng.choice([0.9, 1.0]),
                    "top_k": rng.choice([-1, 20]),
                    "ignore_eos": True,
                },
            }
        elif kind == "n2":
            req.payload = {
                "input_ids": ids,
                "sampling_params": {
                    "max_new_tokens": new,
                    "temperature": 0.8,
                    "n": 2,
                    "ignore_eos": True,
                },
            }
            req.meta["n"] = 2
        elif kind == "json":
            req.payload = {
                "input_ids": ids,
                "sampling_params": {
                    "max_new_tokens": 40,
                    "temperature": 0,
                    "json_schema": JSON_SCHEMA,
                },
            }
        elif kind == "regex":
            req.payload = {
                "input_ids": ids,
                "sampling_params": {"max_new_tokens": 24, "temperature": 0, "regex": REGEX},
            }
        elif kind == "structured":
            # A tool call under the structured workload's JSON schema (three tools, nested
            # objects, enums, arrays; bench/structured_workloads.py), often on a prompt the
            # trees know: grammar-aware drafts cut and force. Greedy ones are compared with
            # the plain server; a sampled one must only be answered.
            from sglang_spec_ext.bench.structured_workloads import tool_call_schema

            sampled = rng.random() < 0.25
            req.payload = {
                "input_ids": rng.choice(bases) if rng.random() < 0.5 else ids,
                "sampling_params": {
                    "max_new_tokens": rng.randint(24, 64),
                    "temperature": 0.8 if sampled else 0,
                    "json_schema": json.dumps(tool_call_schema()),
                },
            }
            req.parity = not sampled
        elif kind == "disconnect":
            req.payload = {"input_ids": ids, "sampling_params": _greedy(max_new), "stream": True}
            req.expect = "disconnect"
            req.read_chunks = rng.randint(1, 4)
        elif kind == "penalty":
            # Served wrong under speculation by the host's penalizers: our algorithms
            # refuse it (sglang/serving/request_guard.py), other servers answer it.
            option = rng.choice(
                [{"repetition_penalty": 1.2}, {"frequency_penalty": 0.5}, {"min_new_tokens": 4}]
            )
            req.payload = {"input_ids": ids, "sampling_params": {**_greedy(new), **option}}
            req.expect = "guarded"
        elif kind in ("tenant", "adapter"):
            # A tenant's (cache_salt) or an adapter's (lora_path) request; None: neither.
            field, owner = SCOPED_FIELDS[kind]
            who = rng.choice(owner)
            prompt = rng.choice(scoped[who]) if rng.random() < 0.6 else ids
            req.payload = {"input_ids": prompt, "sampling_params": _greedy(new)}
            if who is not None:
                req.payload[field] = who
        elif kind == "corpus":
            req.expect = "admin"
            req.endpoint, req.payload, req.note = _corpus_op(rng, token_pool, bases)
        elif kind == "invalid":
            req.expect = "refused"
            req.payload, req.note = _invalid(rng, ids, token_pool, context_len, new)
        out.append(req)
    return out


def _corpus_op(
    rng: random.Random, pool: Sequence[int], bases: list[list[int]]
) -> tuple[str, dict[str, Any], str]:
    """An external-corpus operation (the host's endpoints): add (a few documents, some
    the base prompts' text, under one of four ids, for every tenant or one), list,
    remove, or an add too large or malformed. Under concurrent loads the host answers
    a second add with "already in progress" (a 400): either answer is correct."""
    choice = rng.randrange(6)
    corpus_id = f"soak-{rng.randrange(4)}" + rng.choice(["", "@tenant-a"])
    if choice <= 1:
        docs = [rng.choice(bases)] + [_take(pool, rng, rng.randint(16, 96)) for _ in range(2)]
        chunks = [docs[0]] + [[CORPUS_SEPARATOR, *d] for d in docs[1:]]
        return "/add_external_corpus", {"corpus_id": corpus_id, "token_chunks": chunks}, "add"
    if choice == 2:
        return "GET /list_external_corpora", {}, "list"
    if choice == 3:
        return "/remove_external_corpus", {"corpus_id": corpus_id}, "remove"
    if choice == 4:
        big = [_take(pool, rng, 2048) for _ in range(SOAK_CORPUS_TOKENS // 2048 + 2)]
        return "/add_external_corpus", {"corpus_id": "soak-big", "token_chunks": big}, "too big"
    return "/add_external_corpus", {"corpus_id": "soak-bad", "token_chunks": [[1, -7]]}, "bad ids"


def _invalid(
    rng: random.Random, ids: list[int], pool: Sequence[int], context_len: int, new: int
) -> tuple[dict[str, Any], str]:
    """A request the server must refuse with a 4xx answer (never crash on)."""
    choice = rng.randrange(6)
    if choice == 0:
        long = _take(pool, rng, context_len + rng.randint(1, 40))
        return {"input_ids": long, "sampling_params": _greedy(8)}, "prompt over the context"
    if choice == 1:
        length = context_len - new + rng.randint(1, 8)
        return (
            {"input_ids": _take(pool, rng, length), "sampling_params": _greedy(new)},
            "prompt + max_new_tokens over the context",
        )
    if choice == 2:
        return {"input_ids": ids, "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens -1"
    if choice == 3:
        return {"input_ids": ids, "sampling_params": {"temperature": -1.0}}, "temperature < 0"
    if choice == 4:
        return {"input_ids": ids, "sampling_params": {"top_p": 2.0}}, "top_p > 1"
    return {"input_ids": ids, "sampling_params": {"top_k": -5}}, "top_k < -1"


def counts_by_kind(requests: Sequence[SoakRequest]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in requests:
        out[r.kind] = out.get(r.kind, 0) + 1
    return out
