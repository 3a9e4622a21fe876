"""The joiner: event-time join, partition tasks, their merge, the replay's partitioned join."""
