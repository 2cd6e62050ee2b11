"""Send a soak workload to a server, compare with a plain server, and judge the run.

Only loopback servers: every URL is checked to be on 127.0.0.0/8 or ``localhost``
before anything is sent. Request loops are bounded by the workload's length and by
a deadline; each request has its own timeout.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import requests

from sglang_spec_ext.soak.workload import SoakRequest

#: Server-log lines that mean the server broke (the host's idle memory check included).
FATAL_LOG_PATTERNS = (
    "memory leak detected",
    "Scheduler hit an exception",
    "KV double free",
    "use-after-free",
    "Received sigquit",
    # not fatal to the server (the repair switches itself off), but the feature broke
    "draft-KV repair failed",
)
#: The line the SUFFIX worker logs with its drafter statistics (JSON after the colon).
DRAFTER_STATS_MARK = "sglang-spec-ext drafter stats: "


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    if host != "localhost" and not host.startswith("127."):
        raise ValueError(f"the soak harness only sends to loopback servers, not {url!r}")


@dataclass
class Outcome:
    """What came back for one request."""

    index: int
    kind: str
    status: str  # ok | refused | disconnected | error | timeout
    http: int | None = None
    output_ids: list[Any] | None = None  # one list, or one per sample for n > 1
    finish: Any = None
    accept_length: float | None = None
    error: str = ""
    latency_s: float = 0.0


def _finish(meta: dict[str, Any]) -> Any:
    fr = meta.get("finish_reason")
    return fr.get("type") if isinstance(fr, dict) else fr


def send(base_url: str, req: SoakRequest, timeout_s: float = 120.0) -> Outcome:
    """One request; never raises (a failure is an outcome)."""
    t0 = time.monotonic()
    out = Outcome(req.index, req.kind, "error")
    try:
        if req.expect == "disconnect":
            with requests.post(
                base_url + "/generate", json=req.payload, stream=True, timeout=timeout_s
            ) as r:
                out.http = r.status_code
                if r.status_code != 200:
                    out.status = "refused" if 400 <= r.status_code < 500 else "error"
                    out.error = r.text[:300]
                    return out
                chunks = 0
                for line in r.iter_lines():
                    if line.startswith(b"data:") and b"[DONE]" not in line:
                        chunks += 1
                        if chunks >= req.read_chunks:
                            break  # leaving the block closes the connection mid-stream
                out.status = "disconnected" if chunks >= req.read_chunks else "ok"
                return out
        if req.endpoint != "/generate":  # an operator request
            if req.endpoint.startswith("GET "):
                r = requests.get(base_url + req.endpoint[4:], timeout=timeout_s)
            else:
                r = requests.post(base_url + req.endpoint, json=req.payload, timeout=timeout_s)
            out.http = r.status_code
            out.status = "ok" if r.status_code == 200 else "error"
            if 400 <= r.status_code < 500:
                out.status = "refused"
            if r.status_code != 200:
                out.error = r.text[:300]
            return out
        r = requests.post(base_url + "/generate", json=req.payload, timeout=timeout_s)
        out.http = r.status_code
        if 400 <= r.status_code < 500:
            out.status, out.error = "refused", r.text[:300]
        elif r.status_code != 200:
            out.status, out.error = "error", r.text[:300]
        else:
            body = r.json()
            items = body if isinstance(body, list) else [body]
            ids = [item.get("output_ids") for item in items]
            metas = [item.get("meta_info", {}) for item in items]
            out.status = "ok"
            out.output_ids = ids if len(items) > 1 else ids[0]
            out.finish = [_finish(m) for m in metas] if len(items) > 1 else _finish(metas[0])
            acc = metas[0].get("spec_accept_length")
            out.accept_length = float(acc) if acc is not None else None
            if req.payload.get("return_logprob") and not metas[0].get("output_token_logprobs"):
                out.status, out.error = "error", "logprobs asked for, none returned"
            if req.meta.get("n") and len(items) != req.meta["n"]:
                out.status, out.error = "error", f"n={req.meta['n']} asked, {len(items)} came"
    except requests.Timeout as e:
        out.status, out.error = "timeout", str(e)[:300]
    except (requests.RequestException, ValueError) as e:
        out.status, out.error = "error", f"{type(e).__name__}: {e}"[:300]
    finally:
        out.latency_s = time.monotonic() - t0
    return out


def run_requests(
    base_url: str,
    reqs: Sequence[SoakRequest],
    *,
    concurrency: int,
    deadline_s: float,
    timeout_s: float = 120.0,
    progress: Callable[[int], None] | None = None,
) -> list[Outcome]:
    """Send ``reqs`` with ``concurrency`` clients; requests not started by the deadline
    are recorded as ``timeout`` (never sent)."""
    check_loopback(base_url)
    stop_at = time.monotonic() + deadline_s

    def one(req: SoakRequest) -> Outcome:
        if time.monotonic() > stop_at:
            return Outcome(req.index, req.kind, "timeout", error="deadline passed, not sent")
        return send(base_url, req, timeout_s)

    results: dict[int, Outcome] = {}
    with cf.ThreadPoolExecutor(max(1, concurrency)) as pool:
        futures = [pool.submit(one, r) for r in reqs]
        for fut in cf.as_completed(futures):
            o = fut.result()
            results[o.index] = o
            if progress is not None:
                progress(1)
    return [results[r.index] for r in reqs]


@dataclass
class ServerHandle:
    """What the judge needs of a server: its URL, its log, and whether it still runs."""

    url: str
    log_path: Path | None
    alive: Callable[[], bool]


def scan_log(log_path: Path | None) -> dict[str, Any]:
    """Fatal lines, the last drafter-statistics record, and the largest value each
    statistic took over all records in a server log."""
    if log_path is None or not Path(log_path).exists():
        return {"fatal": [], "drafter_stats": None, "drafter_max": {}}
    fatal, stats, peak = [], None, {}
    for line in Path(log_path).read_text(errors="replace").splitlines():
        if any(p in line for p in FATAL_LOG_PATTERNS):
            fatal.append(line[:300])
        pos = line.find(DRAFTER_STATS_MARK)
        if pos >= 0:
            try:
                stats = json.loads(line[pos + len(DRAFTER_STATS_MARK) :])
            except ValueError:
                continue
            for key, value in stats.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    peak[key] = max(peak.get(key, value), value)
    return {"fatal": fatal[:20], "drafter_stats": stats, "drafter_max": peak}


def healthy(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=10).status_code == 200
    except requests.RequestException:
        return False


@dataclass
class Verdict:
    """The judged run: counts per kind, failures, and whether the server survived."""

    per_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    parity_checked: int = 0
    parity_mismatches: int = 0
    post_abort_checked: int = 0
    post_abort_mismatches: int = 0
    server_alive: bool = True
    fatal_log_lines: list[str] = field(default_factory=list)
    drafter_stats: dict[str, Any] | None = None
    drafter_peak: dict[str, Any] = field(default_factory=dict)
    drafter_within_bound: bool | None = None
    mean_accept_length: float | None = None

    @property
    def ok(self) -> bool:
        return (
            not self.failures
            and self.server_alive
            and not self.fatal_log_lines
            and self.parity_mismatches == 0
            and self.post_abort_mismatches == 0
            and self.drafter_within_bound is not False
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _same(a: Outcome, b: Outcome) -> bool:
    if a.status != b.status:
        return False
    return a.status != "ok" or a.output_ids == b.output_ids


def judge(
    reqs: Sequence[SoakRequest],
    spec: Sequence[Outcome],
    plain: dict[int, Outcome],
    post_abort: Sequence[tuple[Outcome, Outcome]],
    server: ServerHandle,
    drafter_bound_tokens: int | None = None,
    guarded: bool = False,
) -> Verdict:
    """Compare a run with the plain server's answers and the server's state after it.

    ``plain`` maps request index -> the plain server's outcome for every parity
    request and every request that must be refused; ``post_abort`` pairs the
    speculative and plain outcomes of greedy requests re-sent after the load.
    ``guarded``: the server runs one of this package's algorithms, so requests with
    ``expect == "guarded"`` must be refused (else answered).
    """
    v = Verdict()
    accepts = []
    for req, out in zip(reqs, spec, strict=True):
        row = v.per_kind.setdefault(req.kind, {})
        row["sent"] = row.get("sent", 0) + 1
        row[out.status] = row.get(out.status, 0) + 1
        if out.accept_length is not None:
            accepts.append(out.accept_length)
        expect = req.expect
        if expect == "guarded":
            expect = "refused" if guarded else "ok"
        wrong = (
            (expect == "ok" and out.status != "ok")
            or (expect == "refused" and out.status != "refused")
            or (expect == "disconnect" and out.status not in ("ok", "disconnected"))
            or (expect == "admin" and out.status not in ("ok", "refused"))
        )
        base = plain.get(req.index)
        if wrong and not (
            req.expect != "guarded" and base is not None and base.status == out.status
        ):
            # Refused by both servers alike (a kind the host does not serve here) is
            # not ours to fix; anything else is a failure.
            v.failures.append(f"#{req.index} {req.kind}: {out.status} {out.error[:160]}")
        if req.parity and base is not None:
            v.parity_checked += 1
            if not _same(out, base):
                v.parity_mismatches += 1
                row["mismatch"] = row.get("mismatch", 0) + 1
                v.failures.append(f"#{req.index} {req.kind}: output differs from plain server")
    for a, b in post_abort:
        v.post_abort_checked += 1
        if not _same(a, b):
            v.post_abort_mismatches += 1
            v.failures.append(f"#{a.index} after aborts: output differs from plain server")
    v.mean_accept_length = sum(accepts) / len(accepts) if accepts else None
    v.server_alive = server.alive() and healthy(server.url)
    log = scan_log(server.log_path)
    v.fatal_log_lines = log["fatal"]
    v.drafter_stats, v.drafter_peak = log["drafter_stats"], log["drafter_max"]
    if drafter_bound_tokens is not None:
        # No statistics at all is a failure too: the bound could not be checked.
        peak = v.drafter_peak.get("cached_tokens")
        v.drafter_within_bound = peak is not None and peak <= drafter_bound_tokens
        if peak is None:
            v.failures.append("no drafter statistics in the server log")
    return v
