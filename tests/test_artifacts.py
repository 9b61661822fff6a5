"""Artifact paths come from job ids only, and only ids that are UUIDs."""
from __future__ import annotations

import uuid

import numpy as np
import pytest

from tasks.errors import ArtifactError
from tasks.jobs.artifacts import artifact_name
from tasks.worker.png import store_png


@pytest.mark.parametrize("job_id", ["../../etc/passwd", "/tmp/x", "a/b", "", "x" * 36,
                                    "12345678-1234-1234-1234-1234567890ab/../../x"])
def test_an_id_that_is_no_uuid_never_becomes_a_path(tmp_path, job_id):
    with pytest.raises(ValueError):
        artifact_name(job_id)
    with pytest.raises(ValueError):
        store_png(job_id, np.zeros((4, 4, 3), dtype=np.uint8), root=str(tmp_path))
    assert not list(tmp_path.rglob("*"))


def test_any_spelling_of_a_uuid_names_the_same_file(tmp_path):
    job_id = uuid.uuid4()
    for spelling in (str(job_id), str(job_id).upper(), "{%s}" % job_id, job_id.urn):
        assert artifact_name(spelling) == f"{job_id}.png"
        assert store_png(spelling, np.zeros((4, 4, 3), dtype=np.uint8),
                         root=str(tmp_path)).url == str(tmp_path / f"{job_id}.png")


def test_a_refused_local_write_names_its_folder_for_the_self_check(tmp_path):
    """The worker's self-check probes the folder the OSError names: it must be ours."""
    (tmp_path / "taken").write_bytes(b"a file where the artifact folder should be")
    with pytest.raises(ArtifactError) as caught:
        store_png(str(uuid.uuid4()), np.zeros((4, 4, 3), dtype=np.uint8),
                  root=str(tmp_path / "taken"))
    assert isinstance(caught.value.__cause__, OSError)
    assert str(tmp_path / "taken") in str(caught.value.__cause__.filename)
