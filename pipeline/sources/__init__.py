"""Event sources for replays: the simulator, JSONL, Avazu, Criteo, Open Bandit, Parquet."""
