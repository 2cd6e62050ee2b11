"""The goodput controller as the host's adaptive policy (sglang/model_drafts/adaptive.py,
step_policy.py, step_prior.py), driven through SGLang's real
``adaptive_runtime_state.AdaptiveController`` and its real ``AdaptiveSpeculativeParams``
(the EMA policy). The worker is a stand-in: the real EAGLEWorkerV2 builds its runtime
states from model runners and attention backends that need a GPU here; the stand-in
records what the host's controller asks of it (the e2e test
tests/e2e/test_model_draft_adaptive_serving.py runs the real worker on CPU)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from sglang.srt.speculative.adaptive_runtime_state import (
    AdaptiveController as HostAdaptiveController,
)
from sglang.srt.speculative.adaptive_runtime_state import SpecRuntimeState
from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

from sglang_spec_ext.adaptive import AdaptiveConfig, AdaptiveController
from sglang_spec_ext.adaptive.chain import ChainAcceptance
from sglang_spec_ext.adaptive.config import CHAIN_DEFAULTS
from sglang_spec_ext.sglang.model_drafts import adaptive as mda
from sglang_spec_ext.sglang.model_drafts import step_policy, step_prior


class StandInWorker:
    """What the host's AdaptiveController needs of a worker (GPU-only in reality)."""

    def __init__(self, steps: int = 3, topk: int = 1) -> None:
        self.speculative_num_steps = steps
        self.speculative_num_draft_tokens = steps + 1
        self.topk = topk
        self.adaptive_controller = None
        self.built: list[tuple[int, int]] = []

    def build_adaptive_runtime_state(
        self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None
    ):
        self.built.append((speculative_num_steps, speculative_num_draft_tokens))
        return _state(speculative_num_steps)

    def apply_runtime_state(self, state: SpecRuntimeState) -> None:
        self.speculative_num_steps = state.speculative_num_steps
        self.speculative_num_draft_tokens = state.speculative_num_draft_tokens


def _state(steps: int) -> SpecRuntimeState:
    return SpecRuntimeState(steps, steps + 1, None, None, object(), None, None, None)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _policy(max_steps=3, clock=None, **cfg):
    config = AdaptiveConfig(
        candidate_ks=tuple(range(max_steps + 1)), max_k=max_steps, cost_preset="llama3-8b-h100-eagle3",
        **{**CHAIN_DEFAULTS, **cfg},
    )  # fmt: skip
    return step_policy.GoodputStepPolicy(AdaptiveController(config), clock=clock or Clock())


def _wired(policy, steps=3):
    worker = StandInWorker(steps)
    host = HostAdaptiveController(worker, policy)
    host.register(_state(steps))
    host.init_states(cuda_graph_bs=None)
    return worker, host


def test_host_controller_builds_one_state_per_step_count_and_switches_by_our_choice():
    policy = _policy()
    worker, host = _wired(policy)
    assert policy.candidate_steps == [0, 1, 2, 3]
    assert sorted(worker.built) == [(0, 1), (1, 2), (2, 3)]  # 3 was registered at start-up
    host.activate_step_by_batch(1)
    assert worker.speculative_num_steps == policy._pending[-1][1]


def test_drafts_always_accepted_drive_bs1_to_the_most_steps_and_rejected_to_zero():
    for accept_all, want in ((True, 3), (False, 0)):
        policy = _policy()
        worker, host = _wired(policy)
        for _ in range(400):
            host.activate_step_by_batch(1)
            k = worker.speculative_num_steps
            host.on_verify_complete([k if accept_all else 0], batch_size=1)
        tier = policy.controller.snapshot()["tiers"][0]
        assert tier["k"] == want, (accept_all, tier)


