"""The README front page is true: its commands run as printed, its results come from JSON.

* Every command in the README's ``bash`` blocks is checked: each
  ``python -m sglang.launch_server`` line (with the environment it sets) goes through
  the host's real argument pipeline with the plugin registered
  (``prepare_server_args -> resolve_once -> check_server_args``), its placeholders
  (``MODEL``, ``EAGLE3_HEAD``, the hub id ``XiaomiMiMo/MiMo-7B-RL``) replaced by a tiny
  model, a random-weight EAGLE3 head and a tiny MiMo with an MTP layer built here, and
  ``--device cpu`` added (this machine has no GPU): a flag the host or
  the plugin refuses fails the test. ``sglang-spec-ext serve-cpu -- ARGS`` is run with
  ``--print-command`` and its server arguments are resolved the same way;
  ``sglang-spec-ext doctor`` runs; the two set-up scripts are checked by ``bash -n``;
  ``pip install`` must name this project's distribution or the wheel
  ``scripts/build_release.sh`` writes (``dist/sglang_spec_ext-*.whl``).
* Every figure of the "Headline results" table is recomputed from the JSON file its row
  links to.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
RESULTS = ROOT / "benchmarks" / "results"


def readme_commands() -> list[str]:
    """The README's shell commands: ``bash`` blocks, continuations joined, comments dropped."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def test_readme_is_a_front_page():
    assert README.count("\n") <= 210
    first = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert first[0].startswith("bash scripts/demo.sh") and first[2].startswith(
        "bash scripts/test.sh"
    )
    for page in re.findall(r"\]\((docs/[\w.-]+\.md)", README):
        assert (ROOT / page).exists(), page


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from sglang_spec_ext.models.testing.llama import build_eagle3_head, build_tiny_llama
    from sglang_spec_ext.models.testing.mtp import build_tiny_mimo_mtp

    model = build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0)
    head = build_eagle3_head(model, tmp_path_factory.mktemp("eagle3") / "head")
    # the README's MiMo-7B-RL command: a tiny MiMo with its MTP layer stands in (same
    # architecture, no download)
    mimo = build_tiny_mimo_mtp(tmp_path_factory.mktemp("mimo") / "mimo")
    return {"MODEL": str(model), "EAGLE3_HEAD": str(head), "XiaomiMiMo/MiMo-7B-RL": str(mimo)}


def _resolve(argv: list[str], env: dict[str, str], monkeypatch) -> None:
    from sglang.srt.server_args import prepare_server_args

    from sglang_spec_ext.plugin import register
    from sglang_spec_ext.sglang.serving.server_args import plugin_config

    for k in list(os.environ):
        if k.startswith("SGLANG_SPEC_EXT_"):
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if hasattr(plugin_config, "cache_clear"):
        plugin_config.cache_clear()
    logging.getLogger("sglang").setLevel(logging.ERROR)
    register()
    if "--device" not in argv:
        argv = [*argv, "--device", "cpu"]
    if "--attention-backend" not in argv:
        argv = [*argv, "--attention-backend", "torch_native"]
    sa = prepare_server_args(argv)
    sa.resolve_once()
    sa.check_server_args()


def _split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    return env, words


