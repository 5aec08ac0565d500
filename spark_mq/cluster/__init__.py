"""A cluster of brokers: members and placement on ZooKeeper (see docs/architecture.md)."""