def test_reports_are_matched_to_decisions_in_order_under_overlap():
    """Overlap scheduling: the next step is chosen before the last one's report."""
    clock = Clock()
    policy = _policy(clock=clock)
    seen = []
    real = policy.controller.on_verify
    policy.controller.on_verify = lambda bs, k, acc, *a, **kw: (
        seen.append((bs, k, list(acc))),
        real(bs, k, acc),
    )
    k1 = policy.get_steps_for_batch(2)
    k2 = policy.get_steps_for_batch(2)
    policy.on_verify_complete([1, 0], 2)
    policy.on_verify_complete([0, 0], 2)
    assert seen == [(2, k1, [1, 0]), (2, k2, [0, 0])]
    policy.on_verify_complete([5], 1)  # a stray report: nothing pending, ignored
    assert len(seen) == 2


def test_step_time_is_the_gap_between_decode_steps_of_one_batch_size():
    clock = Clock()
    policy = _policy(clock=clock)
    times = []
    policy.controller.observe_step_time = lambda bs, k, dt: times.append((bs, k, dt))
    k = policy.get_steps_for_batch(4)
    clock.t = 0.010
    policy.get_steps_for_batch(4)
    assert times == [(4, k, pytest.approx(0.010))]
    clock.t = 0.015
    policy.get_steps_for_batch(3)  # the batch size changed: not a step time
    policy.note_prefill()  # a prefill in between: not a step time either
    clock.t = 0.050
    policy.get_steps_for_batch(3)
    assert len(times) == 1


def test_the_chosen_steps_are_logged_per_batch_size_tier(caplog):
    clock = Clock()
    policy = step_policy.GoodputStepPolicy(_policy().controller, clock=clock, log_interval_s=1.0)
    with caplog.at_level("INFO", logger="sglang_spec_ext"):
        for bs in (1, 1, 5, 70):
            policy.get_steps_for_batch(bs)
        clock.t = 2.0
        policy.get_steps_for_batch(1)
    (line,) = [
        r.getMessage() for r in caplog.records if step_policy.STEPS_LOG_MARK in r.getMessage()
    ]
    counts = eval(line.split(step_policy.STEPS_LOG_MARK, 1)[1])  # noqa: S307 - our own dict literal
    assert set(counts) == {1, 4, 64} and sum(counts[1].values()) == 3


def test_attach_refuses_two_controllers(monkeypatch):
    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE", "1")
    worker = StandInWorker()
    worker.adaptive_controller = object()  # the host's --speculative-adaptive built one
    with pytest.raises(mda.AdaptiveStepsError, match="--speculative-adaptive are both set"):
        mda.attach(worker)
    monkeypatch.delenv("SGLANG_SPEC_EXT_ADAPTIVE")
    assert mda.attach(StandInWorker()) is None  # switched off: the worker is left alone


def test_tree_drafts_build_each_step_count_at_its_own_verify_width(monkeypatch):
    assert mda.tree_verify_widths(3, 2, 8) == (1, 3, 7, 8)  # 2 at depth 1, 4 per step more
    assert mda.tree_verify_widths(4, 4, 10) == (1, 5, 10, 10, 10)
    assert mda.tree_verify_widths(3, 2, 3) == (1, 3, 3, 4)  # never below steps + 1
    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE", "1")
    worker = StandInWorker(steps=3, topk=2)
    worker.speculative_num_draft_tokens = 8
    policy = mda.attach(worker)
    assert policy.controller.config.verify_widths == (1, 3, 7, 8)
    worker.adaptive_controller.register(_state(3))
    worker.adaptive_controller.init_states(cuda_graph_bs=None)
    assert sorted(worker.built) == [(0, 1), (1, 3), (2, 7)]  # not the host's steps + 1
    # the cost model charges the tree's verify width: 7 tokens per request at 2 steps
    cost = policy.controller.cost
    assert cost.predict(64, [2])[0] > cost.predict(64, [1])[0]
    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE_POLICY", "host-ema")
    with pytest.raises(mda.AdaptiveStepsError, match="topk 1"):
        mda.attach(StandInWorker(steps=3, topk=2))


