"""``sglang-spec-ext doctor``: is everything in place for speculative serving?

Checks, in order: the host (SGLang) version, discovery of our entry point by
the host's real ``load_plugins()``, the algorithms it registered, the effective
configuration, and the suffix drafter's native core. Prints a fix for every
problem and exits non-zero when something would stop a server from starting.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import warnings

from sglang_spec_ext import ALGORITHMS, SUPPORTED_HOST, __version__
from sglang_spec_ext.config import ConfigError, field_table, load_config


class _Report:
    def __init__(self) -> None:
        self.failed = False
        self.data: dict[str, object] = {}

    def line(self, status: str, what: str, fix: str | None = None) -> None:
        print(f"[{status:^4}] {what}")
        if fix:
            print(f"       fix: {fix}")
        if status == "FAIL":
            self.failed = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="OUT", help="also write the findings as JSON")
    parser.add_argument(
        "--list-config", action="store_true", help="list every configuration variable"
    )


def _check_host(rep: _Report) -> bool:
    from sglang_spec_ext.sglang.host.version import UnsupportedHostError, check_host, host_version

    version = host_version()
    rep.data["host_version"] = version
    try:
        check_host(version)
    except UnsupportedHostError as e:
        fix = (
            f"pip install 'sglang{SUPPORTED_HOST}'"
            if version is None
            else f"install sglang{SUPPORTED_HOST} (this release of sglang-spec-ext targets it)"
        )
        rep.line("FAIL", str(e), fix)
        return False
    rep.line("ok", f"sglang {version} (supported: {SUPPORTED_HOST})")
    return True


def _check_registration(rep: _Report) -> None:
    try:
        from sglang_spec_ext.sglang.host.probe import probe_registration

        with warnings.catch_warnings():
            # the host's import-time notices (e.g. "Triton is not supported on current
            # platform" on a CPU-only machine) say nothing about the plugin
            warnings.simplefilter("ignore")
            reg = probe_registration(ALGORITHMS)
    except Exception as e:  # the host itself fails to import
        rep.line(
            "FAIL",
            f"cannot import the host's plugin loader: {type(e).__name__}: {e}",
            "reinstall sglang; run `python -c 'import sglang.srt.plugins'` to see why",
        )
        return
    rep.data["registration"] = reg.__dict__
    if not reg.discovered:
        rep.line(
            "FAIL",
            "the host's load_plugins() does not discover the sglang_spec_ext entry point",
            "reinstall sglang-spec-ext in the same environment as sglang (pip install -e .)",
        )
    elif not reg.allowed:
        rep.line(
            "FAIL",
            "SGLANG_PLUGINS is set and does not list sglang_spec_ext",
            "add sglang_spec_ext to SGLANG_PLUGINS or unset it",
        )
    elif not reg.loaded:
        rep.line(
            "FAIL",
            "the host's load_plugins() ran sglang_spec_ext.plugin:register and it failed",
            "read the host plugin log lines below; `python -c 'import sglang_spec_ext.plugin as p; p.register()'` shows the traceback",
        )
    else:
        rep.line(
            "ok", "entry point sglang_spec_ext discovered and run by the host's load_plugins()"
        )
    for name, ok in reg.algorithms.items():
        if ok:
            rep.line("ok", f"--speculative-algorithm {name} resolves in the host")
        else:
            rep.line(
                "FAIL",
                f"--speculative-algorithm {name} is unknown to the host",
                "see the registration errors below" if reg.errors else None,
            )
    if reg.hooks_waiting:
        rep.line(
            "ok",
            f"{reg.hooks_waiting} runtime hooks on {len(reg.modules_waiting)} host modules "
            "this process cannot import wait for a server to import them"
            + (f" (here: {reg.waiting_reason})" if reg.waiting_reason else ""),
        )
    for msg in reg.errors:
        rep.line("warn", f"host plugin log: {msg}")


def _check_config(rep: _Report) -> None:
    try:
        cfg = load_config()
    except ConfigError as e:
        rep.line("FAIL", f"configuration: {e}", "correct or unset the variable named above")
        return
    rep.data["config"] = cfg.as_dict()
    rep.data["config_sources"] = dict(cfg.sources)
    changed = {n: v for n, v in cfg.as_dict().items() if cfg.sources.get(n, "default") != "default"}
    rep.line(
        "ok",
        f"configuration valid: {len(changed)} of {len(cfg.sources)} settings changed from "
        "their defaults"
        + (":" if changed else " (all of them: sglang-spec-ext doctor --list-config)"),
    )
    for name, value in changed.items():
        print(f"         {name:<22} = {value!r:<12} ({cfg.sources[name]})")
    mem = cfg.suffix_memory()
    rep.data["suffix_memory_bound_bytes"] = mem.total
    rep.line("ok", f"suffix drafter memory bound: {mem.describe()}")
    if cfg.recycle_topk:
        per_vocab = cfg.recycle_max_scopes * cfg.recycle_topk * 4
        rep.data["recycle_table_bytes_per_vocab_entry"] = per_vocab
        rep.line(
            "ok",
            f"recycled top-k tables <= {cfg.recycle_max_scopes} scopes x vocabulary x "
            f"{cfg.recycle_topk} x 4 bytes ({per_vocab * 152064 / (1 << 20):.1f} MiB at a "
            "152k vocabulary; SGLANG_SPEC_EXT_RECYCLE_TOPK=0 turns the source off)",
        )


NATIVE_FIX = (
    "install a C++17 compiler and pybind11, then reinstall: pip install --no-build-isolation "
    "-e . (unset SGLANG_SPEC_EXT_NO_NATIVE); or set SGLANG_SPEC_EXT_BACKEND=python to use "
    "the slow drafter knowingly"
)


def _configured_backend() -> str:
    try:
        return load_config().backend
    except ConfigError:
        return "auto"  # reported by the configuration check


def _check_native(rep: _Report) -> None:
    try:
        from sglang_spec_ext.suffix import native_available
    except ImportError as e:
        rep.line("FAIL", f"suffix drafter not importable: {e}", "reinstall sglang-spec-ext")
        return
    ok = native_available()
    backend = _configured_backend()
    rep.data["native_suffix_core"] = ok
    if ok:
        rep.line("ok", "native suffix-tree core built")
    elif backend == "python":
        rep.line(
            "warn",
            "native suffix-tree core not built; SGLANG_SPEC_EXT_BACKEND=python chosen: the "
            "pure-Python drafter (25-50x slower per step) is used",
        )
    else:
        # backend=auto would fall back to the pure-Python drafter, backend=native would
        # refuse to start: either way serving is not what the user asked for.
        rep.line(
            "FAIL",
            f"native suffix-tree core not built (backend={backend}): SUFFIX would "
            + (
                "refuse to start"
                if backend == "native"
                else "draft with the pure-Python drafter, 25-50x slower per step"
            ),
            NATIVE_FIX,
        )


def run(args: argparse.Namespace) -> int:
    if args.list_config:
        for env, default, rng, help_text in field_table():
            print(f"{env}\n    default {default}; {rng}\n    {help_text}")
        return 0
    rep = _Report()
    print(f"sglang-spec-ext {__version__} on Python {platform.python_version()} ({sys.executable})")
    rep.data["version"] = __version__
    if _check_host(rep):
        _check_registration(rep)
    _check_config(rep)
    _check_native(rep)
    verdict = "problems found" if rep.failed else "all checks passed"
    print(f"doctor: {verdict}")
    rep.data["ok"] = not rep.failed
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rep.data, f, indent=2, default=str)
    return 1 if rep.failed else 0
