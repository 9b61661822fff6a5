"""Pure routing decisions: which lane a job goes to, and the names of things."""
