"""`preserve_ordering`: responses leave in the order their requests left the
queue, whichever instance finished first (Triton's DelegateResponse and
FinalizeResponses). A request's responses are held until every request
taken before it has sent its final response; the oldest unfinished request
streams through without waiting.
"""

from __future__ import annotations

import collections
import threading

from ..core.request import InferenceResponse
from .base import tap


class _Slot:
    __slots__ = ("deliver", "held", "done")

    def __init__(self, deliver):
        self.deliver = deliver
        self.held: list[InferenceResponse] = []
        self.done = False


class ResponseOrderer:
    def __init__(self):
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()  # one sender at a time keeps the order
        self.slots: collections.deque[_Slot] = collections.deque()

    def enroll(self, request) -> None:
        """Reserve the request's place in the response order (call in queue order)."""
        request_tap = tap(request)
        slot = _Slot(request_tap.deliver)
        with self.lock:
            self.slots.append(slot)

        def hold(response: InferenceResponse):
            with self.lock:
                slot.held.append(response)
                if response.final:
                    slot.done = True
            self._flush()
            return None

        request_tap.stages.append(hold)

    def __len__(self) -> int:
        with self.lock:
            return len(self.slots)

    def _flush(self) -> None:
        with self.send_lock:
            ready = []
            with self.lock:
                while self.slots and self.slots[0].held:
                    head = self.slots[0]
                    ready.extend((head.deliver, r) for r in head.held)
                    head.held = []
                    if not head.done:
                        break
                    self.slots.popleft()
            for deliver, response in ready:
                deliver(response)
