#!/usr/bin/env python
"""Soak and fault harness (benchmarks/results/soak_<mode>.json).

A speculative server under mixed load, against a plain one. Launches the real SGLang server
on the CPU engine (``sglang-spec-ext serve-cpu`` set-up) once without speculation and once
per algorithm, all with the same model, context length and ``--max-running-requests``, and
sends each the same seeded mix of requests at concurrency up to ``--max-running-requests``:
greedy and sampled, prompts right at the context limit, ``max_new_tokens`` 1, stop tokens,
``n`` = 2, logprobs, JSON-schema and regex output, streamed clients that disconnect mid-way,
invalid requests, and penalty options (which SUFFIX must refuse: the host's penalizers are
not exact under speculation; other algorithms answer them, unchecked). It checks that the
server stays up (the host's idle KV-pool check, on by default, ends the server on a leak),
that every valid request is answered and every invalid one refused, that greedy outputs
equal the plain server's (also when re-sent after the aborts), and that the drafter stays
within its token bound. Loopback only; every loop is bounded in count and time.

    python benchmarks/soak.py                  # short mode: SUFFIX, 120 requests (~2 min)
    python benchmarks/soak.py --mode long      # SUFFIX, adaptive SUFFIX, NGRAM; 2000 each
    python benchmarks/soak.py --gpu-path both  # speculative servers on the GPU default
                                               # path's CPU emulation (overlap + graphs)

``--gpu-path overlap|graphs|both`` sets ``SGLANG_SPEC_EXT_CPU_OVERLAP=1`` and/or
``SGLANG_SPEC_EXT_CPU_GRAPHS=1`` on the speculative servers (the plain reference server
keeps the CPU engine's own path).

Writes ``benchmarks/results/soak_<mode>.json`` (machine, versions, parameters, per-kind
counts, verdicts) and prints the table last. Exit 1 if any algorithm fails.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sglang_spec_ext.bench.servers import LaunchedServer  # noqa: E402
from sglang_spec_ext.machine import machine_info  # noqa: E402
from sglang_spec_ext.sglang.cpu.serving import (  # noqa: E402
    GPU_PATH_ENV,
    bind_ranks,
    cpu_serving_env,
    with_cpu_defaults,
)
from sglang_spec_ext.soak import (  # noqa: E402
    ServerHandle,
    build_workload,
    format_table,
    plain_answers,
    soak,
)
from sglang_spec_ext.soak.workload import ADAPTERS, DEFAULT_MIX, SOAK_CORPUS_TOKENS  # noqa: E402

CHAIN3 = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1")
ADAPTIVE = {"SGLANG_SPEC_EXT_ADAPTIVE": "1"}
#: Algorithm label -> (launch flags, extra environment).
ALGORITHMS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "SUFFIX": (("--speculative-algorithm", "SUFFIX"), {}),
    "SUFFIX-adaptive": (("--speculative-algorithm", "SUFFIX"), {"SGLANG_SPEC_EXT_ADAPTIVE": "1"}),
    # Chain drafts: ragged verify through the host's RaggedVerifyLayout (the route FA3 reads)
    "SUFFIX-chains": (("--speculative-algorithm", "SUFFIX"), {"SGLANG_SPEC_EXT_USE_TREE": "0"}),
    "NGRAM": (("--speculative-algorithm", "NGRAM"), {}),
    # The model draft (a 1-layer truncation of the soak model, built at run time) as
    # topk-4 trees: --width is the verify width, the suffix drafts may fill it.
    "HYBRID": (("--speculative-algorithm", "HYBRID", "--speculative-num-steps", "3",
                "--speculative-eagle-topk", "4"), {}),
    # Adaptive draft steps (0..3) over chains of the same weak draft; the verify width is
    # steps + 1 whatever --width says.
    "HYBRID-adaptive": (("--speculative-algorithm", "HYBRID", *CHAIN3), ADAPTIVE),
    "STANDALONE-adaptive": (("--speculative-algorithm", "STANDALONE", *CHAIN3), ADAPTIVE),
    # hand-set tiers (3 steps below batch 8, none from 8 up) with the zero-step draft
    # extend skipped: requests move between drafting and not as the load changes and
    # draft from stale state after an upshift (cold recovery)
    "STANDALONE-pinned-skip": (("--speculative-algorithm", "STANDALONE", *CHAIN3),
                               {**ADAPTIVE, "SGLANG_SPEC_EXT_ADAPTIVE_TIERS": "1,8",
                                "SGLANG_SPEC_EXT_ADAPTIVE_PINNED_KS": "3,0",
                                "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1"}),
    # ... the same tiers with the draft-KV repair: the skipped draft KV is rebuilt when a
    # request drafts again (SGLANG_SPEC_EXT_DRAFT_KV_REPAIR, sets the skip flag itself)
    "STANDALONE-pinned-repair": (("--speculative-algorithm", "STANDALONE", *CHAIN3),
                                 {**ADAPTIVE, "SGLANG_SPEC_EXT_ADAPTIVE_TIERS": "1,8",
                                  "SGLANG_SPEC_EXT_ADAPTIVE_PINNED_KS": "3,0",
                                  "SGLANG_SPEC_EXT_DRAFT_KV_REPAIR": "1",
                                  "SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "1"}),
    # ... and with the controller choosing: it prices leaving zero steps with the rebuild
    # the repair counts (kv_repair_marks.STATS.unwritten_tokens)
    "STANDALONE-adaptive-repair": (("--speculative-algorithm", "STANDALONE", *CHAIN3),
                                   {**ADAPTIVE, "SGLANG_SPEC_EXT_DRAFT_KV_REPAIR": "1",
                                    "SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "1"}),
    # ... and over topk-4 trees (verify widths per step count up to --width)
    "HYBRID-tree-adaptive": (("--speculative-algorithm", "HYBRID", "--speculative-num-steps",
                              "3", "--speculative-eagle-topk", "4"), ADAPTIVE),
}  # fmt: skip
#: Algorithms with a model draft (the weak draft below), and those of them on chains.
CHAINED = ("HYBRID-adaptive", "STANDALONE-adaptive", "STANDALONE-pinned-skip",
           "STANDALONE-pinned-repair", "STANDALONE-adaptive-repair")  # fmt: skip
MODEL_DRAFT = ("HYBRID", "HYBRID-tree-adaptive", *CHAINED)
#: Our algorithms: penalty requests are refused (request_guard.py), the drafter reports
#: its statistics.
GUARDED = (
    "SUFFIX",
    "SUFFIX-adaptive",
    "SUFFIX-chains",
    "HYBRID",
    "HYBRID-adaptive",
    "HYBRID-tree-adaptive",
)
MODES = {
    "short": {
        "requests": 120,
        "context": 256,
        "max_running": 16,
        "algorithms": "SUFFIX",
        "drafter_tokens": 4000,
    },
    "long": {
        "requests": 2000,
        "context": 1024,
        "max_running": 32,
        "algorithms": "SUFFIX,SUFFIX-adaptive,NGRAM,HYBRID",
        "drafter_tokens": 50_000,
    },
}


def token_pool(model_dir: Path) -> list[int]:
    """In-vocabulary ids: this package's own source text, tokenised by the model's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = "\n".join(
        p.read_text(errors="replace")
        for p in sorted((HERE.parent / "sglang_spec_ext").rglob("*.py"))
    )
    special = set(tok.all_special_ids)
    return [t for t in tok(text[:400_000])["input_ids"] if t not in special]


