"""What the HTTP front derived from exact bytes it met before, kept for when the same bytes come again.

Clients repeat themselves: the same request head (a URL, the same headers, the same Content-Length) and the same
inference JSON header before tensors of the same size; Triton answers them with the same answer head. llhttp's parse
of a head, from the start of a message, is a function of its bytes alone, and the checks on a JSON header are a
function of its bytes and the served model: what was derived from them once holds for the same bytes again, and a key
differing in one byte is a miss (the bytes are parsed and checked afresh). Nothing that depends on the moment (the
connection cap, a drain, the bytes buffered) is remembered.
"""

from __future__ import annotations

from typing import TypeVar

Value = TypeVar("Value")


class Remembered(dict[bytes, Value]):
    """At most `entries` keys of at most `key_bytes` bytes each, looked up as a dict (`get`, in C: a miss costs the
    hot path no Python call). Full, it forgets everything at once: a client sending ever-new bytes costs itself the
    slow path, never the front its memory (`entries` x `key_bytes` at most, twice with the keys `met` once)."""

    def __init__(self, entries: int, key_bytes: int) -> None:
        super().__init__()
        if entries < 1 or key_bytes < 1:
            raise ValueError(f"entries and key_bytes must be positive, got {entries} and {key_bytes}")
        self.entries, self.key_bytes = entries, key_bytes
        self._once: set[bytes] = set()

    def met(self, key: bytes) -> bool:
        """Whether `key` was met before (worth remembering what it gives: it may come again), noting that it was. Most
        bytes that vary (a Content-Length, a label's length in an answer) are met once; deriving and keeping a value
        for each would cost them more than it ever saves."""
        if key in self._once:
            return True
        if len(key) <= self.key_bytes:
            if len(self._once) >= self.entries:
                self._once.clear()
            self._once.add(key)
        return False

    def remember(self, key: bytes, value: Value) -> None:
        if len(key) > self.key_bytes:
            return
        if len(self) >= self.entries and key not in self:
            self.clear()
        self[key] = value

    def forget(self) -> None:
        """Forget everything (what was derived no longer holds: another server, other models)."""
        self.clear()
        self._once.clear()