def test_every_readme_command_runs_as_printed(models, monkeypatch):
    commands = readme_commands()
    launches = 0
    for command in commands:
        words = [models.get(w, w) for w in shlex.split(command)]
        env, words = _split_env(words)
        if words[:3] == ["python", "-m", "sglang.launch_server"]:
            _resolve(words[3:], env, monkeypatch)
            launches += 1
        elif words[:2] == ["sglang-spec-ext", "serve-cpu"]:
            shown = subprocess.run(
                [sys.executable, "-m", "sglang_spec_ext.cli", "serve-cpu", "--print-command",
                 *words[2:]],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            launch = shlex.split(shown.splitlines()[-1])
            assert launch[1:3] == ["-m", "sglang.launch_server"]
            _resolve(launch[3:], env, monkeypatch)
            launches += 1
        elif words[:2] == ["sglang-spec-ext", "doctor"]:
            done = subprocess.run(
                [sys.executable, "-m", "sglang_spec_ext.cli", *words[1:]],
                capture_output=True, text=True,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
        elif words[:2] == ["pip", "install"]:
            name = re.search(r'^name = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
            # the distribution, or the wheel scripts/build_release.sh writes to dist/
            wheel = f"dist/{name.group(1).replace('-', '_')}-*.whl"
            assert words[2:] in ([name.group(1)], [wheel]), words
        elif words[0] == "bash":
            subprocess.run(["bash", "-n", str(ROOT / words[1])], check=True)
        else:
            pytest.fail(f"README command the test does not know how to check: {command}")
    assert launches >= 5


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _expected_figures() -> dict[str, list[str]]:
    """JSON file -> the figures its row of the results table must show."""
    rc = _load("replay_compare.json")["results"]
    at16 = {k: v["16"]["overall"]["accept_len"] for k, v in rc.items()}
    served = _load("smollm2_serving.json")["tokens_per_s"]
    mixed = _load("hybrid_replay.json")["bars"]["5"]["mixed"]
    bars = _load("adaptive_replay_model_drafts_repair.json")["bars"]
    fixed = [c["ctl_over_best_fixed"] for cell in bars.values() for c in cell.values()]
    soak = _load("soak_long.json")["runs"]
    checked = {r["parity_checked"] for r in soak.values()}
    assert len(checked) == 1 and all(
        r["parity_mismatches"] == 0 and r["server_alive"] for r in soak.values()
    )
    n = checked.pop()
    mtp = _load("hybrid_smollm2_mtp.json")["modes"]
    assert set(mtp) == {"eager", "graphs"}
    assert all(r["identical_to_plain"] for m in mtp.values() for r in m["results"].values())
    acc, graphs = ({k: r["accept_length"] for k, r in mtp[m]["results"].items() if k != "plain"}
                   for m in ("eager", "graphs"))  # fmt: skip
    assert acc == graphs  # the row gives one figure for both modes
    ragged, cold = (
        _load(f)["results"] for f in ("ragged_smollm2.json", "ragged_smollm2_cold.json")
    )
    for run in (ragged, cold):
        assert all(v["identical_to_plain"] for lv in run.values() for v in lv.values())
    r64, c16, c64 = ({k: run[k][c]["vs_plain"] for k in ("SUFFIX ragged", "SUFFIX padded",
                      "adaptive padded")} for run, c in ((ragged, "64"), (cold, "16"), (cold, "64")))  # fmt: skip

    def over_best(run: dict, c: str) -> float:
        best = max(run[k][c]["goodput_tok_s"] for k in ("SUFFIX padded", "adaptive padded"))
        return run["SUFFIX ragged"][c]["goodput_tok_s"] / best

    wide = _load("hybrid_wide.json")
    assert all(r["identical_to_plain"] for r in wide["served"].values())
    w16, w4, sx = (wide["served"][k]["accept_length"] for k in (
        "HYBRID suffix width 16", "HYBRID suffix width 4", "SUFFIX w16"))  # fmt: skip
    rw = [wide["replay"][s]["HYBRID suffix width 16"] for s in ("code-edit", "repeat")]
    rs = [wide["replay"][s]["SUFFIX w16 (tree)"] for s in ("code-edit", "repeat")]
    c8 = _load("hybrid_wide_c8.json")["served"]
    c8_ratio = c8["HYBRID suffix width 16"]["tok_s"] / c8["HYBRID suffix width 4"]["tok_s"]
    return {
        "hybrid_wide.json": [
            f"{w16['code-edit']:.2f} / {w16['repeat']:.2f} (code edits / repeated questions) vs "
            f"SUFFIX alone at width 16 {sx['code-edit']:.2f} / {sx['repeat']:.2f}, and "
            f"{w4['code-edit']:.2f} / {w4['repeat']:.2f} with suffix drafts cut",
            f"{rw[0]:.2f} / {rw[1]:.2f} vs {rs[0]:.2f} / {rs[1]:.2f}",
            f"at concurrency 8 {c8_ratio:.2f}x the cut HYBRID's tok/s",
        ],
        "ragged_smollm2.json": [
            f"{r64['SUFFIX ragged']:.2f}x plain, against {r64['SUFFIX padded']:.2f}x for padded "
            f"SUFFIX and {r64['adaptive padded']:.2f}x for the width controller",
            f"{over_best(ragged, '16'):.2f}x the controller at 16",
        ],
        "ragged_smollm2_cold.json": [
            f"{c16['SUFFIX ragged']:.2f}x and {c64['SUFFIX ragged']:.2f}x plain; "
            f"{over_best(cold, '16'):.2f}x and {over_best(cold, '64'):.2f}x the better of padded "
            f"SUFFIX ({c16['SUFFIX padded']:.2f}x, {c64['SUFFIX padded']:.2f}x) and the width "
            f"controller ({c16['adaptive padded']:.2f}x, {c64['adaptive padded']:.2f}x)",
        ],
        "hybrid_smollm2_mtp.json": [
            f"{acc['HYBRID']:.2f} vs {acc['NEXTN']:.2f} for MTP alone (NEXTN), "
            f"{acc['HYBRID'] / acc['NEXTN']:.2f}x",
            f"SUFFIX {acc['SUFFIX']:.2f}",
        ],
        "replay_compare.json": [
            f"{at16['suffix']:.2f} vs {at16['arctic']:.2f} ({at16['suffix'] / at16['arctic']:.2f}x)",
            f"host NGRAM {at16['ngram']:.2f}",
        ],
        "smollm2_serving.json": [
            f"{served['baseline']:.1f} -> {served['SUFFIX']:.1f} tok/s "
            f"({served['SUFFIX'] / served['baseline']:.2f}x)"
        ],
        "hybrid_replay.json": [
            f"{mixed['hybrid']:.2f} vs {mixed['best_single']:.2f} "
            f"({mixed['hybrid'] / mixed['best_single']:.2f}x)"
        ],
        "adaptive_replay_model_drafts_repair.json": [f"{min(fixed):.3f}-{max(fixed):.3f}"],
        "soak_long.json": [f"{n} of {n} greedy answers identical"],
    }


def test_headline_figures_are_read_from_their_json():
    table = README.split("## Headline results", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("|") and "](benchmarks/" in ln]
    expected = _expected_figures()
    linked = {re.search(r"\(benchmarks/results/([\w.]+)\)", r).group(1): r for r in rows}
    assert set(linked) == set(expected)
    for name, figures in expected.items():
        for figure in figures:
            assert figure in linked[name], f"{name}: README row lacks {figure!r}"
