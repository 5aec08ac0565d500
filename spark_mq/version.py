"""sparkmq's version (the package's, and what the broker says it runs)."""

__version__ = "0.1.0"
