"""Streaming features and the Feast feature store they go into.

- :mod:`features.aggregations`: per-user and per-item sliding-window counters (pure Python, the
  joiner's hot path; imports nothing heavy);
- :mod:`features.item_stage`: item counters over all traffic, on examples in the trainer's merge
  order (the same whatever the partition count);
- :mod:`features.repo.definitions`: the Feast entities, push sources and feature views;
- :mod:`features.store`: open the store for a profile, push rows, read them for serving
  (imports Feast, which takes seconds: keep it out of this ``__init__``).
"""

__all__: list[str] = []
