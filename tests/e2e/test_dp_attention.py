"""DP attention on the CPU engine: two attention-DP ranks (``--tp-size 2 --dp-size 2
--enable-dp-attention``, gloo) serving the tiny DeepSeek-V3 (MLA + MoE, the family DP
attention is built for), against one plain server of the same checkpoint.

The host's CPU path pads each rank's batch for the gathered MLP through
``get_cpu_graph_seq_len_fill_value()``, which only its AMX backend defines: without
``sglang/cpu/dp_attention.py`` the first batch dies with an ``AttributeError``. SUFFIX
and HYBRID refuse DP attention at start-up (``tests/host/test_server_args.py``); this is
the plain deployment they would join (docs/distributed.md says what is missing).
"""

from __future__ import annotations

import concurrent.futures as cf

from sglang_spec_ext.models.testing.families import build_tiny_deepseek_v3
from tests.e2e.test_model_families import PROMPTS, family_env
from tests.harness.server import ServerConfig

NEW_TOKENS = 24
DP_ARGS = ("--tp-size", "2", "--dp-size", "2", "--enable-dp-attention")
#: One core per rank: the host's CPU engine otherwise wants a NUMA node per rank.
DP_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}


def test_dp_attention_serves_plain_output(tmp_path_factory, start_server):
    from transformers import AutoTokenizer

    model = build_tiny_deepseek_v3(tmp_path_factory.mktemp("ds-dp") / "m")
    servers = start_server.start_all({
        "plain": ServerConfig(model, (), family_env("deepseek_v3")),
        "dp2": ServerConfig(model, DP_ARGS, family_env("deepseek_v3", DP_ENV)),
    })  # fmt: skip
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]

    def greedy(name: str, ids: list[int]) -> list[int]:
        out = servers[name].generate(input_ids=ids, max_new_tokens=NEW_TOKENS, temperature=0,
                                     ignore_eos=True)  # fmt: skip
        return out["output_ids"]

    expected = [greedy("plain", ids) for ids in prompts]
    assert [greedy("dp2", ids) for ids in prompts] == expected  # one at a time
    with cf.ThreadPoolExecutor(len(prompts)) as pool:  # together: both ranks busy
        together = list(pool.map(lambda ids: greedy("dp2", ids), prompts))
    assert together == expected
    log = servers["dp2"].log_path.read_text(errors="replace")
    assert "DP attention is enabled" in log, servers["dp2"].log_tail()
    assert "DP1" in log, "the second attention-DP rank never logged"
