"""Our algorithm names registered with the host's ``SpeculativeAlgorithm`` (``spec_info.py``,
``spec_registry.py``): each with its spec class, argument checks and worker factory."""

from __future__ import annotations

from collections.abc import Callable, Mapping

#: The worker factory the host calls with its server arguments: returns the worker class.
WorkerFactory = Callable[[object], type]


def register_algorithms(factories: Mapping[str, WorkerFactory]) -> None:
    """Register each ``name -> factory`` (``SUFFIX``, ``HYBRID``) unless the host already
    knows the name (registering a name twice raises in the host, and ``load_plugins()``
    runs us in every process)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from sglang_spec_ext.sglang.serving.server_args import validate_server_args
    from sglang_spec_ext.sglang.serving.spec_class import HybridSpecAlgo, ModelFreeSpecAlgo

    spec_classes = {"SUFFIX": ModelFreeSpecAlgo, "HYBRID": HybridSpecAlgo}
    for name, factory in factories.items():
        if get_spec(name) is not None:
            continue
        SpeculativeAlgorithm.register(
            name,
            supports_overlap=True,
            validate_server_args=validate_server_args,
            spec_class=spec_classes[name],
        )(factory)
