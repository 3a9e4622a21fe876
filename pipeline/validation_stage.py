"""The validation stage: raw batch in, valid events out, dead letters to the sink."""

from __future__ import annotations

from typing import Protocol

from pipeline.config import ValidationConfig
from pipeline.events import Click, DeadLetter, Impression, Validator
from pipeline.types import Clock, RawEvent

__all__ = ["ValidationStage"]


class _Sink(Protocol):
    def write(self, letter: DeadLetter) -> None: ...


class ValidationStage:
    """Decodes and validates a batch; every rejected event goes to ``sink`` with its reason."""

    def __init__(self, cfg: ValidationConfig, clock: Clock, sink: _Sink) -> None:
        self.validator = Validator(cfg, clock)
        self.sink = sink

    def __call__(self, batch: list[RawEvent]) -> list[Impression | Click]:
        out: list[Impression | Click] = []
        validate = self.validator.validate
        for raw in batch:
            event = validate(raw)
            if isinstance(event, DeadLetter):
                self.sink.write(event)
            else:
                out.append(event)
        return out

    def reject_click(self, click: Click, reason: str, detail: str) -> None:
        """A click the joiner refused (e.g. user mismatch) becomes a dead letter too."""
        raw = RawEvent("click", click.to_dict(), "joiner")
        self.sink.write(self.validator.dead_letter(raw, reason, detail))
