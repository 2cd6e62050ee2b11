"""SuffixDrafter: the public front end over the native core or the Python reference."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from .config import SuffixConfig
from .draft import DraftTree
from .reference_engine import ReferenceCorpus, ReferenceEngine

try:  # built by setup.py when a C++ compiler is available
    from . import _native
except ImportError:  # pragma: no cover - depends on the install
    _native = None

BACKENDS = ("auto", "native", "python")
MAX_NODES = 1 << 20  # per draft; real verify widths are far smaller
#: Most corpora attached at once (each is walked for every draft).
MAX_CORPORA = 64


def native_available() -> bool:
    """Whether the compiled suffix core (sglang_spec_ext.suffix._native) is importable."""
    return _native is not None


def _as_tokens(tokens: Sequence[int]) -> Sequence[int]:
    # numpy arrays: one bulk conversion beats per-element access from C++.
    tolist = getattr(tokens, "tolist", None)
    return tolist() if tolist is not None else tokens


class SuffixDrafter:
    """Suffix-tree drafts for many concurrent requests.

    Per request: ``start_request`` with the prompt, then per decoding step
    ``speculate`` (draft below the last committed token) and ``extend_request``
    with the tokens the target committed; ``finish_request`` or
    ``abort_request`` at the end. A global tree over past and in-flight requests
    (bounded by the config, oldest evicted first) and a per-request tree over
    the request's own tokens both propose a draft; the higher score wins.
    """

    def __init__(self, config: SuffixConfig | None = None, backend: str = "auto") -> None:
        self.config = config if config is not None else SuffixConfig()
        if not isinstance(self.config, SuffixConfig):
            raise TypeError(f"config must be a SuffixConfig, got {type(self.config).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is invalid: expected one of {BACKENDS}")
        if backend == "native" and _native is None:
            raise RuntimeError(
                "backend='native' requested but sglang_spec_ext.suffix._native is not built; "
                "reinstall with a C++17 compiler and pybind11 available "
                "(pip install -e . --no-build-isolation), or use backend='python'"
            )
        self.backend: str = "native" if backend != "python" and _native is not None else "python"
        self._engine = self._make_engine()
        self._handles: dict[Hashable, int] = {}
        self._next_handle = 0

    def _make_engine(self):
        c = self.config
        if self.backend == "python":
            return ReferenceEngine(c, max_scope_tokens=c.scope_tokens)
        return _native.Engine(
            c.max_depth,
            c.max_spec_factor,
            c.max_spec_offset,
            c.min_token_prob,
            c.max_cached_requests,
            c.max_cached_tokens,
            c.cache_prompts,
            c.use_tree,
            c.max_request_tokens,
            c.global_prompt_cap,
            c.step_insert_tokens,
            c.merge_drafts,
            c.scope_tokens,
        )

    def _handle(self, req_id: Hashable) -> int:
        try:
            return self._handles[req_id]
        except KeyError:
            raise KeyError(
                f"unknown request id {req_id!r}: not started, or already finished/aborted"
            ) from None

    @staticmethod
    def _check_max_nodes(max_nodes: int) -> None:
        if (
            isinstance(max_nodes, bool)
            or not isinstance(max_nodes, int)
            or not 0 <= max_nodes <= MAX_NODES
        ):
            raise ValueError(
                f"max_nodes={max_nodes!r} is invalid: expected an int in [0, {MAX_NODES}]"
            )

    def start_request(self, req_id: str, prompt: Sequence[int], scope: str | None = "") -> None:
        """Register a request with its prompt tokens.

        ``scope`` names the global tree the request drafts from and feeds: the
        requests of one scope (a tenant, an adapter) share one, ``""`` is the
        shared default. ``None``: no global tree at all (its own tokens and the
        corpora attached to every scope only)."""
        if req_id in self._handles:
            raise ValueError(f"request id {req_id!r} is already active")
        if scope is not None and not isinstance(scope, str):
            raise TypeError(f"scope must be a str or None, got {type(scope).__name__}")
        handle = self._next_handle
        self._engine.start(handle, _as_tokens(prompt), scope or "", scope is not None)
        self._next_handle += 1
        self._handles[req_id] = handle

    def extend_request(self, req_id: str, tokens: Sequence[int]) -> None:
        """Append newly committed output tokens of a request."""
        self._engine.extend(self._handle(req_id), _as_tokens(tokens))

    def speculate(self, req_id: str, max_nodes: int) -> DraftTree:
        """Draft at most `max_nodes` tokens below the request's last committed token.

        Like ``speculate_batch``, first inserts queued prompt tokens (at most
        ``config.step_insert_tokens``; see SuffixConfig) and ends the step."""
        self._check_max_nodes(max_nodes)
        return DraftTree(*self._engine.speculate(self._handle(req_id), max_nodes))

    def speculate_batch(self, req_ids: Sequence[str], max_nodes: int) -> list[DraftTree]:
        """`speculate` for several requests in one call: one step.

        The step's bounded insertion work (queued prompt tokens, oldest request
        first, at most ``config.step_insert_tokens`` tokens) runs first, so a
        long prompt is spread over several steps instead of stalling one."""
        self._check_max_nodes(max_nodes)
        handles = [self._handle(r) for r in req_ids]
        return [DraftTree(*d) for d in self._engine.speculate_batch(handles, max_nodes)]

    def finish_request(self, req_id: str) -> None:
        """Drop the request's own state; its tokens stay in the global tree (bounded)."""
        self._engine.finish(self._handle(req_id))
        del self._handles[req_id]

    def abort_request(self, req_id: str) -> None:
        """Drop the request's own state and remove its tokens from the global tree."""
        self._engine.abort(self._handle(req_id))
        del self._handles[req_id]

    def flush(self) -> None:
        """Insert every queued prompt token now (unbounded work: tests and tools)."""
        self._engine.flush()

    # -- corpora ---------------------------------------------------------------
    def build_corpus(self, docs: Iterable[Sequence[int]]) -> Any:
        """A read-only tree over ``docs`` (token lists, one sequence each).

        Touches no drafter state: call it from any thread, then
        :meth:`attach_corpus` on the drafter's own. ``.tokens`` is its size."""
        docs = [_as_tokens(d) for d in docs]
        if self.backend == "python":
            return ReferenceCorpus(docs, self.config.max_depth)
        return _native.build_corpus(docs, self.config.max_depth)

    def attach_corpus(self, name: str, corpus: Any, scopes: Sequence[str] = ()) -> None:
        """Draft from ``corpus`` for requests of ``scopes`` (every scope when empty;
        requests without a global tree only from corpora of every scope). A
        corpus of the same name is replaced."""
        if not isinstance(name, str) or not name:
            raise ValueError("a corpus needs a non-empty name")
        attached = self.corpora()
        if name not in attached and len(attached) >= MAX_CORPORA:
            raise ValueError(
                f"{MAX_CORPORA} corpora are attached already: remove one before adding {name!r}"
            )
        self._engine.add_corpus(name, corpus, list(scopes))

    def remove_corpus(self, name: str) -> bool:
        """Detach a corpus; False if there was none of that name."""
        return bool(self._engine.remove_corpus(name))

    def corpora(self) -> dict[str, int]:
        """Attached corpus name -> tokens."""
        return dict(self._engine.corpora())

    # -- warm restarts ----------------------------------------------------------
    def export_cached(self) -> list[tuple[str, list[int]]]:
        """Every sequence the global trees hold, ``(scope, tokens)``, oldest first."""
        return [(scope, list(tokens)) for scope, tokens in self._engine.export_cached()]

    def import_cached(self, scope: str, tokens: Sequence[int]) -> None:
        """Add a finished sequence to ``scope``'s global tree as its newest
        (the bounds evict the oldest as they do for served requests)."""
        self._engine.import_cached(scope, _as_tokens(tokens))

    def stats(self) -> dict:
        """Sizes: active_requests, cached_requests, cached_tokens (global tree),
        global_nodes, local_nodes, local_tokens (per-request trees), pinned_tokens
        (removed tokens still referenced), pending_tokens (queued, not yet
        inserted), memory_bytes (bytes held by the native core: node and child
        arrays, hash index, token arrays and queues, corpora; 0 for the python
        backend), scopes (global trees), corpora, corpus_tokens, backend."""
        out = dict(self._engine.stats())
        out["backend"] = self.backend
        return out

    def reset(self) -> None:
        """Forget every request and empty the global trees (corpora stay)."""
        self._engine.reset()
        self._handles.clear()

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._handles

    def __repr__(self) -> str:
        return f"SuffixDrafter(backend={self.backend!r}, config={self.config!r})"
