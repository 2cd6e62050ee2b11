"""Per-request speculation settings (sglang/serving/request_options.py): validation with
the field named, the cached cap read from a request, and trees cut to a cap."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_spec_ext.sglang.serving.request_options import (
    cap_tree,
    max_draft_tokens,
    request_option_problems,
)
from sglang_spec_ext.suffix.draft import DraftTree


@pytest.mark.parametrize("params", [None, {}, {"other": 1}, {"spec_ext": {}},
                                    {"spec_ext": {"max_draft_tokens": 0}},
                                    {"spec_ext": {"max_draft_tokens": 7}}])  # fmt: skip
def test_valid_settings_have_no_problems(params):
    assert request_option_problems(params) == []


@pytest.mark.parametrize(
    "options, words",
    [
        ({"max_draft_tokens": -1}, "spec_ext.max_draft_tokens=-1: expected an integer >= 0"),
        ({"max_draft_tokens": 2.5}, "max_draft_tokens=2.5"),
        ({"max_draft_tokens": True}, "max_draft_tokens=True"),
        ({"max_draft_tokens": "3"}, "max_draft_tokens='3'"),
        ({"max_draft": 3}, "spec_ext.max_draft is not a setting (accepted: max_draft_tokens)"),
        (5, "spec_ext must be an object"),
    ],
)
def test_bad_settings_name_the_field(options, words):
    problems = request_option_problems({"spec_ext": options})
    assert len(problems) == 1 and words in problems[0], problems
    assert problems[0].startswith("sampling_params.custom_params.spec_ext")


def test_the_cap_is_read_once_and_cached_on_the_request():
    req = SimpleNamespace(
        sampling_params=SimpleNamespace(custom_params={"spec_ext": {"max_draft_tokens": 2}})
    )
    assert max_draft_tokens(req) == 2
    req.sampling_params.custom_params = None  # cached: not parsed again
    assert max_draft_tokens(req) == 2
    assert (
        max_draft_tokens(SimpleNamespace(sampling_params=SimpleNamespace(custom_params=None)))
        is None
    )
    bad = SimpleNamespace(
        sampling_params=SimpleNamespace(custom_params={"spec_ext": {"max_draft_tokens": -3}})
    )
    assert max_draft_tokens(bad) is None


def test_a_capped_tree_is_its_best_prefix():
    tree = DraftTree(tokens=[5, 6, 7, 8], parents=[-1, 0, -1, 1], probs=[0.9, 0.5, 0.3, 0.2],
                     score=1.9, match_len=4)  # fmt: skip
    assert cap_tree(tree, None) is tree and cap_tree(tree, 4) is tree
    two = cap_tree(tree, 2)
    assert (two.tokens, two.parents, two.probs, two.match_len) == ([5, 6], [-1, 0], [0.9, 0.5], 4)
    assert two.score == pytest.approx(1.4)
    none = cap_tree(tree, 0)
    assert (none.tokens, none.parents, none.score, none.match_len) == ([], [], 0.0, 0)
    assert tree.tokens == [5, 6, 7, 8]  # the drafter's tree is not changed
