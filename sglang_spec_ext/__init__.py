"""sglang-spec-ext: suffix-tree speculative decoding and adaptive draft widths for SGLang.

Core modules (everything outside ``sglang_spec_ext.sglang``) never import SGLang.
"""

__version__ = "0.1.0"

SUPPORTED_HOST = ">=0.5.23,<0.5.24"

#: Algorithm names this package registers with the host.
ALGORITHMS: tuple[str, ...] = ("SUFFIX", "HYBRID")
