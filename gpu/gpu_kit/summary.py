"""Condense ``gpu/run`` results (``results.json`` + ``server-logs.txt`` of each device call)
into one committed JSON: machine, versions, what was carried, each stage's status and the
line that ended it, and the host's start-up timings per server.

    python gpu/gpu_kit/summary.py RUN_DIR [RUN_DIR ...] --out benchmarks/results/X.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script too

from gpu_kit.results import load_partial  # noqa: E402

_TIMINGS = re.compile(r"Engine startup timings \(s\): (.*)")
_LOG_HEADER = re.compile(r"^===== (\S+)\.log ")


def _last_error_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", ln) or "failed to dispatch" in ln:
            return ln[:300]
    return lines[0][:300] if lines else ""


def _cause(text: str) -> str:
    """The exception that killed a server: the last 'XError: ...' line of its log tail
    other than the kit's own 'ServerError: ... exited'."""
    lines = [ln.strip() for ln in str(text).splitlines()]
    causes = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception): ", ln)
              and not ln.startswith("ServerError")]  # fmt: skip
    return causes[-1][:300] if causes else _last_error_line(text)


def startup_timings(server_logs: str) -> dict[str, str]:
    """The host's own 'Engine startup timings' line of each server log."""
    out: dict[str, str] = {}
    label = None
    for ln in server_logs.splitlines():
        if m := _LOG_HEADER.match(ln):
            label = m.group(1)
        elif label and (m := _TIMINGS.search(ln)):
            out[label] = m.group(1)
    return out


def summarize_run(run_dir: Path) -> dict[str, Any]:
    r = load_partial(run_dir)  # results.json, or rebuilt from cells.jsonl after a kill
    stages = r["stages"]
    env = stages.get("env", {})
    machine = env.get("machine", {})
    carry = stages.get("install", {}).get("carry", {})
    out: dict[str, Any] = {
        "started": r["meta"].get("started"),
        "argv": r["meta"].get("argv"),
        "device": machine.get("nvidia_smi", "").splitlines()[-1:],
        "platform": machine.get("platform"),
        "versions": machine.get("versions"),
        "carried": {
            "wheels": carry.get("manifest", {}).get("wheels"),
            "sgl_kernel": carry.get("manifest", {}).get("sgl_kernel", {}).get("wheel"),
            "jit_cache": carry.get("jit-cache.tar.xz"),
            "site_overrides": carry.get("site_overrides", []),
        },
        "sgl_kernel": env.get("sgl_kernel_carried"),
        "host_cuda_imports": {k: env.get("imports", {}).get(k) for k in ("ok", "failed")},
        "plugin_build": {k: env.get("plugin", {}).get(k) for k in ("installed_by", "native_core")},
        "stages": {},
    }
    for name in r.get("order", stages):
        st = stages.get(name, {})
        row = {"status": st.get("status"), "seconds": st.get("seconds")}
        if st.get("status") in ("failed", "capped", "time-up"):
            row["ended_by"] = _last_error_line(st.get("error", ""))
        if st.get("status") == "skipped":
            row["why"] = st.get("reason") or st.get("error")
        out["stages"][name] = row
    out["cells"] = len(r.get("cells", []))
    out["servers_up"] = {
        srv["label"]: {"ready_s": srv.get("ready_s"), "first_request_s": srv.get("first_request_s")}
        for srv in r["meta"].get("servers", [])
        if not srv.get("error")
    }
    out["server_failures"] = {
        srv["label"]: _cause(srv["error"])
        for srv in r["meta"].get("servers", [])
        if srv.get("error")
    }
    logs = run_dir / "server-logs.txt"
    if logs.is_file():
        out["startup_timings"] = startup_timings(logs.read_text(errors="replace"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--note", action="append", default=[], help="a finding, in words")
    a = ap.parse_args(argv)
    doc = {"doc": "gpu/run on the lent GPU machine: one entry per device call (summary.py)",
           "findings": a.note, "runs": [summarize_run(d) for d in a.runs]}  # fmt: skip
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
