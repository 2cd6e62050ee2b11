"""Test-wide set-up.

``--gpu-path overlap|graphs|both`` runs every speculative server the end-to-end tests
start on the CPU emulation of the GPU default path (``cpu_serving.GPU_PATH_ENV``: overlap
scheduling, graph runners, or both); the summary prints how many e2e tests ran in that
mode. CI runs the suite with it off plus one parity test per algorithm and mode
(``tests/e2e/test_overlap_parity.py``, ``tests/e2e/test_cpu_graphs_serving.py``); the whole matrix is
``bash scripts/test.sh tests/e2e --gpu-path overlap`` (and ``graphs``, ``both``).

Installs the product's placeholder modules for the host's GPU-only imports
(``sgl_kernel``, ``torchvision``; :mod:`sglang_spec_ext.sglang.cpu.placeholders`,
the same ones ``sglang-spec-ext serve-cpu`` installs in CPU servers) so real SGLang
modules import in this process.
"""

from __future__ import annotations

import os

# One OpenMP thread per process, in this process and every server it starts (they inherit
# the environment): the suite runs two test processes on two cores, each with servers of
# up to three processes, and torch's default of one thread per core oversubscribed them;
# OpenMP's barrier spin-waits then made forwards several times slower (2-core CI before,
# a quiet 2-core machine after, with the forkserver and fork-start changes of
# tests/harness: the suite 45 -> 14 minutes, the soak test 263 -> 72 s). A caller's
# setting wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from sglang_spec_ext.sglang.cpu import placeholders as cpu_placeholders

cpu_placeholders.install()

# SUFFIX's draft gate is on by default and decides verify or plain from measured step
# times, so step counts vary from run to run. Tests count steps: it is off in this process
# (workers built in-process, servers the benchmark tools start) unless a test turns it on;
# tests/harness/server.py does the same for the e2e servers, and the soak test removes it.
os.environ.setdefault("SGLANG_SPEC_EXT_DRAFT_GATE", "0")

# A skip for a reason other than a documented optional peer fails the run.
from tests.harness.skip_policy import (  # noqa: E402, F401
    pytest_collectreport,
    pytest_runtest_logreport,
    pytest_sessionfinish,
)
from tests.harness.skip_policy import (  # noqa: E402
    pytest_terminal_summary as _skip_summary,
)

#: End-to-end modules by cost (servers started, long workloads), costliest first. The
#: suite runs its files in parallel processes (scripts/test.sh); starting these first keeps
#: the run from ending on one long module while the other processes sit idle. Modules not
#: listed keep their collection order after these (the other e2e modules, then host and
#: unit tests, which fill the gaps). xdist keeps this order only with
#: ``--no-loadscope-reorder`` (scripts/test.sh); by default it sorts files by test count.
COSTLIEST_FIRST = (
    "test_model_families", "test_family_mtp", "test_router_replicas", "test_pd_disaggregation",
    "test_dp_attention",
    "test_cpu_graphs_serving", "test_overlap_parity", "test_hybrid_overlap", "test_smollm2_serving",
    "test_lora_serving", "test_sampling_distribution", "test_context_limit",
    "test_model_draft_adaptive_serving", "test_snapshot_restart", "test_mtp_serving",
    "test_standalone_serving",
    "test_hybrid_serving", "test_soak", "test_metrics_serving", "test_bench_tools",
    "test_release_wheel",  # not e2e: builds the wheel and installs it, 0.5-1 minute
)  # fmt: skip


def pytest_collection_modifyitems(items) -> None:
    rank = {name: i for i, name in enumerate(COSTLIEST_FIRST)}

    def key(item) -> tuple[int, int]:
        module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
        return (rank.get(module, len(rank)), 0 if "/e2e/" in item.nodeid else 1)

    items.sort(key=key)  # stable: the order within a module is kept


def pytest_addoption(parser) -> None:
    from sglang_spec_ext.sglang.cpu.serving import GPU_PATH_ENV

    parser.addoption(
        "--gpu-path",
        choices=sorted(GPU_PATH_ENV),
        default="off",
        help="run every speculative e2e server on the CPU emulation of the GPU default "
        "path (overlap scheduling, graph runners, or both)",
    )


def pytest_configure(config) -> None:
    # read by tests/harness/server.py in this process (servers are started from here)
    os.environ["SPEC_EXT_TEST_GPU_PATH"] = config.getoption("--gpu-path")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    _skip_summary(terminalreporter)
    mode = config.getoption("--gpu-path")
    if mode == "off":
        return

    def e2e(outcome: str) -> int:
        return sum(
            1
            for rep in terminalreporter.stats.get(outcome, [])
            if "e2e" in getattr(rep, "keywords", {})
            and (outcome == "skipped" or getattr(rep, "when", "call") == "call")
        )

    counts = {k: e2e(k) for k in ("passed", "failed", "skipped")}
    terminalreporter.write_line(
        f"e2e tests with --gpu-path {mode}: " + ", ".join(f"{n} {k}" for k, n in counts.items())
    )
