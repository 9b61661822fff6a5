"""The simulator's fleet spread over cells (``benchmarks.simulate.cells``): small runs."""
from __future__ import annotations

import pytest

from benchmarks.simulate.cells import deal, run_cells, workers_for
from benchmarks.simulate.scenarios import SCENARIOS
from benchmarks.simulate.workload import Profile, model_specs

SMALL = Profile(models=12, heavy_accounts=3, light_accounts=40)


def test_models_are_dealt_by_load_and_workers_follow_it():
    dealt = deal(model_specs(SMALL, 3), SMALL, 3)
    names = [spec.name for models, _ in dealt for spec in models]
    assert sorted(names) == sorted(spec.name for spec in model_specs(SMALL, 3))  # each once
    assert sum(share for _, share in dealt) == pytest.approx(1.0)
    assert workers_for([0.5, 0.3, 0.2], 10) == [5, 3, 2]
    assert workers_for([0.98, 0.01, 0.01], 10) == [8, 1, 1]  # at least one each
    assert sum(workers_for([0.41, 0.33, 0.26], 97)) == 97


@pytest.mark.parametrize("mode", ["gpulanes", "plain"])
def test_every_job_of_every_cell_is_served_once_in_its_models_cell(mode):
    found = run_cells(SCENARIOS["worker-deaths"], 24, 60.0, 5, 3, profile=SMALL, modes=(mode,))
    outcome = found["outcomes"][mode]
    done = outcome.recorder.done
    assert len({id(job.arrival) for job in done}) == len(done) == outcome.accepted
    assert outcome.figures["served"] + outcome.figures["refused"] == outcome.figures["offered"]
    assert all(job.served == 1 for job in done)
    assert sum(cell["workers"] for cell in found["cells"]) == 24
    assert len(found["cells"]) == 3 and all(cell["models"] for cell in found["cells"])
    assert any(job.attempts > 1 for job in done), "no run was cut short"
