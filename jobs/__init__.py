"""Maintenance jobs over the Delta logs."""
