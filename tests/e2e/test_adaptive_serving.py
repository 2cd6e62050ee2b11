"""SUFFIX with the adaptive width controller on the real CPU server: lossless."""

from __future__ import annotations

import concurrent.futures as cf
import re

from tests.e2e.spec_metrics import accept_length
from tests.e2e.test_suffix_serving import CODE, PROMPTS

WIDTH = 8


def test_adaptive_width_keeps_greedy_output_identical(
    tiny_model_dir, tiny_baseline_server, start_module_server
):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = tiny_baseline_server
    spec = start_module_server(
        tiny_model_dir,
        "--speculative-algorithm",
        "SUFFIX",
        "--speculative-num-draft-tokens",
        str(WIDTH),
        # Short patience and frequent probes so widths really change within the test.
        env={
            "SGLANG_SPEC_EXT_ADAPTIVE": "1",
            "SGLANG_SPEC_EXT_ADAPTIVE_SWITCH_PATIENCE": "2",
            "SGLANG_SPEC_EXT_ADAPTIVE_PROBE_INTERVAL": "4",
        },
    )
    prompts = [tok(p)["input_ids"] for _, p, _ in PROMPTS] + [tok(CODE * 3)["input_ids"]] * 2

    def run(server, ids):
        return server.generate(input_ids=ids, max_new_tokens=40, temperature=0, ignore_eos=True)

    want = [run(base, ids)["output_ids"] for ids in prompts]
    accs = []
    for ids, w in zip(prompts, want, strict=True):  # one at a time: batch size 1
        got = run(spec, ids)
        assert got["output_ids"] == w
        accs.append(accept_length(got["meta_info"]))
    with cf.ThreadPoolExecutor(8) as pool:  # then batches of several sizes
        got = list(pool.map(lambda ids: run(spec, ids)["output_ids"], prompts))
    assert got == want
    print(f"\nadaptive SUFFIX accept lengths (width <= {WIDTH}): {[round(a, 2) for a in accs]}")
    # The controller really switched widths (the worker logs what it used).
    used, feedback = set(), []
    for line in spec.log_path.read_text().splitlines():
        if "verify widths used in the last" in line:
            widths = line[line.index("{") : line.index("}") + 1]
            used |= {int(w) for w in re.findall(r"(\d+): \d+", widths)}
            feedback.append(re.search(r"feedback: (\d+) steps fed back, (\d+) host", line))
    print(f"verify widths used: {sorted(used)}")
    assert len(used) >= 2, "the adaptive controller never changed the verify width"
    # the controller learns from the host's result processing (on_verify_complete_cpu)
    assert feedback and all(f is not None for f in feedback), feedback
    fed, unmatched = (int(x) for x in feedback[-1].groups())
    assert fed >= 100 and unmatched == 0, (fed, unmatched)
