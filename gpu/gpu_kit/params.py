"""What ``gpu/run`` runs and for how long: the sizes of a run (GPU and the CPU rehearsal)
and the two plans, each stage with the budget it needs to start and its cap.

The time-outs and caps are sized from the first runs on an H100 (2026-11-27, docs/gpu.md):
servers ready in 64-69 s with cold JIT caches (five at once; decode graphs 31.8 s, verify
graphs 31-37 s of it) and 29-41 s warm; the environment stage 40-47 s with the import
check (the first plan leaves that out). The first request of a server compiles what
capture does not (sglang's ``clamp_position`` and ``speculative_tree`` modules, about
10-15 s of nvcc each, and Triton's extend kernel), hence its own longer time-out."""

from __future__ import annotations

from typing import Any

#: Sizes of the lent-GPU run (each can be overridden: ``--set KEY=JSON``).
GPU_PARAMS: dict[str, Any] = {
    "parity_geometry": "llama3-1b", "parity_widths": [4, 8, 16], "parity_prompts": 8,
    "parity_prompt_len": 256, "parity_new_tokens": 128, "parity_deterministic": False,
    "timing_geometry": "llama3-1b", "timing_dtype": "bfloat16",
    "curve_widths": [2, 4, 8, 16], "curve_batches": [1, 4, 16, 64],
    "curve_prompt_len": 512, "curve_new_tokens": 64,
    "host_geometry": "llama3-1b", "host_width": 16, "host_batches": [1, 16],
    "host_new_tokens": 96, "draft_geometry": "draft-2l",
    "toks_accept_len": 3.0, "toks_batches": [1, 16, 64], "toks_new_tokens": 96,
    # time-outs (seconds): ready = /health answers (no generation); first request =
    # 16 prompt ids, 8 new tokens (prefill, decode/verify, first JIT compiles);
    # request = each later request's wait for the server's next bytes
    "ready_timeout_s": 120, "hybrid_ready_timeout_s": 150, "first_request_timeout_s": 90,
    "request_timeout_s": 60, "kernel_probe_timeout_s": 40,
    "cuda_graph_bs": [1, 2, 4, 8, 16, 32, 64],
    "context_length": 2048, "max_total_tokens": 65536, "max_running_requests": 64,
    "mem_fraction_static": 0.88, "max_concurrent_servers": 8,
    "parity_max_total_tokens": 16384, "parity_graph_bs": [1, 2, 4, 8, 16],
}  # fmt: skip
#: The CPU rehearsal: the same stages, tiny model, few tokens, two servers at a time.
DRY_PARAMS: dict[str, Any] = {
    **GPU_PARAMS,
    "parity_geometry": "tiny", "parity_widths": [4], "parity_prompts": 2,
    "parity_prompt_len": 48, "parity_new_tokens": 24,
    "timing_geometry": "tiny", "timing_dtype": "float32", "curve_widths": [4],
    "curve_batches": [1, 2], "curve_prompt_len": 32, "curve_new_tokens": 12,
    "host_geometry": "tiny", "host_batches": [1], "host_new_tokens": 16,
    "draft_geometry": "tiny-draft", "toks_batches": [1, 2], "toks_new_tokens": 48,
    # CPU start-ups take minutes on a shared 2-core machine (adaptive SUFFIX captures a
    # CPU graph per width): the rehearsal is about versions, not time
    "ready_timeout_s": 900, "hybrid_ready_timeout_s": 900, "first_request_timeout_s": 600,
    "request_timeout_s": 600, "cuda_graph_bs": [1, 2, 4], "context_length": 512,
    "max_total_tokens": 8192, "max_running_requests": 8, "parity_max_total_tokens": 8192,
    "parity_graph_bs": [1, 2, 4], "max_concurrent_servers": 3,
}  # fmt: skip

#: Stage -> (min seconds left to start it, cap in seconds). The caps add up to more than
#: a call's budget on purpose: a stage that ends early leaves its time to the next.
LIMITS: dict[str, tuple[float, float]] = {
    "env": (10, 45),  # machine facts + sgl_kernel's rmsnorm on the GPU (~15 s)
    "imports": (20, 60),  # the host's CUDA-path imports (~25 s); not in the GPU plans
    "curve": (90, 200),  # 5 servers cold (~70 s) + first requests + 20 cells
    "parity": (100, 170),  # 6 fp32 servers (their own JIT variants: cold) + 6 x 8 prompts
    "hosttime": (60, 120),  # 3 bf16 servers warm (~35 s) + probe rounds
    "hybrid": (70, 120),  # 1 server: draft model, draft + draft-extend graphs, probe
    "toks": (45, 100),  # 4 servers warm + 12 cells
    "adaptive": (60, 120),  # 2 servers one after the other, alone
}

#: The first call on a fresh machine: the likeliest first figure first (the curve needs
#: only the host: plain and NGRAM servers, bf16), then parity, host time, HYBRID last.
FIRST_PLAN = ["env", "curve", "parity", "hosttime", "hybrid"]
#: A second call on the machine still warm (``--warm``): what the first left, reusing
#: its install and JIT caches; stages that passed in an earlier call are left out.
WARM_PLAN = ["toks", "hosttime", "adaptive", "hybrid"]
#: The CPU rehearsal (``--dry``): every stage.
DRY_PLAN = ["env", "imports", "curve", "parity", "hosttime", "hybrid", "toks", "adaptive"]
ALL_STAGES = DRY_PLAN
