"""The validation stage: raw batch in, valid events out, dead letters to the sink.

Events that carry no entry time (a replayed file) get one from :class:`~pipeline.entered_time.EnteredTime`
first, so skew and age are judged as the joiner daemon judges a replay of the same log to Kafka.
"""

from __future__ import annotations

from typing import Protocol

from pipeline.config import ValidationConfig
from pipeline.entered_time import EnteredTime
from pipeline.events import Click, DeadLetter, Impression, Validator
from pipeline.types import Clock, RawEvent

__all__ = ["ValidationStage"]


class _Sink(Protocol):
    def write(self, letter: DeadLetter) -> None: ...


class ValidationStage:
    """Decodes and validates a batch; every rejected event goes to ``sink`` with its reason."""

    def __init__(self, cfg: ValidationConfig, clock: Clock, sink: _Sink) -> None:
        self.validator = Validator(cfg, clock)
        self.entered = EnteredTime(cfg.max_future_skew_s, cfg.max_past_age_s)
        self.sink = sink

    def __call__(self, batch: list[RawEvent]) -> list[Impression | Click]:
        self.entered.assign(batch)
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
