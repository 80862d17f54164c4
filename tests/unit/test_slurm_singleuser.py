"""What a job's start-up reports (workbench-slurm-singleuser): the job's GPUs only, under Slurm's index.

Against a stand-in pynvml (no driver here) that behaves as NVML does inside a job confined to its GPUs
(ConstrainDevices=yes): it lists only the job's two GPUs, numbered 0 and 1, while Slurm gave the job
GPUs 2 and 3 of the node, whose device files are /dev/nvidia2 and /dev/nvidia3."""

from __future__ import annotations

import sys

from tests.unit.fake_nvml import fake_pynvml
from workbench_spawner.backends.slurm.singleuser import node_report


def confined_nvml(monkeypatch) -> None:
    fake = fake_pynvml(
        2,
        nvmlDeviceGetUUID=lambda h: f"GPU-real-{h[1] + 2}",
        nvmlDeviceGetHandleByUUID=lambda uuid: ("gpu", int(uuid.rsplit("-", 1)[1]) - 2),
        nvmlDeviceGetMinorNumber=lambda h: h[1] + 2,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)


def test_a_confined_job_reports_its_gpus_under_slurms_index(monkeypatch):
    confined_nvml(monkeypatch)
    report = node_report({"SLURMD_NODENAME": "gpu07", "SLURM_JOB_GPUS": "3"})
    assert report["node"] == "gpu07"
    assert report["source"] == "nvml"
    assert [(g["index"], g["uuid"]) for g in report["gpus"]] == [(3, "GPU-real-3")]
    assert report["job_gpus"] == ["GPU-real-3"]


def test_the_simulated_source_reports_the_jobs_gpus_of_its_node():
    env = {"SLURMD_NODENAME": "wbnode2", "SLURM_JOB_GPUS": "0,1", "WORKBENCH_SIMULATED_GPUS": "2xH100-80GB"}
    report = node_report(env)
    assert report["job_gpus"] == ["GPU-sim-wbnode2-00-h100-80gb", "GPU-sim-wbnode2-01-h100-80gb"]
    assert env["WORKBENCH_SIMULATED_NODE"] == "wbnode2"  # the monitor in the job keys its readings so too
