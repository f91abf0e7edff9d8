"""Bounded capture of one output stream: the head and the tail are kept, the middle is counted.

Offsets are positions in the raw stream as the process wrote it. Readers (long-polls) ask for
the bytes after an offset; bytes already dropped from the middle are skipped and reported.
"""

from __future__ import annotations

#: Marker placed where the middle of a stream was dropped; `{n}` is the number of bytes.
TRUNCATION_MARKER = "\n[... {n} bytes truncated ...]\n"


def utf8_safe_end(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    n = len(data)
    # Walk back over at most 3 continuation bytes to the lead byte of the last character.
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 == 0x80:
            continue
        if b < 0x80:
            return n
        need = 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
        return n if back >= need else n - back
    return n


class BoundedOutput:
    """One stream: first `max_bytes // 2` bytes and last `max_bytes - head` bytes."""

    def __init__(self, max_bytes: int) -> None:
        self._head_max = max_bytes // 2
        self._tail_max = max_bytes - self._head_max
        self._head = bytearray()
        self._tail = bytearray()
        #: Bytes written so far (the next write's offset).
        self.total = 0

    @property
    def dropped(self) -> int:
        return self.total - len(self._head) - len(self._tail)

    def write(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_max - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        self._tail += data
        if len(self._tail) > self._tail_max:
            del self._tail[: len(self._tail) - self._tail_max]

    def read_from(self, offset: int, limit: int) -> tuple[bytes, int, int]:
        """Bytes from `offset` (at most `limit`), the offset after them, and bytes skipped."""
        head_len = len(self._head)
        tail_start = self.total - len(self._tail)
        if offset < head_len:
            chunk = bytes(self._head[offset : offset + limit])
            return chunk, offset + len(chunk), 0
        skipped = max(0, tail_start - offset)
        start = max(offset, tail_start)
        chunk = bytes(self._tail[start - tail_start : start - tail_start + limit])
        return chunk, start + len(chunk), skipped

    def text(self) -> str:
        """The kept bytes as text, with the truncation marker where the middle was dropped."""
        head = self._head.decode("utf-8", errors="replace")
        if not self.dropped:
            return head + self._tail.decode("utf-8", errors="replace")
        marker = TRUNCATION_MARKER.format(n=self.dropped)
        return head + marker + self._tail.decode("utf-8", errors="replace")
