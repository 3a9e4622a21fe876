"""The Feast repository: definitions and the feature_store.yaml templates of both profiles."""
