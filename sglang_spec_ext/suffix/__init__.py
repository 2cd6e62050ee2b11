"""Suffix-tree drafting (suffix decoding), engine-agnostic.

A global suffix tree over past and in-flight requests plus one per request;
each step matches the request's recent tokens and grows a draft tree by observed
continuation frequency. The hot path is compiled (csrc/suffix, optional); the
pure-Python reference (reference.py) defines the results and is the fallback.

The compiled core is built by ``pip install -e . --no-build-isolation`` when a
C++17 compiler and pybind11 are present; ``native_available()`` says whether it
was, and ``SuffixDrafter(backend=...)`` picks "native", "python" or "auto".
"""

from .config import SuffixConfig
from .draft import DraftTree
from .drafter import SuffixDrafter, native_available

__all__ = ["DraftTree", "SuffixConfig", "SuffixDrafter", "native_available"]
