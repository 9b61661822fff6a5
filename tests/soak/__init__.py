"""The soak suites: pass/fail runs of minutes on a private cluster (``make soak``), each
a script that prints its table and exits non-zero when a job was lost, falsely
failed, run twice, or a bound broken. Pytest never collects them (setup.cfg)."""
