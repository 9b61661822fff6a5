"""GPU workers: device pinning, the launcher, sharded model loading, warm models."""
