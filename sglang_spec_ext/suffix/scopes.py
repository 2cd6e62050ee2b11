"""Which global tree a request drafts from: its scope (engine-agnostic).

A request's scope is derived from what the serving engine uses to isolate cached
prefixes: its cache salt (a tenant's namespace), its extra key and its LoRA
adapter. Under ``scoped`` isolation requests with equal values share one global
tree and requests with none of them share the default tree (``""``), as a radix
cache shares unsalted prefixes; ``strict`` gives salted requests no global tree
at all (their own tokens only); ``shared`` puts every request in one tree (the
behaviour before scopes).

Scope keys are digests, so tenants' salts are neither kept in memory by the
drafter nor written to snapshot files.
"""

from __future__ import annotations

import hashlib

ISOLATION_POLICIES = ("scoped", "strict", "shared")
#: Separates a corpus name from the cache salts it is limited to: ``docs@a,b``.
CORPUS_SCOPE_MARK = "@"


def _digest(salt: str, key: str) -> str:
    h = hashlib.blake2b(digest_size=16, person=b"sse-scope")
    h.update(salt.encode("utf-8", "surrogatepass"))
    h.update(b"\x00")
    h.update(key.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def scope_key(
    cache_salt: str | None,
    extra_key: str | None = None,
    lora_id: str | None = None,
    isolation: str = "scoped",
) -> str | None:
    """The scope of a request (``""``: the shared default; ``None``: no global tree)."""
    if isolation not in ISOLATION_POLICIES:
        raise ValueError(
            f"isolation={isolation!r} is invalid: expected one of {ISOLATION_POLICIES}"
        )
    salt = cache_salt or ""
    key = extra_key or ""
    if lora_id and lora_id not in key:  # hosts that do not fold the adapter into the key
        key += lora_id
    if isolation == "shared" or (not salt and not key):
        return ""
    if isolation == "strict" and salt:
        return None
    return _digest(salt, key)


def parse_corpus_id(corpus_id: str) -> tuple[str, list[str]]:
    """``name`` or ``name@salt1,salt2`` -> (name, scope keys of those salts' requests).

    A corpus limited to salts feeds the requests with one of those cache salts and
    no extra key or adapter; without ``@`` it feeds every scope."""
    if not isinstance(corpus_id, str) or not corpus_id.strip():
        raise ValueError("corpus_id must be a non-empty string")
    name, mark, salts = corpus_id.partition(CORPUS_SCOPE_MARK)
    if not name:
        raise ValueError(f"corpus_id {corpus_id!r}: the name before '@' is empty")
    if not mark:
        return name, []
    listed = [s.strip() for s in salts.split(",") if s.strip()]
    if not listed:
        raise ValueError(f"corpus_id {corpus_id!r}: no cache salt after '@'")
    return name, [_digest(s, "") for s in listed]
