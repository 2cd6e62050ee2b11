"""TEST HARNESS: imported once by the two-rank tests' forkserver (tests/harness/tp_ranks.py)
so that each rank forked from it starts with these modules loaded. Nothing here runs a
collective or starts a thread: a fork of a process with threads is unsafe."""

from sglang_spec_ext.sglang.cpu import placeholders as cpu_placeholders

cpu_placeholders.install()

import torch.distributed  # noqa: E402, F401
from sglang.srt.runtime_context import get_parallel  # noqa: E402, F401

from sglang_spec_ext.sglang.model_drafts import adaptive, kv_repair  # noqa: E402, F401
from sglang_spec_ext.sglang.workers.adaptive_worker import AdaptiveSuffixWorker  # noqa: E402, F401
from sglang_spec_ext.sglang.workers.hybrid_worker import HybridMixin  # noqa: E402, F401
from sglang_spec_ext.sglang.workers.suffix_worker import SuffixWorker  # noqa: E402, F401
from sglang_spec_ext.sglang.workers.tp_sync import TpSync  # noqa: E402, F401
from tests.host import test_model_draft_adaptive  # noqa: E402, F401
