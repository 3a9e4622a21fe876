"""The ground floor: protocols, config, event schemas and validation, partitioning, checkpoints,
logs, metrics, sd_notify. It imports nothing of the project."""
