"""The overlap relay can hand a request the tokens of a step the scheduler has already
processed (another batch ran between that request's steps: someone's prefill); the SUFFIX
worker's sessions must then not count them twice (``DrafterSessionsMixin._unrelayed``)."""

from __future__ import annotations

from types import SimpleNamespace

from sglang_spec_ext.sglang.workers.suffix_sessions import DrafterSessionsMixin, Session


class _Sessions(DrafterSessionsMixin):
    def __init__(self) -> None:  # only what _unrelayed reads
        self._sessions = {}


def _req(out: list[int]) -> SimpleNamespace:
    return SimpleNamespace(rid="r", output_ids=out)


def test_relayed_tokens_already_in_the_output_are_dropped() -> None:
    s = _Sessions()
    # first decode step after the prefill: the relay holds the prefill's token
    assert s._unrelayed(_req([]), [7]) == [7]  # output lags: new
    assert s._unrelayed(_req([7]), [7]) == []  # the prefill's result was processed already
    s._sessions["r"] = Session(synced=3)
    assert s._unrelayed(_req([1, 2, 3]), [4, 5]) == [4, 5]  # lagging by one step: new
    assert s._unrelayed(_req([1, 2, 3, 4, 5]), [4, 5]) == []  # that step was processed
    # the same length but other tokens: not a repeat (a restarted request, say)
    assert s._unrelayed(_req([1, 2, 3, 9, 5]), [4, 5]) == [4, 5]
    assert s._unrelayed(_req([1, 2, 3]), []) == []
    assert s._relay_repeats == 2
