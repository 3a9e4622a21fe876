"""The ground floor: protocols, config, event schemas and validation, partitioning, checkpoints, logs, metrics, sd_notify; imports nothing of the project."""