def test_attach_gives_the_host_controller_our_policy_or_the_host_ema(monkeypatch):
    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE", "1")
    worker = StandInWorker(steps=2)
    policy = mda.attach(worker)
    assert isinstance(policy, step_policy.GoodputStepPolicy)
    assert isinstance(worker.adaptive_controller, HostAdaptiveController)
    assert policy.candidate_steps == [0, 1, 2]
    assert policy.controller.config.draft_shape == "chain"
    assert policy.controller.config.cost_zero_step_draft == 1.0  # host default: warm draft KV
    monkeypatch.setenv(step_prior.SKIP_ZERO_STEP_ENV, "1")
    assert mda.attach(StandInWorker(steps=2)).controller.config.cost_zero_step_draft == 0.0
    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE_POLICY", "host-ema")
    worker = StandInWorker(steps=2)
    ema = mda.attach(worker)
    assert isinstance(ema, AdaptiveSpeculativeParams)
    assert max(ema.candidate_steps) <= 2  # the host's 3/5/7 are beyond the buffers


def test_chain_acceptance_counts_trials_and_successes_per_depth():
    chain = ChainAcceptance(3, prior_mean=0.5, prior_strength=1e-9, decay=1.0)
    chain.observe(3, [0, 1, 3, 2])
    # depth 1: 4 trials, 3 accepted; depth 2: 3 trials (a >= 1), 2 accepted; depth 3: 2, 1
    np.testing.assert_allclose(chain.trials, [4, 3, 2])
    np.testing.assert_allclose(chain.successes, [3, 2, 1])
    a = np.array([3 / 4, 2 / 3, 1 / 2])
    want = 1 + np.concatenate([[0], np.cumsum(np.cumprod(a))])
    np.testing.assert_allclose(chain.expected_accept_lengths([0, 1, 2, 3, 9]), [*want, want[-1]])
    assert chain.evidence(0) == float("inf") and chain.evidence(2) == pytest.approx(3)
    chain.observe(1, [1, 1])  # a 1-step chain says nothing about depth 2
    np.testing.assert_allclose(chain.trials, [6, 3, 2])


def test_cost_prior_takes_the_served_model_sizes_unless_the_user_set_constants(monkeypatch):
    from sglang_spec_ext.adaptive.prior import CPU_DEVICE, ModelSizes

    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE", "1")
    sizes = ModelSizes("cpu", 1.35e8, 5.4e8, 92160.0, 1.0e8, 4.0e8, 67584.0)
    params = step_prior.controller_config("standalone", 3, None, sizes).cost_params()
    assert params.weight_bytes == 5.4e8 and params.draft_weight_bytes == 4.0e8
    assert params.flops_per_token == 2.7e8 and params.fixed_s == CPU_DEVICE["fixed_s"]
    monkeypatch.setenv(step_prior.SKIP_ZERO_STEP_ENV, "1")  # zero steps = plain decoding
    fresh = AdaptiveController(step_prior.controller_config("standalone", 3, None, sizes))
    assert fresh.choose_k(1) == 0  # a draft step costs 1.7 plain steps there: not worth it
    monkeypatch.delenv(step_prior.SKIP_ZERO_STEP_ENV)
    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE_COST_WEIGHT_BYTES", "1e9")
    params = step_prior.controller_config("standalone", 3, None, sizes).cost_params()
    assert params.weight_bytes == 1e9 and params.draft_weight_bytes == 2.47e9  # preset kept
    # a worker whose runners are not where the host keeps them: the preset, no failure
    assert step_prior.model_sizes(StandInWorker()) is None


def test_pinned_tiers_drive_the_host_controller(monkeypatch):
    """SGLANG_SPEC_EXT_ADAPTIVE_PINNED_KS through attach and the host's controller:
    batch 1 always runs 3 steps, batch 2+ zero, whatever the verify reports say."""
    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE", "1")
    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE_TIERS", "1,2")
    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE_PINNED_KS", "3,0")
    worker = StandInWorker(steps=3)
    policy = mda.attach(worker)
    host = worker.adaptive_controller
    host.register(_state(3))  # what the host's init_cuda_graphs does after our hook
    host.init_states(cuda_graph_bs=None)
    for bs, want, accepted in ((1, 3, 0), (2, 0, 0), (5, 0, 0), (1, 3, 3)):
        for _ in range(50):
            host.activate_step_by_batch(bs)
            assert worker.speculative_num_steps == want
            host.on_verify_complete([accepted] * bs, batch_size=bs)
    assert policy.controller.config.pinned() == {1: 3, 2: 0}
    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE_PINNED_KS", "4,0")  # above the server's 3
    with pytest.raises(ValueError, match="pinned_ks"):
        mda.attach(StandInWorker(steps=3))