def default_model() -> Path:
    from sglang_spec_ext.models.testing.llama import build_tiny_llama

    path = Path(tempfile.gettempdir()) / "sglang-spec-ext-soak-tiny-llama"
    if not (path / "config.json").exists():
        build_tiny_llama(path, seed=0)
    return path


def weak_draft(model: Path) -> Path:
    """HYBRID's model draft: the soak model's first layer (same vocabulary, weak)."""
    from sglang_spec_ext.models.testing.llama import build_truncated_draft

    return build_truncated_draft(model, Path(tempfile.gettempdir()) / f"{model.name}-draft-l1", 1)


def launch(
    model: Path, name: str, flags: list[str], env: dict[str, str], log_dir: Path
) -> LaunchedServer:
    """An unstarted server: ``with launch(...) as server`` starts it and always stops it."""
    args = with_cpu_defaults(flags, model)
    env = cpu_serving_env(extra=env)
    bind_ranks(args, env)  # several ranks (--tp-size, DP attention): a core each, as serve-cpu
    return LaunchedServer(
        str(model),
        args,
        env=env,
        log_path=log_dir / f"{name}.log",
        name=name,
    )


def gpu_path_seen(log_path: Path, gpu_path: str, name: str) -> dict[str, object]:
    """What the server's log proves of the asked-for GPU-path emulation: whether the
    overlap event loop ran, and its last trace line (relayed decode steps, prefills
    between decode steps, width changes; HYBRID is not overlapped, by design); how many
    graph shapes were captured and first replayed (a width the graphs were not captured
    at runs eagerly, as on a GPU)."""
    from sglang_spec_ext.sglang.cpu.graphs import CAPTURE_MESSAGE, REPLAY_MESSAGE
    from sglang_spec_ext.sglang.cpu.overlap import LOOP_MESSAGE, TRACE_MESSAGE, parse_trace

    seen: dict[str, object] = {}
    env = GPU_PATH_ENV[gpu_path]
    text = Path(log_path).read_text(errors="replace") if env else ""
    if "SGLANG_SPEC_EXT_CPU_GRAPHS" in env:  # shapes captured, and first replayed
        seen["graphs_captured"] = text.count(CAPTURE_MESSAGE)
        seen["graphs_replayed"] = text.count(REPLAY_MESSAGE)
        runners: dict[str, dict[str, int]] = {}
        for key, message in (("captured", CAPTURE_MESSAGE), ("replayed", REPLAY_MESSAGE)):
            for runner in re.findall(re.escape(message) + r"[^\r\n]*?runner=(\w+)", text):
                runners.setdefault(runner, {"captured": 0, "replayed": 0})[key] += 1
        seen["graph_runners"] = runners  # the model drafts' draft / draft-extend runners too
    if "SGLANG_SPEC_EXT_CPU_OVERLAP" in env and not name.startswith("HYBRID"):
        seen["overlap"] = LOOP_MESSAGE in text
        traces = [ln for ln in text.splitlines() if TRACE_MESSAGE in ln]
        seen["overlap_trace"] = parse_trace(traces[-1]) if traces else None
    return seen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mode", choices=sorted(MODES), default="short")
    ap.add_argument("--algorithms", help="comma list of " + ", ".join(ALGORITHMS))
    ap.add_argument("--requests", type=int, help="requests per algorithm")
    ap.add_argument("--context-length", type=int)
    ap.add_argument("--max-running-requests", type=int)
    ap.add_argument("--concurrency", type=int, help="clients (default: --max-running-requests)")
    ap.add_argument("--width", type=int, default=16, help="--speculative-num-draft-tokens")
    ap.add_argument(
        "--model", type=Path, help="model dir (default: the tiny test Llama, built locally)"
    )
    ap.add_argument(
        "--drafter-max-cached-tokens",
        type=int,
        help="SGLANG_SPEC_EXT_MAX_CACHED_TOKENS for SUFFIX (default: small, so the run reaches it)",
    )
    ap.add_argument(
        "--gpu-path",
        choices=sorted(GPU_PATH_ENV),
        default="off",
        help="emulate the GPU default path on the speculative servers: overlap "
        "scheduling, graph runners, or both",
    )
    ap.add_argument(
        "--lora",
        action="store_true",
        help="both servers load two LoRA adapters of the model (built locally) and the mix "
        "gains requests for each adapter and the base model",
    )
    ap.add_argument(
        "--spec-args",
        default="",
        help="extra server flags for the speculative servers only, e.g. "
        "'--tp-size 2 --dp-size 2 --enable-dp-attention' (the plain reference stays one rank)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline-s", type=float, default=3600.0, help="per-phase time bound")
    ap.add_argument(
        "--out", type=Path, help="JSON path (default benchmarks/results/soak_<mode>.json)"
    )
    ap.add_argument("--log-dir", type=Path, help="server logs (default: a temp dir)")
    args = ap.parse_args(argv)

    mode = MODES[args.mode]
    algorithms = (args.algorithms or mode["algorithms"]).split(",")
    unknown = [a for a in algorithms if a not in ALGORITHMS]
    if unknown:
        ap.error(f"unknown algorithm(s) {unknown}; choose from {', '.join(ALGORITHMS)}")
    n = args.requests or mode["requests"]
    ctx = args.context_length or mode["context"]
    max_running = args.max_running_requests or mode["max_running"]
    concurrency = args.concurrency or max_running
    if not 1 <= concurrency <= 256:
        ap.error(f"--concurrency must be in [1, 256], got {concurrency}")
    if not 2 <= args.width <= 64:
        ap.error(f"--width must be in [2, 64], got {args.width}")
    drafter_tokens = args.drafter_max_cached_tokens or mode["drafter_tokens"]
    model = args.model or default_model()
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="spec-ext-soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    common = [
        "--context-length", str(ctx), "--max-running-requests", str(max_running),
        "--max-total-tokens", str(max(8192, ctx * max_running // 2)),
        "--random-seed", "0", "--sleep-on-idle",
    ]  # fmt: skip

    mix = None
    if args.lora:
        refused = [a for a in algorithms if ALGORITHMS[a][1].get("SGLANG_SPEC_EXT_ADAPTIVE")]
        if refused:
            ap.error(f"--lora: {refused} run the controller, which refuses LoRA")
        from sglang_spec_ext.models.testing.lora import build_lora_adapter

        adapters = {
            name: build_lora_adapter(model, log_dir / "adapters" / name, seed=seed)
            for seed, name in enumerate(ADAPTERS)
            if name is not None
        }
        common += ["--lora-paths", *(f"{name}={path}" for name, path in adapters.items())]
        common += ["--max-loras-per-batch", str(len(adapters))]
        mix = {**DEFAULT_MIX, "adapter": 10}
    reqs = build_workload(n, token_pool=token_pool(model), context_len=ctx, seed=args.seed, mix=mix)
    params = {
        "mode": args.mode, "requests": n, "context_length": ctx, "max_running_requests": max_running,
        "concurrency": concurrency, "width": args.width, "model": str(model), "seed": args.seed,
        "drafter_max_cached_tokens": drafter_tokens, "algorithms": algorithms,
        "gpu_path": args.gpu_path, "gpu_path_env": GPU_PATH_ENV[args.gpu_path],
        "lora": args.lora, "spec_args": args.spec_args,
    }  # fmt: skip
    print(f"[soak] {n} requests x {len(algorithms)} algorithm(s); logs in {log_dir}", flush=True)
    rows, record = [], {"machine": machine_info(), "parameters": params, "runs": {}}
    t0 = time.monotonic()
    with launch(model, "plain", common, {}, log_dir) as plain:
        answers = plain_answers(
            plain.url, reqs, concurrency=concurrency, deadline_s=args.deadline_s, progress=True
        )
        for name in algorithms:
            flags, env = ALGORITHMS[name]
            env = {
                **env,
                **GPU_PATH_ENV[args.gpu_path],
                "SGLANG_SPEC_EXT_MAX_CACHED_TOKENS": str(drafter_tokens),
                "SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "1",
                "SGLANG_SPEC_EXT_MAX_CORPUS_TOKENS": str(SOAK_CORPUS_TOKENS),
            }
            width = "4" if name in CHAINED else str(args.width)  # chains: steps + 1
            spec_flags = [*common, *args.spec_args.split(), *flags,
                          "--speculative-num-draft-tokens", width]  # fmt: skip
            if name in MODEL_DRAFT:
                spec_flags += ["--speculative-draft-model-path", str(weak_draft(model))]
            with launch(model, name, spec_flags, env, log_dir) as server:
                handle = ServerHandle(
                    server.url,
                    server.log_path,
                    lambda s=server: s.proc is not None and s.proc.poll() is None,
                )
                bound = drafter_tokens if name in GUARDED else None
                verdict, timing = soak(
                    handle, plain.url, reqs, concurrency=concurrency, deadline_s=args.deadline_s,
                    drafter_bound_tokens=bound, plain=answers, progress=True, seed=args.seed,
                    guarded=name in GUARDED,
                )  # fmt: skip
            gpu_path = gpu_path_seen(server.log_path, args.gpu_path, name)
            if gpu_path.get("overlap") is False:  # asked for and not run: the soak fails
                verdict.failures.append("overlap scheduling was asked for but did not run")
            if gpu_path.get("graphs_captured") == 0:
                verdict.failures.append("graph emulation was asked for but nothing was captured")
            rows.append((name, verdict))
            record["runs"][name] = {
                **verdict.as_dict(),
                "gpu_path_seen": gpu_path,
                "timing": timing,
                "log": str(server.log_path),
            }
    record["wall_s"] = round(time.monotonic() - t0, 1)
    suffix = "" if args.gpu_path == "off" else f"_gpu_path_{args.gpu_path}"
    out = args.out or HERE / "results" / f"soak_{args.mode}{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"[soak] wrote {out} ({record['wall_s']} s)")
    print(format_table(rows))
    return 0 if all(v.ok for _, v in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
