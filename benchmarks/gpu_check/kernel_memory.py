"""Step 4: the monitor's kernel-side answer (kernel.py: memory_allocated / memory_reserved) against
``torch.cuda.memory_stats()`` in the same process, twice:

* in this process, calling ``workbench_gpu_monitor.kernel.torch_memory()`` directly;
* in a real ipykernel started with jupyter_client: ``%load_ext workbench_gpu_monitor``, then the
  panel's own ``workbench_gpu_request`` on the control channel, then memory_stats() executed in
  the same kernel.

Both after allocating and freeing tensors so that reserved > allocated.  The UUID the kernel
reports is checked against the workbench's NVML inventory.  Dry run: gpu_check.fake_torch.
"""

from __future__ import annotations

import json
import os

from . import DRY
from .report import raw_dir, table, write

ALLOCATE = """
import json, sys
if {dry!r}:
    from gpu_check.fake_torch import install
    torch = install()
    torch.cuda.allocate(300 << 20); torch.cuda.allocate(5 << 20); torch.cuda.free(5 << 20)
else:
    import torch
    keep = [torch.empty(300 << 20, dtype=torch.uint8, device="cuda"), torch.randn(1000, 1000, device="cuda")]
    gone = torch.empty(64 << 20, dtype=torch.uint8, device="cuda"); del gone   # cached: reserved > allocated
    torch.cuda.synchronize()
"""
STATS = """
def _gpu_check_stats():
    out = []
    for i in range(torch.cuda.device_count()):
        s = torch.cuda.memory_stats(i)
        out.append({"cuda_index": i, "allocated_bytes.all.current": int(s.get("allocated_bytes.all.current", -1)),
                    "reserved_bytes.all.current": int(s.get("reserved_bytes.all.current", -1))})
    return out
"""


def nvml_uuids() -> list[str]:
    if DRY:
        return ["GPU-sim-00-h200-141gb"]
    try:
        from workbench_devices import nvml_devices

        return [d.uuid for d in nvml_devices()]
    except Exception:  # noqa: BLE001 - no pynvml or no driver, in whatever way NVML says it: nothing to compare with
        return []


def compare(where: str, devices: list[dict], stats: list[dict], uuids: list[str]) -> list[dict]:
    rows = []
    by = {s["cuda_index"]: s for s in stats}
    if not devices:
        rows.append(
            {
                "where": where,
                "cuda": None,
                "field": "devices",
                "kernel": "[] (torch.cuda not in use?)",
                "torch": len(stats),
                "agree": False,
            }
        )
    for d in devices:
        s = by.get(d["cuda_index"], {})
        for mine, theirs in (
            ("allocated_bytes", "allocated_bytes.all.current"),
            ("reserved_bytes", "reserved_bytes.all.current"),
        ):
            rows.append(
                {
                    "where": where,
                    "cuda": d["cuda_index"],
                    "field": mine,
                    "kernel": d.get(mine),
                    "torch": s.get(theirs),
                    "agree": d.get(mine) == s.get(theirs),
                }
            )
        nvml = uuids[d["cuda_index"]] if d["cuda_index"] < len(uuids) else None
        rows.append(
            {
                "where": where,
                "cuda": d["cuda_index"],
                "field": "uuid (against NVML)",
                "kernel": d.get("uuid"),
                "torch": nvml,
                "agree": d.get("uuid") is not None and d.get("uuid") == nvml,
            }
        )
    return rows


def in_process() -> tuple[list[dict], list[dict], str]:
    scope: dict = {}
    exec(ALLOCATE.format(dry=DRY), scope)
    exec(STATS, scope)
    from workbench_gpu_monitor.kernel import torch_memory

    return torch_memory(), scope["_gpu_check_stats"](), scope["torch"].__version__


def through_kernel() -> tuple[list[dict], list[dict], str]:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60, env=dict(os.environ))
    try:
        outputs: list[str] = []

        def run(code: str) -> None:
            outputs.clear()
            reply = kc.execute_interactive(
                code,
                timeout=60,
                output_hook=lambda m: (
                    outputs.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None
                ),
            )
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"kernel: {reply['content'].get('ename')}: {reply['content'].get('evalue')}")

        run(ALLOCATE.format(dry=DRY))
        run("%load_ext workbench_gpu_monitor")
        msg = kc.session.msg("workbench_gpu_request", {})
        kc.control_channel.send(msg)
        while True:
            reply = kc.control_channel.get_msg(timeout=15)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                break
        if reply["msg_type"] != "workbench_gpu_reply":
            raise RuntimeError(f"control channel answered {reply['msg_type']}")
        run(STATS + "\nprint(json.dumps(_gpu_check_stats()))")
        stats = json.loads("".join(outputs).strip().splitlines()[-1])
        return reply["content"].get("devices", []), stats, reply["content"].get("torch_version")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def main() -> None:
    raw = raw_dir()
    uuids = nvml_uuids()
    rows, notes, versions = [], [], {}
    for where, call in (("in process", in_process), ("ipykernel, control channel", through_kernel)):
        try:
            devices, stats, version = call()
            versions[where] = version
            rows += compare(where, devices, stats, uuids)
        except Exception as exc:  # noqa: BLE001 - report, and let the other half run
            notes.append(f"{where}: failed: {type(exc).__name__}: {exc}")
            rows.append(
                {
                    "where": where,
                    "cuda": None,
                    "field": "ran",
                    "kernel": f"{type(exc).__name__}: {exc}",
                    "torch": None,
                    "agree": False,
                }
            )
    differences = [r for r in rows if not r["agree"]]
    lines = [
        "## 4. Per-kernel torch memory: kernel.py against torch.cuda.memory_stats()",
        "",
        f"- torch {versions or 'n/a'}{' (SIMULATED: gpu_check.fake_torch)' if DRY else ''}; NVML UUIDs {uuids}",
        f"- **{'all fields agree' if not differences else str(len(differences)) + ' difference(s)'}**",
        "",
        *table(
            ["where", "CUDA index", "field", "kernel.py says", "memory_stats / NVML", "agree"],
            [
                [r["where"], r["cuda"], r["field"], r["kernel"], r["torch"], "yes" if r["agree"] else "**DIFFERENCE**"]
                for r in rows
            ],
        ),
    ]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    write(
        raw, "kernel_memory", {"rows": rows, "differences": differences, "nvml_uuids": uuids, "torch": versions}, lines
    )


if __name__ == "__main__":
    main()
