"""SuffixConfig validation, SuffixDrafter errors and backend selection."""

from __future__ import annotations

import pytest

from sglang_spec_ext.suffix import DraftTree, SuffixConfig, SuffixDrafter, native_available

BACKENDS = ["python"] + (["native"] if native_available() else [])


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_depth", 0),
        ("max_depth", 10**6),
        ("max_depth", 2.0),
        ("max_depth", True),
        ("max_spec_factor", -0.1),
        ("max_spec_factor", float("nan")),
        ("max_spec_offset", 1e9),
        ("min_token_prob", 1.5),
        ("min_token_prob", "0.1"),
        ("max_cached_requests", -1),
        ("max_cached_tokens", 1 << 40),
        ("cache_prompts", 1),
        ("use_tree", "yes"),
    ],
)
def test_config_rejects_bad_values_naming_field_value_and_range(field, value):
    with pytest.raises(ValueError) as err:
        SuffixConfig(**{field: value})
    msg = str(err.value)
    assert field in msg and repr(value) in msg and "expected" in msg


def test_config_defaults_and_normalisation():
    c = SuffixConfig(max_spec_factor=2, max_spec_offset=-1)
    assert c.max_spec_factor == 2.0 and isinstance(c.max_spec_factor, float)
    assert c.global_enabled
    assert not SuffixConfig(max_cached_tokens=0).global_enabled
    assert SuffixConfig().as_dict()["max_depth"] == 64
    with pytest.raises(AttributeError):
        c.max_depth = 3  # frozen


def test_backend_selection():
    assert SuffixDrafter(backend="python").backend == "python"
    auto = SuffixDrafter()
    assert auto.backend == ("native" if native_available() else "python")
    with pytest.raises(ValueError, match="backend"):
        SuffixDrafter(backend="gpu")
    with pytest.raises(TypeError):
        SuffixDrafter(config={"max_depth": 3})
    if not native_available():
        with pytest.raises(RuntimeError, match="not built"):
            SuffixDrafter(backend="native")


@pytest.mark.parametrize("backend", BACKENDS)
def test_request_id_errors(backend):
    d = SuffixDrafter(backend=backend)
    for call in (
        lambda: d.extend_request("nope", [1]),
        lambda: d.speculate("nope", 4),
        lambda: d.speculate_batch(["nope"], 4),
        lambda: d.finish_request("nope"),
        lambda: d.abort_request("nope"),
    ):
        with pytest.raises(KeyError, match="unknown request id 'nope'"):
            call()
    d.start_request("a", [1, 2])
    with pytest.raises(ValueError, match="already active"):
        d.start_request("a", [3])
    d.finish_request("a")
    with pytest.raises(KeyError):
        d.speculate("a", 4)
    d.start_request("a", [3])  # reusable once finished
    assert "a" in d


@pytest.mark.parametrize("backend", BACKENDS)
def test_argument_errors_leave_state_unchanged(backend):
    d = SuffixDrafter(SuffixConfig(cache_prompts=True), backend=backend)  # counts the prompt
    d.start_request("a", [1, 2, 3])
    for bad in (-1, 2**31, "x"):
        with pytest.raises((ValueError, TypeError)):
            d.extend_request("a", [4, bad])
    with pytest.raises((ValueError, TypeError)):
        d.start_request("b", [1, -5])
    assert "b" not in d
    assert d.stats()["cached_tokens"] == 3
    for bad in (-1, 2.5, True, 2**40):
        with pytest.raises(ValueError, match="max_nodes"):
            d.speculate("a", bad)
    assert isinstance(d.speculate("a", 0), DraftTree)


def test_draft_tree_defaults():
    t = DraftTree()
    assert (t.tokens, t.parents, t.probs, t.score, t.match_len) == ([], [], [], 0.0, 0)
    assert len(t) == 0
