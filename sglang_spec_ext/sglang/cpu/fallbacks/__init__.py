"""Pure-torch stand-ins for the speculative-decoding kernels of sgl-kernel's CPU build.

:mod:`.ops` holds the implementations (torch only), :mod:`.sampling` the sampling
verify the host only has on GPUs (torch only), :mod:`.verify_attention` target-verify
attention for the ``torch_native`` backend; :mod:`.install` patches them into the
host, only on the CPU engine and only for ops the host lacks.
"""
