"""A stand-in for ``python -m sglang.launch_server`` (tests of gpu/run's control flow only).

Accepts launch_server's arguments, answers ``/health`` and ``/generate`` with token ids
(``--skip-tokenizer-init`` style, streamed or not) computed from the prompt, the same for
every algorithm, so parity holds unless told otherwise. Test hooks (environment):
``FAKE_SERVER_EXIT_ALGO=NAME`` exits at start for that ``--speculative-algorithm``;
``FAKE_SERVER_DIFFER_ALGO=NAME`` changes its output from the sixth token on;
``FAKE_SERVER_HANG_ALGO=NAME`` never answers a ``/generate``. A speculative
server commits 2 tokens a step, or ``SGLANG_SIMULATE_ACC_LEN`` of them. With
``GPU_KIT_PROBE_OUT`` set it writes probe figures as gpu/probe_site does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--speculative-algorithm", default="")
    ap.add_argument("--speculative-num-draft-tokens", type=int, default=1)
    args, _ = ap.parse_known_args()
    return args


ARGS = parse()
ALGO = ARGS.speculative_algorithm
PROBE = os.environ.get("GPU_KIT_PROBE_OUT")
FIGURES: dict = {}


def outputs(input_ids: list[int], n: int) -> list[int]:
    out = [(sum(input_ids) * 31 + 7 * i) % 1000 + 10 for i in range(n)]
    if os.environ.get("FAKE_SERVER_DIFFER_ALGO") == ALGO and n > 5:
        out[5:] = [x + 1 for x in out[5:]]
    return out


def probe_steps(bs: int, steps: int) -> None:
    if not PROBE:
        return
    try:
        label = open(os.environ["GPU_KIT_PROBE_CTL"]).read().strip() or "off"
    except OSError:
        label = "off"
    row = FIGURES.setdefault(label, {}).setdefault(str(bs), {
        "steps": 0, "step_s": 0.0, "fwd_s": 0.0, "step_cpu_s": 0.0, "fwd_cpu_s": 0.0,
        "syncs_in_step": 0, "syncs_elsewhere": 0, "sites": {}})  # fmt: skip
    row["steps"] += steps
    row["step_s"] += 0.003 * steps
    row["fwd_s"] += 0.002 * steps
    row["step_cpu_s"] += 0.001 * steps
    if label.startswith("sync"):
        row["syncs_in_step"] += 2 * steps
        row["sites"]["sglang/fake.py:1"] = row["sites"].get("sglang/fake.py:1", 0) + steps
    with open(f"{PROBE}.{os.getpid()}", "w") as f:
        json.dump({"pid": os.getpid(), "figures": FIGURES}, f)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        return None

    def _json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._json(200 if self.path == "/health" else 404, {})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if os.environ.get("FAKE_SERVER_HANG_ALGO") == ALGO and ALGO:
            time.sleep(600)
        n = body["sampling_params"]["max_new_tokens"]
        ids = outputs(body["input_ids"], n)
        sim = float(os.environ.get("SGLANG_SIMULATE_ACC_LEN", "-1"))
        per_step = (int(sim) if sim >= 1 else 2) if ALGO else 1
        probe_steps(1, (n + per_step - 1) // per_step)
        meta = {"completion_tokens": n}
        if ALGO:
            meta |= {"spec_verify_ct": (n + 1) // 2, "spec_accept_length": 2.0}
        if not body.get("stream"):
            self._json(200, {"output_ids": ids, "meta_info": meta})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        step_s = 0.002 * (1 + ARGS.speculative_num_draft_tokens / 8)
        for i in range(0, n, per_step):
            time.sleep(step_s)
            chunk = {"output_ids": ids[: i + per_step], "meta_info": meta}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


if __name__ == "__main__":
    if os.environ.get("FAKE_SERVER_EXIT_ALGO") == ALGO and ALGO:
        print(f"fake server: exiting on purpose ({ALGO})", file=sys.stderr)
        sys.exit(3)
    ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler).serve_forever()
