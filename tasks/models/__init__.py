"""Built-in models of the general contract (``tasks.jobs.catalog``): light at import,
so a submitting process can take their ``Input``; weights (if any) load in
``__init__``, on the worker."""
