"""Per-request speculation settings, sent in the host's own request field for custom values:
``sampling_params.custom_params = {"spec_ext": {"max_draft_tokens": N}}``.

``max_draft_tokens`` caps how many drafted tokens of this request are verified per step
(``0`` switches its speculation off: it decodes one token per step, the bonus token,
while its neighbours speculate). The cap never changes what the target commits, only
how much is proposed. Honoured by SUFFIX and adaptive SUFFIX (the request's suffix draft
is cut to its first N nodes, best first) and by HYBRID (the suffix draft is cut; a
request whose model draft is longer than its cap verifies its cut suffix draft instead;
``0`` verifies no draft). Bad values are refused at admission with a 400 naming the field
(:func:`request_option_problems`, called by the request guard).
"""

from __future__ import annotations

from typing import Any

from sglang_spec_ext.suffix.draft import DraftTree

#: The key of our settings inside ``custom_params``.
KEY = "spec_ext"
#: Accepted fields and what each takes.
FIELDS = {"max_draft_tokens": "an integer >= 0 (0 switches speculation off for the request)"}
#: The attribute a request's parsed cap is cached under (parsed once per request).
_CACHE_ATTR = "_spec_ext_max_draft_tokens"
_UNSET = object()


def request_option_problems(custom_params: Any) -> list[str]:
    """What is wrong with the ``spec_ext`` entry of a request's ``custom_params`` (each
    problem names the field and what to send instead); ``[]`` when it is absent or valid."""
    if not isinstance(custom_params, dict) or KEY not in custom_params:
        return []
    where = f"sampling_params.custom_params.{KEY}"
    options = custom_params[KEY]
    if not isinstance(options, dict):
        return [f'{where} must be an object such as {{"max_draft_tokens": 0}}, got {options!r}']
    problems = [
        f"{where}.{name} is not a setting (accepted: {', '.join(sorted(FIELDS))})"
        for name in sorted(options)
        if name not in FIELDS
    ]
    cap = options.get("max_draft_tokens")
    if "max_draft_tokens" in options and (
        isinstance(cap, bool) or not isinstance(cap, int) or cap < 0
    ):
        problems.append(f"{where}.max_draft_tokens={cap!r}: expected {FIELDS['max_draft_tokens']}")
    return problems


def max_draft_tokens(req: Any) -> int | None:
    """The request's cap on verified draft tokens per step, or None (no cap). Read from
    ``req.sampling_params.custom_params`` once and cached on the request; a value the
    guard would refuse (it cannot reach a worker through the HTTP API) counts as no cap."""
    cached = getattr(req, _CACHE_ATTR, _UNSET)
    if cached is not _UNSET:
        return cached
    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    cap = None
    if isinstance(params, dict) and not request_option_problems(params):
        value = params.get(KEY, {}).get("max_draft_tokens")
        cap = None if value is None else int(value)
    try:
        setattr(req, _CACHE_ATTR, cap)
    except AttributeError:  # a request object without a __dict__ (tests' stand-ins)
        pass
    return cap


def cap_tree(tree: DraftTree, cap: int | None) -> DraftTree:
    """``tree`` cut to its first ``cap`` nodes (:meth:`DraftTree.first`)."""
    return tree.first(cap)
