"""The placeholder modules for CPU serving (sglang_spec_ext.sglang.cpu.placeholders),
the `serve-cpu` subcommand that installs them, and bench's --serve-cpu.

Placeholder behaviour is checked in fresh interpreters (this test process has them
installed already by tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sglang_spec_ext.sglang.cpu import serving as cpu_serving
from sglang_spec_ext.sglang.cpu.placeholders import PLACEHOLDER_ROOTS

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _plain_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_USE_CPU_ENGINE")}
    env["PYTHONPATH"] = str(REPO)
    return env


def _real_package_missing(name: str) -> bool:
    code = f"import importlib.util, json; print(json.dumps(importlib.util.find_spec({name!r}) is None))"
    return _python(code, _plain_env())


PROBE = """
import importlib, importlib.util, json
res = {}
for name in ("sgl_kernel", "torchvision"):
    res[name + "_find_spec_none"] = importlib.util.find_spec(name) is None
import sgl_kernel
from sgl_kernel.speculative import reconstruct_indices_from_tree_mask as op
res["flag"] = getattr(sgl_kernel, "__spec_ext_placeholder__", False)
res["version"] = sgl_kernel.__version__
res["repr"] = repr(op)
try:
    op(1, 2)
    res["raised"] = None
except Exception as e:
    res["raised"] = type(e).__name__
    res["message"] = str(e)
class Sub(sgl_kernel.SomeBase):  # host classes derive from placeholder bases
    pass
