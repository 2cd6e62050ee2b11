"""``AdaptiveController``: chooses the draft budget ``k`` per step to maximise goodput.

    goodput(bs, k) = sum over the batch of E_r(k) / t(bs, k)

``E_r(k)``: expected accept length (bonus included) of request ``r`` with ``k`` draft
nodes. Chain drafts (``draft_shape="chain"``: model drafts with topk 1, ``k`` = draft
steps) use the acceptance per draft depth of :mod:`.chain`, server-wide. Tree drafts
use the budget shape of :mod:`.acceptance` times the request's level (or one
server-wide level without request ids), with the neighbours of the current ``k``
corrected by paired probe differences (:mod:`.paired`). ``t(bs, k)``: predicted step
time (:mod:`.cost`, analytic prior calibrated on measured step times). Per batch-size
tier choice, hysteresis and probing: :mod:`.policy`. ``k = 0`` is plain decoding
(``E = 1``). Engine agnostic: a host bridge calls :meth:`AdaptiveController.choose_k`
before drafting and :meth:`AdaptiveController.on_verify` after each verify, and may
export :meth:`AdaptiveController.snapshot` to logs or metrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np

from .acceptance import AcceptanceEstimator, LevelTracker
from .chain import ChainAcceptance
from .config import AdaptiveConfig
from .cost import StepCostModel
from .paired import PairedProbes
from .policy import TierPolicy

#: Weight of each measured draft-KV repair in the learned scale on its prior time.
REPAIR_RATE = 0.2

__all__ = ["AdaptiveConfig", "AdaptiveController"]


class AdaptiveController:
    def __init__(self, config: AdaptiveConfig | None = None) -> None:
        self.config = cfg = config or AdaptiveConfig()
        self.ks = np.array(cfg.ks, dtype=np.int64)
        self.acceptance = AcceptanceEstimator(
            [k for k in cfg.ks if k > 0] or [1],
            prior_mean=cfg.prior_accept,
            prior_strength=cfg.prior_strength,
            decay=cfg.decay,
            structure_sd=cfg.structure_sd,
        )
        self.requests = LevelTracker(
            self.acceptance,
            strength=cfg.request_strength,
            decay=cfg.request_decay,
            max_keys=cfg.max_tracked_requests,
        )
        self.server_level = LevelTracker(
            self.acceptance, strength=cfg.level_strength, decay=cfg.level_decay, max_keys=1
        )
        self.cost = StepCostModel(
            cfg.cost_params(),
            calibrate=cfg.calibrate,
            window=cfg.cost_window,
            decay=cfg.cost_decay,
            refit_every=cfg.cost_refit_every,
            prior_weight=cfg.cost_prior_weight,
            verify_widths=cfg.verify_widths,
        )
        self.policy = TierPolicy(
            cfg.ks,
            cfg.tiers,
            margin=cfg.switch_margin,
            patience=cfg.switch_patience,
            confirm=cfg.switch_confirm,
            tie=cfg.tie_tolerance,
            probe_interval=cfg.probe_interval,
            probe_interval_thin=cfg.probe_interval_thin,
            probe_max_loss=cfg.probe_max_loss,
            # chains: every extra step is a draft forward, so near-ties go to fewer steps
            tie_to_larger=cfg.draft_shape != "chain",
            probe_backoff=cfg.probe_backoff,
            probe_budget=cfg.probe_budget,
            probe_budget_thin=cfg.probe_budget_thin,
            probe_budget_upshift=cfg.probe_budget_upshift,
            pinned=cfg.pinned(),
        )
        self.paired = PairedProbes(decay=cfg.decay)
        self.chain = (
            ChainAcceptance(
                max(max(cfg.ks), 1),
                prior_mean=cfg.prior_accept,
                prior_strength=cfg.prior_strength,
                decay=cfg.decay,
            )
            if cfg.draft_shape == "chain"
            else None
        )
        # decayed count of measured step times per (tier, candidate)
        self._timed = np.zeros((len(self.policy.tiers), len(self.ks)))
        self.steps = 0
        self._last: dict[str, object] = {}
        # draft-KV repair (zero steps skip the draft extend; the next drafting step
        # rebuilds it): the prior's seconds for (tokens, requests) and a learned scale on
        # it; None where there is no repair
        self._repair_prior: Callable[[int, int], float] | None = None
        self.repair_scale = 1.0
        self._unwritten = (0, 0)  # (tokens, requests) left by zero steps since drafting

    def _per_request(self, req_ids: Sequence[Hashable] | None) -> bool:
        return req_ids is not None and self.config.per_request and len(req_ids) > 0

    def expected_accept(
        self, batch_size: int, req_ids: Sequence[Hashable] | None = None
    ) -> np.ndarray:
        """Expected committed tokens per step for the whole batch, per candidate k."""
        if self.chain is not None:  # exact per depth: no paired correction needed
            return self.chain.expected_accept_lengths(self.ks) * batch_size
        if self._per_request(req_ids):
            assert req_ids is not None
            per_req = self.requests.expected_accept_lengths(req_ids, self.ks).mean(axis=0)
        else:
            per_req = self.server_level.expected_accept_lengths([_SERVER], self.ks)[0]
        return self._blend_paired(batch_size, per_req) * batch_size

    def _blend_paired(self, batch_size: int, e: np.ndarray) -> np.ndarray:
        """Blend paired probe differences to the current k into the estimates."""
        cur = self.policy.current_k(batch_size)
        if not cur:
            return e
        j_cur = int(np.searchsorted(self.ks, cur))
        out = e.copy()
        for j, k in enumerate(self.ks.tolist()):
            if k == 0 or j == j_cur:
                continue
            d, n = self.paired.difference(cur, k)
            if n > 0:
                w = n / (n + self.config.paired_strength)
                out[j] = (1.0 - w) * e[j] + w * min(max(e[j_cur] + d, 1.0), k + 1.0)
        return np.maximum.accumulate(out)  # nested drafts: never fewer with a larger k

    def predicted_goodput(
        self, batch_size: int, req_ids: Sequence[Hashable] | None = None
    ) -> np.ndarray:
        """Predicted committed tokens per second for each candidate k."""
        return self._predict(batch_size, req_ids)[0]

    def _predict(
        self, batch_size: int, req_ids: Sequence[Hashable] | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(predicted goodput, predicted step time) per candidate k."""
        _check_bs(batch_size)
        step_time = self.cost.predict(batch_size, self.ks)
        return self.expected_accept(batch_size, req_ids) / step_time, step_time

    def choose_k(self, batch_size: int, req_ids: Sequence[Hashable] | None = None) -> int:
        """The number of draft nodes per request to use for the next step."""
        goodput, step_time = self._predict(batch_size, req_ids)
        upshift_s = self.predicted_repair_s()
        acc_ev = self._acceptance_evidence()
        k = self.policy.decide(
            batch_size,
            goodput,
            self._thin(batch_size, acc_ev),
            step_time,
            upshift_s=upshift_s,
            unproven=acc_ev < self.config.probe_min_evidence,
        )
        if self._repair_prior is not None:
            tokens, reqs = self._unwritten
            self._unwritten = (tokens + batch_size, max(reqs, batch_size)) if k == 0 else (0, 0)
        self._last = {
            "batch_size": batch_size,
            "k": k,
            "goodput": dict(zip(self.ks.tolist(), goodput.round(1).tolist(), strict=True)),
        }
        return k

    def _acceptance_evidence(self) -> np.ndarray:
        """Per candidate: decayed acceptance observations behind its estimate."""
        if self.chain is not None:
            return np.array([self.chain.evidence(k) for k in self.ks.tolist()])
        ev = self.acceptance.evidence()
        return np.array(
            [np.inf if k == 0 else ev[self.acceptance.bucket_index(k)] for k in self.ks.tolist()]
        )

    def thin(self, batch_size: int) -> np.ndarray:
        """Per candidate: too few acceptance observations or measured step times."""
        return self._thin(batch_size, self._acceptance_evidence())

    def _thin(self, batch_size: int, acc_ev: np.ndarray) -> np.ndarray:
        timed = self._timed[self.policy.tier_index(batch_size)]
        cfg = self.config
        return (acc_ev < cfg.probe_min_evidence) | (cfg.calibrate & (timed < cfg.probe_min_timed))

    def on_verify(
        self,
        batch_size: int,
        k: int,
        accepted_per_req: Sequence[int],
        step_time_s: float | None = None,
        req_ids: Sequence[Hashable] | None = None,
        accepted_within: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        """Feed one verify result: accepted drafts per request (bonus excluded).

        ``step_time_s``: measured wall time of the whole step (drafting included).
        ``req_ids``: per-request ids (same order) for per-request estimates.
        ``accepted_within``: optional counterfactual counts for smaller budgets of a
        nested tree (see :func:`.acceptance.accepted_within_budgets`).
        """
        _check_bs(batch_size)
        if not (isinstance(k, (int, np.integer)) and k >= 0):
            raise ValueError(f"k={k!r}: expected an integer >= 0")
        self.steps += 1
        acc = np.asarray(accepted_per_req, dtype=np.int64)
        if self.chain is not None:  # the tree estimators below are not read for chains
            self.chain.observe(int(k), acc)
        elif k > 0 and acc.size:
            if self._per_request(req_ids):
                assert req_ids is not None
                if len(req_ids) != len(acc):
                    raise ValueError(
                        f"req_ids has {len(req_ids)} entries, accepted_per_req {len(acc)}"
                    )
                levels = self.requests.levels(req_ids)
                self.requests.observe(int(k), req_ids, acc.tolist())
            else:
                levels = np.full(acc.size, self.server_level.levels([_SERVER])[0])
            self.server_level.observe(int(k), [_SERVER], [float(acc.mean())])
            self.paired.observe(int(k), batch_size, float(acc.mean()))
            self.acceptance.observe(int(k), acc, accepted_within, levels)
        elif self.chain is None:
            self.acceptance.observe(0, acc)  # time passes: decay only
            self.paired.observe(0, batch_size, 0.0)
        if step_time_s is not None:
            self.observe_step_time(batch_size, int(k), float(step_time_s))

    def observe_step_time(self, batch_size: int, k: int, step_time_s: float) -> None:
        """Feed one measured step time on its own (when it arrives apart from the
        step's accepted counts, as with a host that reports them separately)."""
        self.cost.observe(batch_size, int(k), float(step_time_s))
        row = self._timed[self.policy.tier_index(batch_size)]
        row *= self.config.cost_decay
        j = int(np.searchsorted(self.ks, k))
        if j < len(self.ks) and self.ks[j] == k:
            row[j] += 1.0

    def expect_repairs(self, prior: Callable[[int, int], float]) -> None:
        """Zero steps leave draft KV unwritten and the next drafting step rebuilds it
        (the draft-KV repair): probes up from zero steps are priced with that rebuild,
        ``prior(tokens, requests)`` seconds times a scale :meth:`observe_repair` learns.
        The unwritten tokens are what the engine reports before each decision
        (:meth:`note_unwritten`: the server's repair counts them per live request);
        without a report, batch size times zero steps since the last drafting step, an
        overestimate that grows without bound where requests finish in between."""
        self._repair_prior = prior
        self.repair_scale = 1.0

    def note_unwritten(self, tokens: int, requests: int) -> None:
        """The engine's own count of the draft KV a repair would rebuild now (``tokens``
        of ``requests`` live requests): replaces the estimate until the next step."""
        self._unwritten = (max(0, int(tokens)), max(0, int(requests)))

    def predicted_repair_s(self) -> float:
        """Seconds the next drafting step would spend on the repair (0 without one)."""
        return self.predicted_repair_for(*self._unwritten)

    def predicted_repair_for(self, tokens: int, requests: int) -> float:
        """Seconds a repair of ``tokens`` tokens of ``requests`` requests takes."""
        if self._repair_prior is None or tokens <= 0:
            return 0.0
        return self.repair_scale * float(self._repair_prior(tokens, max(1, requests)))

    def observe_repair(self, tokens: int, requests: int, seconds: float) -> None:
        """One measured repair: ``seconds`` spent rebuilding ``tokens`` tokens of
        ``requests`` requests (a repair faster than nothing counts as free)."""
        if self._repair_prior is None or tokens <= 0 or not math.isfinite(seconds):
            return
        prior = float(self._repair_prior(tokens, max(1, requests)))
        if prior > 0:
            ratio = max(0.0, float(seconds)) / prior
            self.repair_scale += REPAIR_RATE * (ratio - self.repair_scale)

    def observe_repair_step(
        self, batch_size: int, k: int, seconds: float, tokens: int, requests: int
    ) -> None:
        """A measured step that also ran a repair: the time beyond the step's predicted
        time is the repair's, and the time beyond the predicted repair the step's."""
        if not math.isfinite(seconds):
            return
        repair_s = self.predicted_repair_for(tokens, requests)
        step_s = float(self.cost.predict(batch_size, [k])[0])
        self.observe_repair(tokens, requests, seconds - step_s)
        if seconds - repair_s > 0:
            self.observe_step_time(batch_size, k, seconds - repair_s)

    def forget_requests(self, req_ids: Sequence[Hashable]) -> None:
        """Drop per-request state of finished requests."""
        self.requests.forget(req_ids)

    def snapshot(self) -> dict[str, object]:
        """A JSON-serialisable view for logs and metrics."""
        common = {"steps": self.steps, "tiers": self.policy.snapshot()}
        tail = {"cost": self.cost.snapshot(), "last_decision": self._last}
        if self.chain is not None:
            depths = range(1, self.chain.max_depth + 1)
            return {
                **common,
                "expected_accept_length": _by_k(
                    self.ks, self.chain.expected_accept_lengths(self.ks)
                ),
                "depth_acceptance": _by_k(depths, self.chain.conditionals(), 4),
                "depth_trials": _by_k(depths, self.chain.trials, 1),
                **tail,
            }
        return {
            **common,
            "expected_accept_length": _by_k(
                self.ks, self.acceptance.expected_accept_lengths(self.ks)
            ),
            "tail_ratio": round(self.acceptance.tail_ratio(), 4),
            "acceptance_evidence": _by_k(self.acceptance.buckets, self.acceptance.evidence(), 1),
            "tracked_requests": len(self.requests),
            "server_level": round(float(self.server_level.levels([_SERVER])[0]), 4),
            "paired_differences": self.paired.snapshot(),
            **tail,
        }


def _by_k(keys: Sequence[int] | np.ndarray, values: np.ndarray, digits: int = 3) -> dict:
    return dict(zip(np.asarray(keys).tolist(), np.round(values, digits).tolist(), strict=True))


_SERVER = "__server__"


def _check_bs(batch_size: int) -> None:
    if not (isinstance(batch_size, (int, np.integer)) and batch_size >= 1):
        raise ValueError(f"batch_size={batch_size!r}: expected an integer >= 1")
