"""A stand-in for ``nvidia-smi`` in gpu_check's dry run: SIMULATED output, in the real formats.

Its GPUs are the simulated fleet of ``WORKBENCH_SIMULATED_GPUS`` and its readings are the
SimulatedSource's at the moment it is called, so an honest fake agrees with the workbench.
``GPU_CHECK_FAKE_SMI_PLANT`` plants differences, to show that the comparison finds them: a comma
list of ``FIELD@INDEX[+DELTA]`` with FIELD one of memory_total (MiB), memory_used (MiB),
utilization, temperature, power, uuid, name; e.g. ``memory_total@1+1024,temperature@0+20``.
``GPU_CHECK_FAKE_SMI_AT`` (set by gpu_check.monitor in a dry run) gives the moment to answer for.

Understands: ``-q``, ``-L``, ``--query-gpu=...``, ``--query-compute-apps=...``, ``--format=csv[,noheader][,nounits]``.
Nothing it prints is a measurement.
"""

from __future__ import annotations

import os
import sys
import time

from workbench_devices import SimulatedSource, discover_devices, select_devices

DRIVER = "000.00.00-simulated"
CUDA = "0.0-simulated"


def plants() -> dict[tuple[str, int], float | None]:
    out = {}
    for item in os.environ.get("GPU_CHECK_FAKE_SMI_PLANT", "").split(","):
        item = item.strip()
        if not item:
            continue
        field, _, rest = item.partition("@")
        delta = None
        for sign in ("+", "-"):
            if sign in rest:
                idx, _, d = rest.partition(sign)
                delta = float(d) * (1 if sign == "+" else -1)
                rest = idx
                break
        out[(field, int(rest or 0))] = delta
    return out


def readings() -> list[dict]:
    spec = os.environ.get("WORKBENCH_SIMULATED_GPUS") or "1xH200-141GB"
    inventory = discover_devices(spec)
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBENCH_GPUS", "CUDA_VISIBLE_DEVICES")}
    at = os.environ.get("GPU_CHECK_FAKE_SMI_AT")  # gpu_check.monitor: the sample's moment
    clock = (lambda: float(at)) if at else time.time
    sample = SimulatedSource(select_devices(inventory, env), clock=clock).read()
    plant = plants()
    gpus = []
    for g in sample["gpus"]:
        i = g["index"]
        row = {
            "index": i,
            "uuid": g["uuid"],
            "name": g["name"],
            "memory_total": g["memory_total_bytes"] / 2**20,
            "memory_used": (g["memory_used_bytes"] or 0) / 2**20,
            "memory_reserved": (g["memory_reserved_bytes"] or 0) / 2**20,
            "utilization": g["utilization_percent"],
            "temperature": g["temperature_c"],
            "power": g["power_w"],
            "power_limit": g["power_limit_w"],
        }
        for (field, index), delta in plant.items():
            if index != i or field not in row:
                continue
            if field in ("uuid", "name"):
                row[field] = f"{row[field]}-PLANTED"
            else:
                row[field] = row[field] + (delta if delta is not None else 1024.0)
        gpus.append(row)
    return gpus


def q() -> str:
    gpus = readings()
    lines = [
        "==============NVSMI LOG (SIMULATED: benchmarks/gpu_check/fake_nvidia_smi.py, not a GPU)==============",
        "",
        f"Timestamp                                 : {time.strftime('%a %b %d %H:%M:%S %Y')}",
        f"Driver Version                            : {DRIVER}",
        f"CUDA Version                              : {CUDA}",
        "",
        f"Attached GPUs                             : {len(gpus)}",
    ]
    for g in gpus:
        lines += [
            f"GPU 00000000:{g['index'] + 7:02X}:00.0",
            f"    Product Name                          : {g['name']}",
            "    Product Brand                         : NVIDIA",
            "    Product Architecture                  : Hopper",
            "    MIG Mode",
            "        Current                           : Disabled",
            "        Pending                           : Disabled",
            f"    GPU UUID                              : {g['uuid']}",
            f"    Minor Number                          : {g['index']}",
            "    FB Memory Usage",
            f"        Total                             : {g['memory_total']:.0f} MiB",
            f"        Reserved                          : {g['memory_reserved']:.0f} MiB",
            f"        Used                              : {g['memory_used']:.0f} MiB",
            f"        Free                              : {g['memory_total'] - g['memory_used']:.0f} MiB",
            "    Utilization",
            f"        GPU                               : {g['utilization']:.0f} %",
            "    Temperature",
            f"        GPU Current Temp                  : {g['temperature']:.0f} C",
            "    GPU Power Readings",
            f"        Average Power Draw                : {g['power']:.2f} W",
            f"        Current Power Limit               : {g['power_limit']:.2f} W",
            "",
        ]
    return "\n".join(lines) + "\n"


QUERY = {
    "index": lambda g: f"{g['index']}",
    "uuid": lambda g: g["uuid"],
    "name": lambda g: g["name"],
    "driver_version": lambda g: DRIVER,
    "memory.total": lambda g: f"{g['memory_total']:.0f}",
    "memory.used": lambda g: f"{g['memory_used']:.0f}",
    "utilization.gpu": lambda g: f"{g['utilization']:.0f}",
    "temperature.gpu": lambda g: f"{g['temperature']:.0f}",
    "power.draw": lambda g: f"{g['power']:.2f}",
    "mig.mode.current": lambda g: "Disabled",
}
UNITS = {"memory.total": " MiB", "memory.used": " MiB", "utilization.gpu": " %", "power.draw": " W"}


def main(argv: list[str]) -> int:
    fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), "csv")
    noheader, nounits = "noheader" in fmt, "nounits" in fmt
    if "-q" in argv:
        sys.stdout.write(q())
        return 0
    if "-L" in argv:
        for g in readings():
            print(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        return 0
    for arg in argv:
        if arg.startswith("--query-gpu="):
            fields = arg.split("=", 1)[1].split(",")
            unknown = [f for f in fields if f not in QUERY]
            if unknown:
                print(f'Field "{unknown[0]}" is not a valid field to query.', file=sys.stderr)
                return 2
            if not noheader:
                print(", ".join(fields))
            for g in readings():
                print(", ".join(QUERY[f](g) + ("" if nounits else UNITS.get(f, "")) for f in fields))
            return 0
        if arg.startswith("--query-compute-apps="):
            if not noheader:
                print(arg.split("=", 1)[1].replace(",", ", "))
            return 0  # the simulated fleet has no real processes to list
    gpus = readings()
    print("SIMULATED nvidia-smi (benchmarks/gpu_check/fake_nvidia_smi.py): not a GPU")
    print(f"Driver Version: {DRIVER}   CUDA Version: {CUDA}")
    for g in gpus:
        print(
            f"GPU {g['index']}: {g['name']}  {g['memory_used']:.0f}MiB / {g['memory_total']:.0f}MiB  "
            f"{g['utilization']:.0f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
