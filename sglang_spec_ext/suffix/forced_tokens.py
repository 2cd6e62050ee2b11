"""Forced strings as the target tokenises them (grammar-aware drafts, ``grammar.py``).

A grammar forces a string; the target may spell it with other tokens than the model's
tokenizer would (constrained decoding picks among the allowed tokens), and a string's last
token may merge with what follows. :class:`ForcedTokenizer` gives the tokens to draft:
how the target committed the same string before (learned, :class:`PendingForced` keeps
what to learn from), else the tokenizer's encoding without the tail a continuation could
re-merge, else the longest vocabulary pieces. Engine-agnostic.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

#: What a forced string's encoding is checked against (its tokens that any of these
#: continuations would re-merge are not drafted): a letter, a digit, a quote, a space, a
#: newline.
STABLE_PROBES = ("a", "0", '"', " ", "\n")


class ForcedTokenizer:
    """Token ids for a forced string: how the target committed that string before, else
    ``encode`` (the model's tokenizer), else the longest vocabulary pieces. Bounded LRU."""

    def __init__(
        self,
        vocab: Sequence[bytes] | None = None,
        encode: Callable[[str], list[int]] | None = None,
        bound: int = 4096,
    ) -> None:
        self.vocab = vocab
        self.encode = encode
        self.bound = bound
        self._learned: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._encoded: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._by_piece: dict[bytes, int] | None = None
        self._max_piece = 0

    def __len__(self) -> int:
        return len(self._learned)

    def piece(self, token: int) -> str | None:
        """What ``token`` spells (None: no vocabulary, or not a whole UTF-8 string)."""
        if self.vocab is None or not 0 <= token < len(self.vocab):
            return None
        try:
            return bytes(self.vocab[token]).decode("utf-8")
        except UnicodeDecodeError:
            return None

    def learned(self, s: str) -> tuple[int, ...] | None:
        hit = self._learned.get(s)
        if hit is not None:
            self._learned.move_to_end(s)
        return hit

    def tokens(self, s: str) -> list[int]:
        hit = self.learned(s)
        if hit is not None:
            return list(hit)
        if self.encode is not None:
            try:
                return self._stable(s)
            except Exception:  # noqa: BLE001 - fall through to the vocabulary
                pass
        return self._longest_match(s)

    def _stable(self, s: str) -> list[int]:
        """The tokens of ``s`` that whatever follows cannot re-merge: the common prefix of
        ``s``'s encoding and those of ``s`` followed by a few probe strings (a forced
        ``'\\n    '`` alone encodes otherwise than before a ``'"'``, a trailing ``' '``
        merges with the value after it). Cached, bounded like the learned strings."""
        hit = self._encoded.get(s)
        if hit is not None:
            self._encoded.move_to_end(s)
            return list(hit)
        assert self.encode is not None
        base = list(self.encode(s))
        keep = len(base)
        for probe in STABLE_PROBES:
            other = self.encode(s + probe)
            n = 0
            while n < min(keep, len(other)) and other[n] == base[n]:
                n += 1
            keep = n
        out = tuple(base[:keep])
        self._encoded[s] = out
        while len(self._encoded) > self.bound:
            self._encoded.popitem(last=False)
        return list(out)

    def learn(self, s: str, committed: Sequence[int]) -> bool:
        """Record the tokens the target committed for ``s`` when the decoded pieces of a
        prefix of ``committed`` spell exactly ``s`` (a token straddling its end says
        nothing certain and is not recorded)."""
        if not s or self.vocab is None:
            return False
        want, got, out = s.encode(), b"", []
        for tok in committed:
            if not 0 <= tok < len(self.vocab):
                return False
            got += bytes(self.vocab[tok])
            out.append(int(tok))
            if len(got) >= len(want):
                break
        if got != want:
            return False
        self._learned[s] = tuple(out)
        self._learned.move_to_end(s)
        while len(self._learned) > self.bound:
            self._learned.popitem(last=False)
        return True

    def _longest_match(self, s: str) -> list[int]:
        if self.vocab is None:
            return []
        if self._by_piece is None:
            self._by_piece = {}
            for i, piece in enumerate(self.vocab):
                b = bytes(piece)
                if b and b not in self._by_piece:
                    self._by_piece[b] = i
            self._max_piece = max((len(b) for b in self._by_piece), default=0)
        data, out, i = s.encode(), [], 0
        while i < len(data):
            for n in range(min(self._max_piece, len(data) - i), 0, -1):
                tok = self._by_piece.get(data[i : i + n])
                if tok is not None:
                    out.append(tok)
                    i += n
                    break
            else:
                return out  # no piece spells what follows: draft what we have
        return out


#: Requests whose last forced string is remembered for learning (oldest dropped first).
PENDING_BOUND = 4096


class PendingForced:
    """Per request, the forced string drafted at its committed state last step, to learn
    from what it commits next how the target tokenises that string
    (:meth:`ForcedTokenizer.learn`). Bounded, oldest request dropped first."""

    def __init__(self, bound: int = PENDING_BOUND) -> None:
        self.bound = bound
        self._by_rid: OrderedDict[Any, tuple[int, str]] = OrderedDict()

    def __contains__(self, rid: Any) -> bool:
        return rid in self._by_rid

    def __getitem__(self, rid: Any) -> tuple[int, str]:
        return self._by_rid[rid]

    def remember(self, rid: Any, committed: int, forced: str) -> None:
        """``forced`` was the forced string after ``committed`` tokens of ``rid``."""
        if not forced:
            self._by_rid.pop(rid, None)
            return
        self._by_rid[rid] = (committed, forced)
        self._by_rid.move_to_end(rid)
        while len(self._by_rid) > self.bound:
            self._by_rid.popitem(last=False)

    def learn(
        self, rid: Any, tokenizer: ForcedTokenizer, tail: Callable[[int], Sequence[int]]
    ) -> None:
        """``tail(start)``: ``rid``'s committed tokens from position ``start``."""
        pending = self._by_rid.pop(rid, None)
        if pending is None:
            return
        start, forced = pending
        committed = list(tail(start))
        if committed:
            tokenizer.learn(forced, committed)

    def forget(self, rid: Any) -> None:
        self._by_rid.pop(rid, None)
