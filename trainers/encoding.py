"""Turn impressions and their point-in-time streaming features into model inputs.

An :class:`Encoder` is fitted once, on the first block, and its schema is then fixed so that every
later model version reads its inputs the same way (a serving replica and the trainer must agree):

- categorical fields: ``user_id``, ``item_id`` and the sorted ``impression.features`` keys seen in
  the fitting block. Each value becomes the token ``"field=value"``, hashed with BLAKE2b (stable
  across processes and machines, unlike Python's salted ``hash()``) into ``[0, hash_buckets)``. A
  missing field becomes its own ``"field=<missing>"`` token; a field unseen at fit time is ignored.
- dense inputs: the sorted ``impression.dense`` keys and streaming-feature names of the fitting block.
  Rates (a name containing ``ctr`` or ``rate``) pass through raw; anything else is treated as a count
  and compressed with a signed ``log1p``. A missing dense value is 0.
- the behaviour sequence, for sequence models only (``sequence_length`` L > 0): the user's newest L
  clicked items (the ``user_clicked_items`` list feature, newest first) as L more id columns after
  the fields, each hashed exactly as the ``item_id`` field hashes a candidate (so a clicked item and
  a candidate share their embedding row); -1 where the sequence is shorter.

>>> from pipeline.core.events import Impression
>>> enc = Encoder(hash_buckets=1 << 10)
>>> imp = Impression("i1", 1, "u_1", "ad7", {"site": "news"})
>>> enc.fit([(imp, {"user_ctr_1h": 0.1})]).fields
['user_id', 'item_id', 'site']
>>> enc.encode([(imp, {"user_ctr_1h": 0.1})]).ids.shape
(1, 3)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.core.config import TrainerConfig
from pipeline.core.events import Impression, LabelledExample

__all__ = ["MISSING", "NO_ITEM", "SEQUENCE_KEY", "EncodedBatch", "Encoder", "Row", "rows_of", "stable_hash"]

MISSING = "<missing>"
SEQUENCE_KEY = "user_clicked_items"  # the stream feature holding the behaviour sequence (newest first)
NO_ITEM = -1  # an id column of the behaviour sequence past its end
_SPEC_VERSION = 1
_CACHE_LIMIT = 2_000_000  # tokens remembered per encoder before the memo is reset (bounds memory)

Row = tuple[Impression, Mapping[str, Any]]  # stream features: floats, and list features


def stable_hash(token: str, buckets: int) -> int:
    """The bucket of ``token``: BLAKE2b-64 modulo ``buckets``, identical in every process."""
    digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % buckets


def rows_of(examples: Iterable[LabelledExample]) -> list[Row]:
    """``(impression, stream_features)`` rows of labelled examples."""
    return [(ex.impression, ex.stream_features) for ex in examples]


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """Model inputs for ``n`` rows: hashed ids ``(n, fields [+ sequence])`` int64, dense ``(n, d)``
    float32; the targets when encoded from labelled examples.

    Conversion targets (:class:`pipeline.core.events.LabelledExample`'s ``conversion`` and
    ``correction``) are None unless some example carries them: ``conversions`` float32, 0/1 where
    known and NaN where not; ``corrections`` bool, the rows that repeat a clicked impression to
    deliver its conversion (a click-only consumer skips them: :meth:`without_corrections`).
    """

    ids: np.ndarray
    dense: np.ndarray
    labels: np.ndarray | None = None  # float32 0/1, present when encoded from labelled examples
    conversions: np.ndarray | None = None  # float32 0/1, NaN where unknown; None: none known
    corrections: np.ndarray | None = None  # bool; None: no correction among the rows

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __getitem__(self, index: slice | np.ndarray) -> EncodedBatch:
        labels = None if self.labels is None else self.labels[index]
        conversions = None if self.conversions is None else self.conversions[index]
        corrections = None if self.corrections is None else self.corrections[index]
        return EncodedBatch(self.ids[index], self.dense[index], labels, conversions, corrections)

    def first_columns(self, n: int) -> EncodedBatch:
        """The batch with only its first ``n`` id columns (the fields, without a behaviour sequence)."""
        if self.ids.shape[1] == n:
            return self
        return EncodedBatch(self.ids[:, :n], self.dense, self.labels, self.conversions, self.corrections)

    def without_unused_sequence(self, n_fields: int) -> EncodedBatch:
        """The batch without the behaviour-sequence columns (after the first ``n_fields``) that are
        :data:`NO_ITEM` on every row; one sequence column is always kept.

        A sequence model masks those columns to 0, so it scores the rows the same (up to the last
        bits of a matmul over another shape) with less work: a serving request is one user's rows,
        and most users have clicked fewer items than the sequence holds.

        >>> b = EncodedBatch(np.array([[7, 3, -1, -1], [8, -1, -1, -1]]), np.zeros((2, 0)))
        >>> b.without_unused_sequence(1).ids.tolist()
        [[7, 3], [8, -1]]
        >>> b[1:].without_unused_sequence(1).ids.tolist()
        [[8, -1]]
        """
        used = np.flatnonzero((self.ids[:, n_fields:] != NO_ITEM).any(axis=0))
        width = n_fields + (int(used[-1]) + 1 if used.size else 1)
        return self.first_columns(min(width, self.ids.shape[1]))

    def click_rows(self) -> np.ndarray | None:
        """The rows that are not corrections (bool), or None when every row is one (no correction).

        >>> b = EncodedBatch(np.zeros((3, 1), np.int64), np.zeros((3, 0), np.float32))
        >>> b.click_rows() is None
        True
        >>> EncodedBatch(b.ids, b.dense, corrections=np.array([False, True, False])).click_rows()
        array([ True, False,  True])
        """
        if self.corrections is None or not self.corrections.any():
            return None
        return ~self.corrections

    def without_corrections(self) -> EncodedBatch:
        """The batch without its correction rows (itself when it has none): what a click model learns."""
        keep = self.click_rows()
        return self if keep is None else self[keep]

    @staticmethod
    def concat(parts: Sequence[EncodedBatch]) -> EncodedBatch:
        """One batch of ``parts``' rows in order (labels kept only if every part has them; conversion
        targets if any part has them: NaN, resp. False, for the rows of the parts without)."""
        if len(parts) == 1:
            return parts[0]
        labels = [p.labels for p in parts]
        conversions = None
        if any(p.conversions is not None for p in parts):
            conversions = np.concatenate([_or_full(p.conversions, len(p), np.nan, np.float32) for p in parts])
        corrections = None
        if any(p.corrections is not None for p in parts):
            corrections = np.concatenate([_or_full(p.corrections, len(p), False, np.bool_) for p in parts])
        return EncodedBatch(
            np.concatenate([p.ids for p in parts]),
            np.concatenate([p.dense for p in parts]),
            None if any(x is None for x in labels) else np.concatenate(labels),  # type: ignore[arg-type]
            conversions,
            corrections,
        )


def _or_full(values: np.ndarray | None, n: int, fill: Any, dtype: Any) -> np.ndarray:
    return np.full(n, fill, dtype=dtype) if values is None else values


def _is_rate(name: str) -> bool:
    low = name.lower()
    return "ctr" in low or "rate" in low


class Encoder:
    """Stable hashed categorical ids plus dense inputs; schema fixed by :meth:`fit`."""

    def __init__(self, hash_buckets: int, sequence_length: int = 0) -> None:
        if hash_buckets < 2:
            raise ValueError(f"Encoder: hash_buckets must be >= 2, got {hash_buckets}")
        self.hash_buckets = hash_buckets
        self.sequence_length = sequence_length  # behaviour-sequence id columns after the fields
        self.fields: list[str] = []
        self.dense_keys: list[str] = []  # from impression.dense
        self.stream_keys: list[str] = []  # from the streaming features
        self._fitted = False
        # field -> value -> bucket. A pure memo of stable_hash: never part of the spec.
        self._cache: dict[str, dict[str, int]] = {}
        self._cached = 0

    @classmethod
    def for_trainer(cls, cfg: TrainerConfig) -> Encoder:
        """The (unfitted) encoder of ``cfg.model``: with the behaviour-sequence columns for DIN."""
        return cls(cfg.hash_buckets, cfg.sequence_length if cfg.model == "din" else 0)

    # -- schema ----------------------------------------------------------------------------------
    @property
    def fitted(self) -> bool:
        return self._fitted

    @property
    def dense_names(self) -> list[str]:
        return self.dense_keys + self.stream_keys

    @property
    def id_columns(self) -> int:
        """Columns of :attr:`EncodedBatch.ids`: the fields, then the behaviour sequence's."""
        return len(self.fields) + self.sequence_length

    def fit(self, rows: Sequence[Row] | Sequence[LabelledExample]) -> Encoder:
        """Fix the schema from the field names of ``rows`` (values are not looked at)."""
        if self._fitted:
            raise RuntimeError("Encoder.fit: already fitted; the schema is fixed for the model's life")
        pairs = _as_rows(rows)
        feats: set[str] = set()
        dense: set[str] = set()
        stream: set[str] = set()
        for imp, sf in pairs:
            feats.update(imp.features)
            dense.update(imp.dense)
            stream.update(k for k, v in sf.items() if not isinstance(v, list))  # sequences: not dense
        # user_id/item_id come first and are not duplicated if a feature reuses the name.
        self.fields = ["user_id", "item_id", *sorted(feats - {"user_id", "item_id"})]
        self.dense_keys = sorted(dense)
        self.stream_keys = sorted(stream)
        if self.sequence_length and not any(SEQUENCE_KEY in sf for _, sf in pairs):
            raise ValueError(
                f"Encoder.fit: a sequence model needs the examples' behaviour sequences ({SEQUENCE_KEY}), "
                "and these carry none: set features.sequence_length > 0 (the joiner then attaches them)"
            )
        self._fitted = True
        return self

    def spec(self) -> dict[str, Any]:
        """JSON-serialisable schema; :meth:`from_spec` rebuilds an identical encoder."""
        self._check_fitted()
        return {
            "version": _SPEC_VERSION,
            "hash": "blake2b64",
            "hash_buckets": self.hash_buckets,
            "fields": list(self.fields),
            "dense_keys": list(self.dense_keys),
            "stream_keys": list(self.stream_keys),
            **({"sequence_length": self.sequence_length} if self.sequence_length else {}),
        }

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Encoder:
        if spec.get("version") != _SPEC_VERSION or spec.get("hash") != "blake2b64":
            raise ValueError(f"Encoder.from_spec: unsupported spec {dict(spec)!r}")
        enc = cls(int(spec["hash_buckets"]), int(spec.get("sequence_length", 0)))
        enc.fields = [str(f) for f in spec["fields"]]
        enc.dense_keys = [str(k) for k in spec["dense_keys"]]
        enc.stream_keys = [str(k) for k in spec["stream_keys"]]
        enc._fitted = True
        return enc

    def __deepcopy__(self, memo: dict[int, Any]) -> Encoder:
        # Immutable once fitted (the cache is a memo of a pure function): clones share it.
        return self

    # -- encoding --------------------------------------------------------------------------------
    def encode(self, rows: Sequence[Row] | Sequence[LabelledExample]) -> EncodedBatch:
        """Encode rows, or labelled examples (then ``labels`` is filled too)."""
        self._check_fitted()
        labels = conversions = corrections = None
        if rows and isinstance(rows[0], LabelledExample):
            examples: Sequence[LabelledExample] = rows  # type: ignore[assignment]
            labels = np.fromiter((ex.label for ex in examples), dtype=np.float32, count=len(rows))
            conversions, corrections = _conversion_targets(examples)
        pairs = _as_rows(rows)
        n = len(pairs)
        ids = np.empty((n, self.id_columns), dtype=np.int64)
        imps = [imp for imp, _ in pairs]
        for j, name in enumerate(self.fields):
            if name == "user_id":
                col: list[str] = [imp.user_id for imp in imps]
            elif name == "item_id":
                col = [imp.item_id for imp in imps]
            else:
                col = [imp.features.get(name, MISSING) for imp in imps]
            ids[:, j] = self._bucket_column(name, col)
        if self.sequence_length:
            for r, (_, sf) in enumerate(pairs):
                ids[r, len(self.fields) :] = self._sequence_ids(sf.get(SEQUENCE_KEY, ()))
        dense = np.zeros((n, len(self.dense_names)), dtype=np.float32)
        for j, key in enumerate(self.dense_keys):
            dense[:, j] = [imp.dense.get(key, 0.0) for imp in imps]
        offset = len(self.dense_keys)
        for j, key in enumerate(self.stream_keys):
            dense[:, offset + j] = [sf.get(key, 0.0) for _, sf in pairs]
        self._compress(dense)
        return EncodedBatch(ids, dense, labels, conversions, corrections)

    def encode_request(
        self,
        user_id: str,
        item_ids: Sequence[str],
        context: Mapping[str, str],
        dense: Sequence[Mapping[str, float]] | None,
        stream: Sequence[Mapping[str, Any]],
    ) -> EncodedBatch:
        """What :meth:`encode` gives for one serving request's rows, ``Impression(_, _, user_id,
        item, context, dense[k])`` with ``stream[k]`` for the k-th item, without building them:
        the user and the context are the same on every row, so each is hashed once and repeated
        (``tests/test_inference.py`` checks it equals :meth:`encode`)."""
        self._check_fitted()
        n = len(item_ids)
        if len(stream) != n or (dense is not None and len(dense) != n):
            raise ValueError(f"Encoder.encode_request: {n} items, {len(stream)} feature rows")
        ids = np.empty((n, self.id_columns), dtype=np.int64)
        for j, name in enumerate(self.fields):
            if name == "item_id":
                ids[:, j] = self._bucket_column(name, list(item_ids))
            else:
                value = user_id if name == "user_id" else context.get(name, MISSING)
                ids[:, j] = self._bucket_column(name, [value])[0]
        if self.sequence_length and n:  # the user's: the same on every row
            ids[:, len(self.fields) :] = self._sequence_ids(stream[0].get(SEQUENCE_KEY, ()))
        out = np.zeros((n, len(self.dense_names)), dtype=np.float32)
        if dense is not None:
            for j, key in enumerate(self.dense_keys):
                out[:, j] = [d.get(key, 0.0) for d in dense]
        offset = len(self.dense_keys)
        for j, key in enumerate(self.stream_keys):
            out[:, offset + j] = [sf.get(key, 0.0) for sf in stream]
        self._compress(out)
        return EncodedBatch(ids, out)

    def _compress(self, dense: np.ndarray) -> None:
        """In place: signed ``log1p`` of the counts (rates raw), non-finite values zeroed."""
        for j, name in enumerate(self.dense_names):
            if not _is_rate(name):
                dense[:, j] = np.sign(dense[:, j]) * np.log1p(np.abs(dense[:, j]))
        # A non-finite input would poison every weight it touches: zero it (validation should
        # already have rejected it; stream features come from our own aggregations).
        np.nan_to_num(dense, copy=False, nan=0.0, posinf=0.0, neginf=0.0)

    def _sequence_ids(self, items: Sequence[str]) -> list[int]:
        """The id columns of a behaviour sequence: its newest entries hashed as ``item_id`` values."""
        ids = self._bucket_column("item_id", list(items[: self.sequence_length]))
        return ids + [NO_ITEM] * (self.sequence_length - len(ids))

    def _bucket_column(self, name: str, col: list[str]) -> list[int]:
        cache = self._cache.get(name)
        if cache is None:
            cache = self._cache[name] = {}
        out = []
        get = cache.get
        for value in col:
            b = get(value)
            if b is None:
                b = stable_hash(f"{name}={value}", self.hash_buckets)
                cache[value] = b
                self._cached += 1
            out.append(b)
        if self._cached > _CACHE_LIMIT:
            self._cache.clear()
            self._cached = 0
        return out

    def _check_fitted(self) -> None:
        if not self._fitted:
            raise RuntimeError("Encoder: call fit() on the first block (or from_spec()) before encoding")


def _conversion_targets(examples: Sequence[LabelledExample]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(conversions, corrections)`` of :class:`EncodedBatch` for labelled examples (each None when
    no example carries one: a click-only stream pays nothing)."""
    conversions = corrections = None
    if any(ex.conversion is not None for ex in examples):
        conversions = np.array(
            [np.nan if ex.conversion is None else ex.conversion for ex in examples], dtype=np.float32
        )
    if any(ex.correction for ex in examples):
        corrections = np.fromiter((ex.correction for ex in examples), dtype=np.bool_, count=len(examples))
    return conversions, corrections


def _as_rows(rows: Sequence[Row] | Sequence[LabelledExample]) -> list[Row]:
    if rows and isinstance(rows[0], LabelledExample):
        return rows_of(rows)  # type: ignore[arg-type]
    return list(rows)  # type: ignore[arg-type]
