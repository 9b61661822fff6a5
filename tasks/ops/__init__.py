"""Operators: the ``celery -A tasks lanes`` CLI and the Prometheus exporter."""
