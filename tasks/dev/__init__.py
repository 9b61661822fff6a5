"""Development: the demo and a local cluster on an embedded Redis."""