def _mtp_stand_in(target_config, draft_architectures, algorithm="EAGLE"):
    """A worker whose runners carry the model configs the host gives them (the draft
    runner's names the class the host loaded: ``MiMoMTP`` for NEXTN on MiMo, as
    tests/host/test_mtp_model.py pins)."""
    from types import SimpleNamespace

    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    def runner(hf_config):
        return SimpleNamespace(model_config=SimpleNamespace(hf_config=hf_config))

    draft = SimpleNamespace(architectures=list(draft_architectures))
    return SimpleNamespace(
        speculative_algorithm=SpeculativeAlgorithm.from_string(algorithm),
        _target_worker=SimpleNamespace(model_runner=runner(target_config)),
        _draft_worker=SimpleNamespace(draft_runner=runner(draft)),
    )


def test_an_mtp_draft_is_its_own_kind_with_the_mtp_prior(tmp_path, monkeypatch):
    """NEXTN (resolved to EAGLE) on a target with MTP layers: the draft runner runs the
    host's MTP class for the target, so the controller's prior is the MTP layer's
    preset (full-vocabulary head), not the EAGLE-3 head's; an EAGLE head on the same
    target, or a target without MTP layers, stays ``eagle``."""
    from sglang.srt.utils.hf_transformers_utils import get_config

    from sglang_spec_ext.models.testing.llama import build_tiny_llama
    from sglang_spec_ext.models.testing.mtp import build_tiny_mimo_mtp

    mimo = get_config(str(build_tiny_mimo_mtp(tmp_path / "mimo", seed=0)), trust_remote_code=False)
    llama = get_config(str(build_tiny_llama(tmp_path / "llama", seed=0)), trust_remote_code=False)
    assert step_prior.worker_kind(_mtp_stand_in(mimo, ["MiMoMTP"])) == "mtp"
    assert step_prior.worker_kind(_mtp_stand_in(mimo, ["LlamaForCausalLMEagle"])) == "eagle"
    assert step_prior.worker_kind(_mtp_stand_in(llama, ["LlamaForCausalLM"])) == "eagle"
    assert step_prior.worker_kind(_mtp_stand_in(mimo, ["MiMoMTP"], "EAGLE3")) == "eagle3"
    assert step_prior.worker_kind(StandInWorker()) == "eagle"  # no runners: as before
    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE", "1")
    cfg = step_prior.controller_config("mtp", 3)
    assert cfg.cost_preset == "llama3-8b-h100-mtp"
    assert cfg.cost_params().draft_weight_bytes == pytest.approx(1.554e9)


def test_ragged_verify_prior_is_the_served_targets_roofline():
    """SUFFIX's ragged gate prices steps before its fit by the target's roofline: sized
    from a model runner as the host keeps it (parameters, KV geometry, device)."""
    import torch

    from sglang_spec_ext.adaptive.prior import CPU_DEVICE

    class Config:
        num_attention_layers, head_dim = 30, 64

        def get_num_kv_heads(self, tp_size):
            return 3 // tp_size

    runner = SimpleNamespace(model=torch.nn.Linear(576, 1000), model_config=Config(),
                             tp_size=1, kv_cache_dtype=torch.float32, device="cpu")  # fmt: skip
    params = step_prior.served_roofline(runner)
    assert params.weight_bytes == 577_000 * 4 and params.flops_per_token == 2 * 577_000
    assert params.kv_bytes_per_token == 30 * 3 * 64 * 2 * 4
    assert params.fixed_s == CPU_DEVICE["fixed_s"] and params.draft_weight_bytes == 0
    assert step_prior.served_roofline(None) is None
    assert step_prior.served_roofline(SimpleNamespace(model=None)) is None  # warns, no failure