res["subclass_ok"] = True
print(json.dumps(res))
"""


@pytest.mark.skipif(
    not all(_real_package_missing(n) for n in PLACEHOLDER_ROOTS),
    reason="a real sgl_kernel/torchvision is installed here: placeholders are never used",
)
def test_serve_cpu_env_installs_placeholders_that_refuse_when_called() -> None:
    res = _python(PROBE, cpu_serving.cpu_serving_env(_plain_env()))
    assert res["sgl_kernel_find_spec_none"] and res["torchvision_find_spec_none"]
    assert res["flag"] is True and res["version"] == "0.0.0+spec-ext-placeholder"
    assert "placeholder" in res["repr"]
    assert res["raised"] == "PlaceholderCalled"
    assert "sgl_kernel.speculative.reconstruct_indices_from_tree_mask" in res["message"]
    assert "PLACEHOLDER" in res["message"]
    assert res["subclass_ok"] is True


def test_placeholders_are_not_installed_unless_asked() -> None:
    """Importing the plugin (as every SGLang process does) installs nothing."""
    code = """
    import importlib, json, sys
    import sglang_spec_ext.plugin, sglang_spec_ext.sglang.cpu.placeholders as cp
    res = {"installed": cp.installed()}
    try:
        importlib.import_module("sgl_kernel")
        res["imported"] = True
    except ImportError:
        res["imported"] = False
    res["real"] = res["imported"] and not getattr(sys.modules["sgl_kernel"], "__spec_ext_placeholder__", False)
    print(json.dumps(res))
    """
    res = _python(code, _plain_env())
    assert res["installed"] is False
    assert res["imported"] is False or res["real"] is True


def test_a_real_package_is_never_shadowed(tmp_path: Path) -> None:
    pkg = tmp_path / "sgl_kernel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("REAL = 1\n")
    env = cpu_serving.cpu_serving_env(_plain_env())
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    res = _python(
        "import json, sgl_kernel; print(json.dumps([sgl_kernel.REAL, "
        "getattr(sgl_kernel, '__spec_ext_placeholder__', False)]))",
        env,
    )
    assert res == [1, False]


def test_shadowed_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITE_RAN = True\n")
    env = cpu_serving.cpu_serving_env(_plain_env())
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    code = (
        "import builtins, json, sys; import sglang_spec_ext.sglang.cpu.placeholders as cp; "
        "print(json.dumps([getattr(builtins, 'USER_SITE_RAN', False), cp.installed()]))"
    )
    assert _python(code, env) == [True, True]


def test_cpu_defaults_are_added_only_where_not_given() -> None:
    args = cpu_serving.with_cpu_defaults(["--model-path", "m", "--dtype=bfloat16"])
    assert args.count("--dtype=bfloat16") == 1 and "--dtype" not in args
    assert args[args.index("--device") + 1] == "cpu"
    assert args[args.index("--attention-backend") + 1] == "torch_native"
    given = ["--device", "cpu", "--attention-backend", "intel_amx", "--dtype", "float16"]
    assert cpu_serving.with_cpu_defaults(given) == given


def test_mamba_state_models_get_the_cpu_mamba_settings(tmp_path) -> None:
    """A local model with Mamba-style state (Qwen3-Next) gets the no_buffer radix strategy
    and overlap off (what the host's CPU platform allows); others, and flags given, not."""
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen3NextForCausalLM"]}')
    args = cpu_serving.with_cpu_defaults(["--model-path", str(tmp_path)])
    assert args[args.index("--mamba-radix-cache-strategy") + 1] == "no_buffer"
    assert "--disable-overlap-schedule" in args
    given = ["--model-path", str(tmp_path), "--mamba-radix-cache-strategy=no_buffer"]
    assert cpu_serving.mamba_cpu_flags(given) == ["--disable-overlap-schedule"]
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    assert cpu_serving.mamba_cpu_flags(["--model-path", str(tmp_path)]) == []
    assert cpu_serving.mamba_cpu_flags(["--model-path", "org/hub-name"]) == []


def _cli(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_USE_CPU_ENGINE"}
    return subprocess.run(
        [sys.executable, "-m", "sglang_spec_ext.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_serve_cpu_subcommand_prints_its_command() -> None:
    out = _cli("serve-cpu", "--print-command", "--", "--model-path", "/m", "--port", "1234")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "SGLANG_USE_CPU_ENGINE=1"
    site = str(cpu_serving.placeholder_site_dir())
    assert lines[1].startswith(f"PYTHONPATH={site}")
    assert lines[2].endswith(
        "-m sglang.launch_server --model-path /m --port 1234 --device cpu "
        "--attention-backend torch_native --dtype float32"
    )


def test_multi_rank_servers_get_a_core_binding_where_the_host_would_stop() -> None:
    """The host's CPU engine stops at start-up when ranks outnumber NUMA nodes and
    SGLANG_CPU_OMP_THREADS_BIND is unset; serve-cpu splits the cores instead."""
    ranks = cpu_serving.cpu_ranks
    assert ranks(["--model-path", "/m"]) == 1
    assert ranks(["--tp-size", "2"]) == 2
    assert ranks(["--tp-size", "2", "--dp-size", "2"]) == 4  # plain DP: a TP group per replica
    assert ranks(["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]) == 2
    assert ranks(["--tp", "2", "--attn-dp-size", "2"]) == 2
    bind = cpu_serving.omp_bind_for
    assert bind(1, [0, 1], numa_nodes=1) is None
    assert bind(2, [0, 1, 2, 3], numa_nodes=2) is None  # a node per rank: the host's default
    assert bind(2, [0, 1, 2, 3], numa_nodes=1) == "0-1|2-3"
    assert bind(2, [0, 1], numa_nodes=1) == "0|1"
    assert bind(4, [0, 1], numa_nodes=1) == "0|1|0|1"  # fewer cores than ranks: shared
    assert bind(3, [4, 5, 6, 7, 8, 9, 10], numa_nodes=1) == "4-5|6-7|8-9"
    out = _cli("serve-cpu", "--print-command", "--", "--model-path", "/m", "--tp-size", "4")
    assert out.returncode == 0, out.stderr
    assert any(line.startswith("SGLANG_CPU_OMP_THREADS_BIND=") for line in out.stdout.splitlines())
    assert "set it yourself to choose" in out.stderr


def test_serve_cpu_without_a_model_path_names_the_flag() -> None:
    out = _cli("serve-cpu", "--", "--port", "1234")
    assert out.returncode == 2
    assert "--model-path" in out.stderr


def test_bench_serve_cpu_launches_cpu_servers() -> None:
    from sglang_spec_ext.bench import cli as bench_cli

    parser = __import__("argparse").ArgumentParser()
    bench_cli.add_arguments(parser)
    args = parser.parse_args(
        ["--model-path", "/m", "--serve-cpu", "--server-args", "--dtype bfloat16",
         "--server-env", "A=1", "--pythonpath", "/extra"]
    )  # fmt: skip
    endpoints = bench_cli._endpoints(args)
    assert [e.role for e in endpoints] == ["baseline", "speculative"]
    spec = endpoints[1]
    assert spec.env["SGLANG_USE_CPU_ENGINE"] == "1" and spec.env["A"] == "1"
    assert spec.pythonpath[0] == str(cpu_serving.placeholder_site_dir())
    assert spec.pythonpath[-1] == "/extra"
    assert "--dtype bfloat16" in spec.args and "--dtype float32" not in spec.args
    assert "--device cpu" in spec.args and "--speculative-algorithm SUFFIX" in spec.args
    plain = bench_cli._endpoints(parser.parse_args(["--model-path", "/m"]))
    assert "SGLANG_USE_CPU_ENGINE" not in plain[0].env and "--device" not in plain[0].args


def test_tune_shares_the_launch_options() -> None:
    import argparse

    from sglang_spec_ext.bench.servers import launch_settings
    from sglang_spec_ext.tune import cli as tune_cli

    parser = argparse.ArgumentParser()
    tune_cli.add_arguments(parser)
    args = parser.parse_args(["--model-path", "/m", "--serve-cpu", "--server-env", "B=2"])
    launch = launch_settings(args)
    assert launch.env["SGLANG_USE_CPU_ENGINE"] == "1" and launch.env["B"] == "2"
    assert "--device cpu" in launch.launch_args() and launch.timeout_s == 600.0
    plain = launch_settings(parser.parse_args(["--model-path", "/m"]))
    assert plain.launch_args() == "" and "SGLANG_USE_CPU_ENGINE" not in plain.env
