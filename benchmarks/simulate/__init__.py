"""A scheduling simulator: the real routing, policy and snapshot code on a virtual clock.

``python -m benchmarks.simulate`` runs a fleet of simulated GPU workers (1,000 by
default) for a simulated ten minutes per scenario and reports, for the same workload,
gpulanes (``submit()``'s routing, beat's rounds, the movers) and *plain lanes* (three
FIFO queues by tier, no policy, no moves). What is simulated is only what has no pure
function to call: time passing, queues, workers running jobs, models loading. Every
decision is the project's own code (``benchmarks.simulate.control`` lists which).
"""
