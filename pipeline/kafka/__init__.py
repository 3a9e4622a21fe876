"""Kafka adapters: client, offsets, group sources, sinks, publishing."""
