"""Per batch-size tier choice of the draft budget ``k`` with hysteresis and probing.

The caller supplies, for the current batch, the predicted goodput of every candidate
``k`` (committed tokens per second) and whether each prediction is still thin.
Each tier (the largest configured tier ``<= batch size``) keeps its own current ``k``:

* **hysteresis**: the tier moves to another candidate only after it has been the
  predicted best for ``confirm`` consecutive decisions with a relative gain above
  ``margin``, or for ``patience`` consecutive decisions with any gain; so noise in the
  predictions (the best candidate changing from step to step) never moves it.
  Candidates within ``tie`` (relative) of the best count as tied and the largest of
  them is "the best": with nested drafts a wider draft never accepts less, so where
  the extra width is (nearly) free, as at batch size 1, the wider one is the bet;
* **probing**: every ``probe_interval`` decisions the tier spends one step on a
  neighbouring candidate (alternately the next larger and the next smaller one) so
  acceptance and step time at widths it is not using stay known; the probe is skipped
  when the neighbour is predicted to lose more than ``probe_max_loss`` of the current
  goodput. A neighbour whose prediction is *thin* (the caller decides: too few
  acceptance observations or measured step times) is probed every
  ``probe_interval_thin`` decisions, whatever its prediction, until it is not.
  The cost is bounded: ``probe_max_loss / probe_interval`` of goodput for well-known
  widths, and while a neighbour is thin one step in ``probe_interval_thin``, which
  lasts only until the caller's thresholds are met (a handful of probes);
* **pinned tiers**: a tier given a fixed ``k`` (``pinned``) always gets it: no
  hysteresis, no probes;
* **exploration budget**: where a probe is dear (a CPU, where one draft step costs as
  much as the target forward, so a probe can take three plain steps), the intervals
  stretch so that probes lose at most ``probe_budget`` of the tier's time
  (``probe_budget_thin`` while a neighbour is thin): a probe predicted to lose ``L``
  current steps' worth of tokens (``(1 - goodput ratio) x step time ratio``, from the
  caller's predicted step times when given) waits at least ``L / budget`` decisions.
  On a GPU, where verifying a few more tokens is nearly free, ``L`` is small and the
  intervals above decide;
* **leaving zero steps with a rebuild** (``upshift_s``: the draft-KV repair, which the
  first drafting step after zero steps pays for every token committed meanwhile): a
  probe up from zero steps is charged the rebuild and kept within ``probe_budget_upshift``
  of the tier's time (a rebuild costs a few plain steps however short the probe), and
  the tier leaves zero steps only for a candidate whose acceptance rests on evidence
  (``unproven``: the caller's per-candidate flag), never on the prior alone: once the
  acceptance memory has faded, one probe refreshes it, where a switch on the prior would
  run the wider draft for as long as hysteresis takes to come back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class TierState:
    current: int | None = None  # index into candidates
    pending: int | None = None
    pending_count: int = 0
    since_probe: int = 0
    probe_up: bool = True
    decisions: int = 0
    switches: int = 0
    probes: int = 0
    probes_since_switch: int = 0


class TierPolicy:
    def __init__(
        self,
        candidates: Sequence[int],
        tiers: Sequence[int],
        *,
        margin: float = 0.03,
        patience: int = 16,
        confirm: int = 3,
        tie: float = 0.01,
        probe_interval: int = 32,
        probe_interval_thin: int = 8,
        probe_max_loss: float = 0.15,
        tie_to_larger: bool = True,
        probe_backoff: int = 0,
        probe_budget: float = 1.0,
        probe_budget_thin: float = 1.0,
        probe_budget_upshift: float = 1.0,
        pinned: dict[int, int] | None = None,
    ) -> None:
        self.candidates = np.array(sorted(set(int(k) for k in candidates)), dtype=np.int64)
        self.tiers = np.array(sorted(set(int(t) for t in tiers)), dtype=np.int64)
        self.margin = margin
        self.patience = patience
        self.confirm = max(1, min(confirm, patience))
        self.tie = tie
        self.probe_interval = probe_interval
        self.probe_interval_thin = max(1, min(probe_interval_thin, probe_interval or 1))
        self.probe_max_loss = probe_max_loss
        self.tie_to_larger = tie_to_larger
        self.probe_backoff = probe_backoff
        self.probe_budget = probe_budget
        self.probe_budget_thin = probe_budget_thin
        self.probe_budget_upshift = probe_budget_upshift
        self.states = [TierState() for _ in self.tiers]
        pinned = pinned or {}
        if any(k not in self.candidates for k in pinned.values()):
            raise ValueError(f"pinned={pinned!r}: every k must be a candidate")
        # index into candidates per tier index, None = chosen
        self.pinned = [
            None if int(t) not in pinned else int(np.searchsorted(self.candidates, pinned[int(t)]))
            for t in self.tiers
        ]

    def tier_index(self, batch_size: int) -> int:
        return max(0, int(np.searchsorted(self.tiers, batch_size, side="right")) - 1)

    def current_k(self, batch_size: int) -> int | None:
        cur = self.states[self.tier_index(batch_size)].current
        return None if cur is None else int(self.candidates[cur])

    def decide(
        self,
        batch_size: int,
        goodput: np.ndarray,
        thin: np.ndarray,
        step_time: np.ndarray | None = None,
        upshift_s: float = 0.0,
        unproven: np.ndarray | None = None,
    ) -> int:
        """The ``k`` to use for this step.

        ``goodput``: predicted goodput per candidate; ``thin``: per candidate, whether
        its prediction still rests on too few observations (always worth a probe);
        ``step_time``: predicted step time per candidate (prices probes; without it a
        probe step is taken to last as long as a current one); ``upshift_s``: seconds
        the first step with ``k > 0`` pays on top after zero steps (the draft-KV
        repair), charged to probes up from zero (needs ``step_time``); ``unproven``:
        per candidate, whether its acceptance still rests on the prior (no leaving zero
        steps for it while ``upshift_s`` is due).
        """
        ti = self.tier_index(batch_size)
        st = self.states[ti]
        st.decisions += 1
        pin = self.pinned[ti]
        if pin is not None:
            st.current = pin
            return int(self.candidates[pin])
        best = self._best(goodput)
        if st.current is None:
            st.current = best
        cur = st.current
        if unproven is not None and self._dear_rebuild(cur, step_time, upshift_s):
            # only candidates with evidence: a probe (budgeted below) proves the others
            allowed = ~np.asarray(unproven, dtype=bool)
            allowed[cur] = True
            best = self._best(np.where(allowed, goodput, -np.inf))
        gain = goodput[best] / max(float(goodput[cur]), 1e-12) - 1.0
        if best != cur and gain > -self.tie:
            if st.pending != best:
                st.pending, st.pending_count = best, 0
            st.pending_count += 1
            big = gain > self.margin
            if (big and st.pending_count >= self.confirm) or st.pending_count >= self.patience:
                self._switch(st, best)
        else:
            st.pending, st.pending_count = None, 0
        probe = self._probe(st, goodput, thin, step_time, upshift_s)
        return int(self.candidates[st.current if probe is None else probe])

    def _best(self, goodput: np.ndarray) -> int:
        """The predicted best candidate; ties (within ``tie``) go to the largest k (with
        nested drafts a wider one never accepts less, so a negligible predicted
        difference favours it) unless ``tie_to_larger`` is off."""
        top = float(np.max(goodput))
        tied = np.flatnonzero(goodput >= top * (1.0 - self.tie))
        return int(tied[-1] if self.tie_to_larger else tied[0])

    @staticmethod
    def _switch(st: TierState, to: int) -> None:
        st.current = to
        st.pending, st.pending_count = None, 0
        st.switches += 1
        st.probes_since_switch = 0

    def _backoff(self, st: TierState) -> int:
        """Probe-interval multiplier: doubles every ``probe_backoff`` probes without a
        switch (up to 8x), so a tier that has settled spends less on exploration."""
        if self.probe_backoff <= 0:
            return 1
        return 1 << min(3, st.probes_since_switch // self.probe_backoff)

    def _dear_rebuild(self, cur: int, step_time: np.ndarray | None, upshift_s: float) -> bool:
        """Whether leaving ``cur`` rebuilds skipped draft KV that costs more than a step."""
        return (
            step_time is not None
            and self.candidates[cur] == 0
            and upshift_s > float(step_time[cur])
        )

    def _probe_loss(
        self,
        cur: int,
        nb: int,
        goodput: np.ndarray,
        step_time: np.ndarray | None,
        upshift_s: float = 0.0,
    ) -> float:
        """Predicted tokens a probe of ``nb`` loses, in current steps' worth."""
        ratio = float(goodput[nb]) / max(float(goodput[cur]), 1e-12)
        duration = 1.0 if step_time is None else float(step_time[nb] / step_time[cur])
        loss = max(0.0, 1.0 - ratio) * duration
        if (
            upshift_s > 0
            and step_time is not None
            and self.candidates[cur] == 0 < self.candidates[nb]
        ):
            loss += upshift_s / float(step_time[cur])  # plus the rebuild, in current steps
        return loss

    def _probe(
        self,
        st: TierState,
        goodput: np.ndarray,
        thin: np.ndarray,
        step_time: np.ndarray | None = None,
        upshift_s: float = 0.0,
    ) -> int | None:
        if self.probe_interval <= 0:
            return None
        st.since_probe += 1
        cur = st.current
        assert cur is not None
        nbs = [nb for nb in (cur + 1, cur - 1) if 0 <= nb < len(self.candidates)]
        if not st.probe_up:
            nbs.reverse()
        thin_nbs = [nb for nb in nbs if thin[nb]]
        scale = self._backoff(st)

        def due(nb: int, interval: int, budget: float) -> bool:
            loss = self._probe_loss(cur, nb, goodput, step_time, upshift_s)
            if nb > cur and self._dear_rebuild(cur, step_time, upshift_s):
                # what the prediction says the wider draft would win pays for finding
                # out: a probe waits until that gain over the wait covers its cost
                gain = float(goodput[nb]) / max(float(goodput[cur]), 1e-12) - 1.0
                budget = max(min(budget, self.probe_budget_upshift), gain)
            wait = max(interval * scale, loss / budget)
            return st.since_probe >= wait

        if thin_nbs and due(thin_nbs[0], self.probe_interval_thin, self.probe_budget_thin):
            pick: int | None = thin_nbs[0]
        elif nbs and due(nbs[0], self.probe_interval, self.probe_budget):
            nb = nbs[0]
            pick = nb if goodput[nb] >= (1.0 - self.probe_max_loss) * goodput[cur] else None
        else:
            return None
        st.since_probe = 0
        st.probe_up = not st.probe_up
        if pick is not None:
            st.probes += 1
            st.probes_since_switch += 1
        return pick

    def snapshot(self) -> list[dict[str, int | None]]:
        return [
            {
                "tier": int(t),
                "k": None if s.current is None else int(self.candidates[s.current]),
                "decisions": s.decisions,
                "switches": s.switches,
                "probes": s.probes,
            }
            for t, s in zip(self.tiers, self.states, strict=True)
        ]
