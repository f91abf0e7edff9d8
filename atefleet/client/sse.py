"""Server-sent events (the `text/event-stream` format), parsed incrementally from body chunks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    event: str
    data: str
    id: str | None

    def json(self) -> Any:
        return json.loads(self.data)


class EventParser:
    """Feed body chunks in, get complete events out (comments such as keep-alives are dropped)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event = "message"
        self._data: list[str] = []
        #: The last `id:` seen; it carries over to later events, as the SSE spec says.
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        events = []
        for raw in lines:
            line = raw.rstrip(b"\r").decode()
            if not line:
                if self._data:
                    events.append(Event(self._event, "\n".join(self._data), self._id))
                self._event, self._data = "message", []
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                self._event = value
            elif name == "data":
                self._data.append(value)
            elif name == "id":
                self._id = value
        return events
