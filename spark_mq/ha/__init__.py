"""High availability: who owns a data root (epochs that fence), replication, failover."""
