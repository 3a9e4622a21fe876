"""MLflow "models from code" entry point: the pyfunc wrapper of a saved :class:`TorchLearner`.

:class:`trainers.registry.MlflowModelStore` logs THIS FILE as the model's code (MLflow executes it
at load time; nothing is pickled) with one artifact, ``learner``: the folder written by
:meth:`TorchLearner.save`. So ``mlflow.pyfunc.load_model("models:/ctr-model@champion")`` works in
any environment that has the ``ctr-online`` package installed.

Input (the model's signature): a pandas DataFrame or a list of dicts, one row per impression, with
``user_id``, ``item_id``, ``features`` (str -> str), ``dense`` (str -> float) and
``stream_features`` (str -> float); the maps may be empty but must be there; and, optional, the
user's behaviour sequence ``user_clicked_items`` (item ids, newest first: what DIN attends over).
Output: a numpy array of click probabilities; for a multi-task model (ESMM, :mod:`trainers.multitask`)
a DataFrame with two columns, ``probability`` (the click probability, the same numbers) and
``conversion_probability`` (pCVR: P(conversion | click); pCTR x pCVR is the impression's
probability of converting), named as the scoring API names them (``probabilities``,
``conversion_probabilities``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel

from pipeline.core.events import Impression
from trainers.encoding import SEQUENCE_KEY
from trainers.multitask import CONVERSION_COLUMN, PROBABILITY_COLUMN

__all__ = ["CONVERSION_COLUMN", "PROBABILITY_COLUMN", "CtrPyfuncModel", "rows_from_records"]


def rows_from_records(records: list[Mapping[str, Any]]) -> list[tuple[Impression, Mapping[str, Any]]]:
    """``(Impression, stream_features)`` rows from plain records (missing dicts become empty; the
    behaviour sequence, if given, joins the stream features as the joiner attaches it)."""
    rows: list[tuple[Impression, Mapping[str, Any]]] = []
    for i, r in enumerate(records):
        imp = Impression(
            str(r.get("impression_id", i)),
            0,
            str(r["user_id"]),
            str(r["item_id"]),
            _dict(r.get("features")),
            _dict(r.get("dense")),
        )
        stream = _dict(r.get("stream_features"))
        sequence = r.get(SEQUENCE_KEY)
        if sequence is not None and not isinstance(sequence, float):  # a DataFrame's gap is NaN
            stream[SEQUENCE_KEY] = [str(x) for x in sequence]
        rows.append((imp, stream))
    return rows


def _dict(value: Any) -> dict[str, Any]:
    # A DataFrame fills a column missing from some rows with NaN, not an empty dict.
    return dict(value) if isinstance(value, Mapping) else {}


class CtrPyfuncModel(PythonModel):
    """Loads the learner folder artifact; predicts click probabilities for impression records (and
    conversion probabilities after a click, for a multi-task model)."""

    def load_context(self, context: Any) -> None:
        from trainers.learner import TorchLearner  # imported lazily: MLflow loads this file first

        self.learner = TorchLearner.load(context.artifacts["learner"])

    # MLflow reads this hint: DataFrame = "no schema inference, pass input through as is" (list[...]
    # hints would make it validate and convert); a list of dicts is accepted as well.
    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> Any:
        records = model_input.to_dict("records") if hasattr(model_input, "to_dict") else list(model_input)
        rows = rows_from_records(records)
        blend = self.learner.blend  # the version's mixture with the base rate (no online offset here)
        if not self.learner.multi_task:
            p = self.learner.predict(rows)
            return p if blend is None else blend.apply(p)
        both = self.learner.predict_tasks(rows)  # one forward; column 0 is what predict gives
        clicks = both[:, 0] if blend is None else blend.apply(both[:, 0])
        return pd.DataFrame({PROBABILITY_COLUMN: clicks, CONVERSION_COLUMN: both[:, 1]})


mlflow.models.set_model(CtrPyfuncModel())
