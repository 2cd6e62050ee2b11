"""Our spec class covers the whole duck-typed interface of the host's enum."""

from __future__ import annotations

import inspect

import pytest
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import _assert_custom_spec_algo_conforms

from sglang_spec_ext.sglang.serving.spec_class import HybridSpecAlgo, ModelFreeSpecAlgo

OUR_CLASSES = (ModelFreeSpecAlgo, HybridSpecAlgo)

# Class-level constructors of the enum, not per-algorithm behaviour.
ENUM_CLASS_API = {"from_string", "register"}


def _enum_public_methods() -> set[str]:
    names = set()
    for name, value in vars(SpeculativeAlgorithm).items():
        if name.startswith("_") or name in ENUM_CLASS_API:
            continue
        if inspect.isfunction(value):
            names.add(name)
    return names


def test_enum_interface_is_non_trivial():
    # Guards the guard: if the introspection broke, the next test would pass vacuously.
    methods = _enum_public_methods()
    assert {"is_ngram", "create_worker", "create_future_map", "need_topk"} <= methods
    assert len(methods) > 20


@pytest.mark.parametrize("cls", OUR_CLASSES)
def test_spec_class_covers_every_public_enum_method(cls):
    missing = sorted(_enum_public_methods() - set(dir(cls)))
    assert not missing, f"host SpeculativeAlgorithm gained methods {cls.__name__} lacks: {missing}"


@pytest.mark.parametrize("cls", OUR_CLASSES)
def test_spec_class_overrides_what_the_default_custom_algo_lacks(cls):
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    lacking_in_default = _enum_public_methods() - set(dir(CustomSpecAlgo))
    assert lacking_in_default, f"host default now complete: revisit {cls.__name__}"
    for name in lacking_in_default:
        assert callable(getattr(cls, name, None)), name


@pytest.mark.parametrize("cls", OUR_CLASSES)
def test_host_conformance_check_accepts_it(cls):
    _assert_custom_spec_algo_conforms(cls)


@pytest.mark.parametrize(
    ("kind", "standalone", "eagle", "eagle3"),
    [("standalone", True, False, False), ("eagle", False, True, False),
     ("eagle3", False, True, True), ("auto", True, False, False)],
)  # fmt: skip
def test_hybrid_answers_as_the_host_model_draft_route(monkeypatch, kind, standalone, eagle, eagle3):
    from sglang_spec_ext.sglang.serving.server_args import HYBRID_KIND_ENV

    monkeypatch.setenv(HYBRID_KIND_ENV, kind)
    algo = HybridSpecAlgo(name="HYBRID", factory=lambda sa: object, supports_overlap=True)
    assert algo.is_standalone() is standalone and algo.is_eagle() is eagle
    assert algo.is_eagle3() is eagle3 and algo.carries_draft_hidden_states() is eagle
    assert not algo.is_ngram() and algo.has_draft_kv() and algo.need_topk()
    assert not algo.supports_mixed_chunk() and algo.get_platform_worker_cls() is None


@pytest.fixture
def algo():
    return ModelFreeSpecAlgo(name="SUFFIX", factory=lambda sa: object, supports_overlap=True)


def test_ngram_shaped_predicates(algo):
    assert algo.is_ngram() and algo.is_speculative() and algo.is_some()
    assert not algo.is_none() and not algo.is_eagle() and not algo.is_standalone()
    assert not algo.has_draft_kv()
    assert not algo.need_topk()
    assert not algo.carries_draft_hidden_states()
    assert not algo.supports_mixed_chunk()
    assert algo.get_platform_worker_cls() is None


def test_create_future_map_builds_the_host_future_map(algo):
    import torch
    from sglang.srt.managers.overlap_utils import FutureMap

    class _ReqToTokenPool:  # stand-in: the real pool allocates device memory
        req_to_token = torch.zeros((4, 64), dtype=torch.int32)
        size = 4

    try:
        fm = algo.create_future_map(torch.device("cpu"), _ReqToTokenPool())
    except Exception as e:  # the host FutureMap may need runtime context
        pytest.skip(f"host FutureMap needs a running scheduler context here: {e}")
    assert isinstance(fm, FutureMap)
