"""The scheduler interface (Triton's Enqueue / InflightInferenceCount / Stop)."""

from __future__ import annotations

from typing import Protocol

from ..core.request import InferenceRequest


class Scheduler(Protocol):
    def submit(self, request: InferenceRequest) -> None:
        """Take a normalised request; its responses arrive through request.respond."""

    def inflight(self) -> int:
        """Requests accepted and not yet given their final response."""

    def stop(self, timeout: float) -> None:
        """Refuse new requests, let accepted ones finish (up to timeout), release instances."""
