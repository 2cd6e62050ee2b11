"""What a warm machine keeps between two calls of the device tool, and how the second
call reuses it.

The device tool keeps a machine 30 s after a call; a call made in that window finds the
first call's ``--work`` folder (default ``/tmp/gpu-kit``) as it was: the unpacked carry,
the plugin it built, and the caches of the host's JIT kernels (``cache/sglang-jit``,
tvm-ffi + nvcc), Triton (``cache/triton``), tvm-ffi's own (``cache/tvm-ffi``) and
torch.compile (``cache/inductor``). Its ``$OUT`` is emptied and processes it left are
killed, except the servers, which run in sessions of their own (``servers.pids``).

``state.json`` in the work folder records what the next call may reuse: the carry
unpacked (by the manifest's stamp and the archive's size), the plugin build (by a digest
of the plugin's source), the ``sgl_kernel`` choice of the environment stage, and each
call's stage statuses (``--warm`` runs the warm plan's stages that have not passed)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from gpu_kit.pins import REPO

STATE = "state.json"


def load_state(work: Path) -> dict[str, Any]:
    try:
        return json.loads((work / STATE).read_text())
    except (OSError, ValueError):
        return {"calls": []}


def save_state(work: Path, state: dict[str, Any]) -> None:
    work.mkdir(parents=True, exist_ok=True)
    tmp = work / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1, default=str))
    tmp.replace(work / STATE)


def carry_stamp(carry: Path) -> str | None:
    """The carry's identity: the manifest's ``made`` stamp and the archives' sizes."""
    manifest = carry / "manifest.json"
    if not manifest.is_file():
        return None
    made = json.loads(manifest.read_text()).get("made")
    sizes = [f"{p.name}:{p.stat().st_size}" for p in sorted(carry.glob("*.tar.xz"))
             if p.name != "jit-cache.tar.xz"]  # fmt: skip
    return f"{made}|{'|'.join(sizes)}"


def plugin_digest(root: Path = REPO) -> str:
    """A digest of what the plugin build reads (package source, native core, build
    files): the same tree on the next call means the same build."""
    h = hashlib.sha256()
    files = [root / "pyproject.toml", root / "setup.py"]
    for sub in ("sglang_spec_ext", "csrc"):
        files += sorted(p for p in (root / sub).rglob("*") if p.is_file()
                        and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".so"))  # fmt: skip
    for path in files:
        if path.is_file():
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def previous_passed(state: dict[str, Any]) -> set[str]:
    """Stages that passed in an earlier call on this machine."""
    done: set[str] = set()
    for call in state.get("calls", []):
        done |= {name for name, st in (call.get("status") or {}).items() if st == "passed"}
    return done


def record_call(work: Path, state: dict[str, Any], status: dict[str, str], **extra: Any) -> None:
    state.setdefault("calls", []).append(
        {"ended": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "status": status, **extra}
    )
    save_state(work, state)
