"""Operating a broker: its HTTP listener (``broker.http_port``) with the metrics, the health
checks and the web console (:mod:`.http`, :mod:`.metrics`, :mod:`.health`, :mod:`.console`)."""
