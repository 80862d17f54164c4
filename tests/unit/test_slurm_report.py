"""The Slurm job's start report as the hub reads it: lists where lists belong, else a 400 with a sentence."""

from __future__ import annotations

import pytest

from workbench_spawner.backends.slurm.node_report import NodeReport
from workbench_spawner.backends.slurm.report_api import read_report
from workbench_spawner.placement.engine_report import ReportRefusedError


@pytest.mark.parametrize(
    "report",
    [
        {"node": "n1", "gpus": 5},
        {"node": "n1", "gpus": {"uuid": "GPU-a", "index": 0}},
        {"node": "n1", "job_gpus": 5},
        {"node": "n1", "job_gpus": "GPU-a"},  # not read letter by letter as UUIDs
    ],
)
def test_a_report_whose_gpus_are_no_list_is_refused_with_the_sentence(report):
    assert NodeReport.from_json(report) is None
    with pytest.raises(ReportRefusedError, match="workbench_report must be an object naming the node"):
        read_report({"workbench_report": report})


def test_a_report_of_lists_is_read():
    report = {"node": "n1", "gpus": [{"index": 0, "uuid": "GPU-a"}], "job_gpus": ["GPU-a"]}
    assert NodeReport.from_json(report) == NodeReport("n1", ({"index": 0, "uuid": "GPU-a"},), ("GPU-a",))
    assert NodeReport.from_json({"node": "n1"}) == NodeReport("n1")
    assert read_report({"workbench_report": report}) == {"workbench_report": report}
