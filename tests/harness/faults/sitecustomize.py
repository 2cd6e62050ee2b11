"""TEST ONLY: inject drafter faults into a server (tests/e2e/test_drafter_faults_serving.py).

Put this directory on a server's PYTHONPATH after the CPU-serving site directory
(whose ``sitecustomize`` runs the next one on the path, this one). With
``SPEC_EXT_TEST_FAULT_EVERY=N`` set, every N-th call of the suffix drafter's
methods in each process raises, before or after the call did its work, cycling
through RuntimeError, MemoryError and IndexError (what C++ ``std::out_of_range`` /
``std::bad_alloc`` and friends become through pybind11). The product has no fault
hook: the patch is applied to ``SuffixDrafter`` here, in the test server only.
"""

import os

_EVERY = int(os.environ.get("SPEC_EXT_TEST_FAULT_EVERY", "0") or 0)
_METHODS = (
    "start_request",
    "extend_request",
    "speculate",
    "speculate_batch",
    "finish_request",
    "abort_request",
)
_ERRORS = (RuntimeError, MemoryError, IndexError)


def _install(every: int) -> None:
    from sglang_spec_ext.suffix.drafter import SuffixDrafter

    state = {"calls": 0, "raised": 0}

    def fault() -> None:
        state["raised"] += 1
        n = state["raised"]
        raise _ERRORS[n % len(_ERRORS)](f"injected drafter fault #{n} (test)")

    def wrap(fn):
        def call(*args, **kwargs):
            state["calls"] += 1
            hit = state["calls"] % every == 0
            after = (state["calls"] // every) % 2 == 1
            if hit and not after:
                fault()
            out = fn(*args, **kwargs)
            if hit:
                fault()
            return out

        call.__wrapped__ = fn
        return call

    for name in _METHODS:
        setattr(SuffixDrafter, name, wrap(getattr(SuffixDrafter, name)))


if _EVERY > 0:
    _install(_EVERY)
