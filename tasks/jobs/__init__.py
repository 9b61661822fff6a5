"""Jobs and accounting: the job contract, validation, artifacts, fast time,
the result cache, dead letters."""
