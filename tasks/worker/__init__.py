"""The worker's Celery task: runs, retries down the lanes, coalesced runs,
refused messages."""
