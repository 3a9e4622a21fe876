"""Contract suites: one check per protocol, applied to every implementation (river's ``check_estimator``).

Each check takes an implementation (or a factory of them) and raises :class:`ContractError`, an
AssertionError, as ``"<implementation> breaks '<rule>': <detail>"``. They live in the package, not in
the tests, so a new source, store, learner or reader is checked by one call. Tests parametrize them
over the implementations: ``tests/test_contracts.py`` (in process) and
``tests/integration/test_contracts_services.py`` (real Kafka, Redis and MLflow).

- :func:`check_source` (files, simulator) and :func:`check_group_source` (Kafka consumer groups):
  batches are lists of :class:`~pipeline.core.types.RawEvent`; ``snapshot()`` is JSON-serialisable; a
  restart from a snapshot (``resume=`` for files, a commit or ``seek`` for Kafka) delivers exactly
  the events after it. Why: exactly-once effect rests on it; a lost event is a lost label, a
  repeated one a double count in the features.
- :func:`check_model_store`: ``publish`` returns a new version id; an unknown alias resolves to None;
  ``set_alias`` to an unknown version fails at once with an error naming it; ``load`` predicts as the
  published model (a store that keeps no weights raises KeyError). Why: serving and rollbacks follow
  aliases; an alias pointing at nothing takes every replica down at its next poll.
- :func:`check_learner`: inputs not mutated; probabilities in [0, 1], one per example; state
  round-trips (weights and optimizer); same seed, same result; unseen or missing features do not
  crash. Why: the trainer resumes from a registry version and replays must be reproducible.
- :func:`check_feature_reader`: the rows written are read back; a missing entity gets the
  documented defaults (the joiner's); repeated candidates are fine. Why: training and serving must
  see the same features (no skew), and serving must not fail on a new user or item.

>>> from pipeline.sources.simulator import Simulator
>>> from pipeline.core.config import SimulatorConfig
>>> from pipeline.sources.streams import SimulatorSource
>>> sim = Simulator(SimulatorConfig(), 3)
>>> check_source(lambda resume: SimulatorSource(sim, 300, batch_size=60, resume=resume))
"""

from pipeline.checks._common import ContractError
from pipeline.checks.features import check_feature_reader
from pipeline.checks.learners import check_learner, odd_examples, round_trip
from pipeline.checks.sources import check_group_source, check_source, raw_event_positions
from pipeline.checks.stores import check_model_store

__all__ = [
    "ContractError",
    "check_feature_reader",
    "check_group_source",
    "check_learner",
    "check_model_store",
    "check_source",
    "odd_examples",
    "raw_event_positions",
    "round_trip",
]
