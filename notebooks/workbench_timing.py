"""Fair timing for the starter notebooks (import it from a notebook next to this file).

A figure you can trust on a shared GPU machine needs five things, and ``compare`` does all of them:

1. **Warm-up apart.** The first steps of a variant (compilation, cuDNN autotuning, allocator
   growth, DataLoader worker start-up) are run first, timed on their own and reported as
   ``warmup_s``; they never enter the figure.
2. **Blocks, not single steps.** A timed block is N steps between two synchronizations (or two
   CUDA events), because GPU work is asynchronous: a sync after every step would add its own cost
   and hide the launch overlap that makes GPUs fast.
3. **Enough time.** N is calibrated so that the blocks of one figure add up to at least
   ``min_seconds`` (1 s by default); a 10 ms measurement swings with every other process.
4. **Repeats, median and spread.** Each figure is the median over ``repeats`` blocks, with the
   spread ``(max - min) / median`` next to it, so a reader sees how much to trust it.
5. **Interleaved variants.** Repeat r of every variant runs before repeat r + 1 of any, in a
   rotating order, so a neighbour's job or a clock change hits all variants alike instead of
   whichever ran last.

``precision_state`` / ``precision_label`` read the float32 matmul and convolution precision
(TF32 on or off) with whichever API the process used (``torch.backends.*.fp32_precision`` on
torch >= 2.9, ``torch.get_float32_matmul_precision`` / ``allow_tf32`` before), so every results
table can state it. ``matmul_precision("tf32" | "ieee")`` sets it for a block of code.

Example::

    from workbench_timing import compare, timer_for, timing_cells, TIMING_HEADERS, md_table
    results = compare({"eager": step_eager, "compiled": step_compiled}, timer=timer_for(device),
                      warmup=3)
    md_table("Results (cuda)", ["variant"] + TIMING_HEADERS,
             [[name] + timing_cells(m) for name, m in results.items()])

Set ``WORKBENCH_NOTEBOOK_QUICK=1`` (the notebook tests do) for a short smoke run: 3 repeats and
0.15 s per figure instead of 5 repeats and 1 s. The figures are then only good for checking
that the code runs.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

QUICK = os.environ.get("WORKBENCH_NOTEBOOK_QUICK", "") not in ("", "0")
DEFAULT_REPEATS = 3 if QUICK else 5
DEFAULT_MIN_SECONDS = 0.15 if QUICK else 1.0

TIMING_HEADERS = ["median (ms)", "spread", "repeats x steps", "warm-up (s)"]


# --------------------------------------------------------------------------- timers


class SyncTimer:
    """Time ``steps`` calls of ``fn`` on the host clock between two synchronizations.

    ``sync`` waits until the device has finished everything queued (``torch.cuda.synchronize``
    on a GPU, nothing on the CPU). It is called once before and once after the block, never
    inside it. Use this timer when the work spans several streams or the host (data loading,
    side-stream copies, collectives): it measures the wall time a user waits.
    """

    method = "sync"

    def __init__(self, sync: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.perf_counter):
        self.sync, self.clock = sync, clock

    def __call__(self, fn: Callable[[], object], steps: int) -> float:
        self.sync()
        t0 = self.clock()
        for _ in range(steps):
            fn()
        self.sync()
        return self.clock() - t0


class EventTimer:
    """Time ``steps`` calls of ``fn`` with two CUDA events on the current stream.

    The events are recorded into the stream before and after the block; ``end.synchronize()``
    waits for the second one and ``start.elapsed_time(end)`` is the GPU's own clock (ms) between
    them. Only work queued on that stream (or ordered before it) is covered: use ``SyncTimer``
    for multi-stream work. ``event_factory`` makes an event (``torch.cuda.Event(enable_timing=True)``
    by default); ``device_context`` makes the device current while timing (``torch.cuda.device``).
    """

    method = "CUDA events"

    def __init__(
        self,
        event_factory: Callable[[], object] | None = None,
        device_context: Callable[[], contextlib.AbstractContextManager] | None = None,
    ):
        if event_factory is None:
            import torch

            event_factory = functools.partial(torch.cuda.Event, enable_timing=True)
        self.event_factory = event_factory
        self.device_context = device_context or contextlib.nullcontext

    def __call__(self, fn: Callable[[], object], steps: int) -> float:
        with self.device_context():
            start, end = self.event_factory(), self.event_factory()
            start.record()
            for _ in range(steps):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0


def sync_for(device) -> Callable[[], None]:
    """A function that waits for all queued work on ``device`` (a no-op on the CPU)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "mps":
        return torch.mps.synchronize
    return lambda: None


def timer_for(device, method: str = "sync"):
    """The right timer for ``device``: ``"sync"`` (host clock between two syncs) or ``"events"``
    (CUDA events; falls back to ``"sync"`` off CUDA)."""
    import torch

    device = torch.device(device)
    if method == "events" and device.type == "cuda":
        return EventTimer(device_context=lambda: torch.cuda.device(device))
    return SyncTimer(sync_for(device))


# --------------------------------------------------------------------------- measurement


@dataclass
class Measurement:
    """One variant: warm-up apart, then ``repeats`` timed blocks of ``steps`` steps each."""

    name: str
    warmup_steps: int
    warmup_s: float
    steps: int
    blocks_s: list[float] = field(default_factory=list)
    method: str = "sync"

    @property
    def repeats(self) -> int:
        return len(self.blocks_s)

    @property
    def per_step_s(self) -> list[float]:
        return [b / self.steps for b in self.blocks_s]

    @property
    def median_s(self) -> float:
        """Median seconds per step over the repeats."""
        return statistics.median(self.per_step_s)

    @property
    def spread(self) -> float:
        """(max - min) / median over the repeats, as a fraction (0.05 = 5 %)."""
        per = self.per_step_s
        return (max(per) - min(per)) / self.median_s if self.median_s > 0 else math.inf

    @property
    def timed_s(self) -> float:
        return sum(self.blocks_s)


def calibrate(fn: Callable[[], object], timer, target_s: float, max_steps: int = 1_000_000) -> int:
    """Smallest step count (roughly) whose block takes at least ``target_s``.

    Times a block of 1 step, then grows it (at most 10x at a time, from the last measurement)
    until a block reaches the target. The calibration blocks are discarded.
    """
    steps = 1
    while True:
        elapsed = timer(fn, steps)
        if elapsed >= target_s or steps >= max_steps:
            return steps
        grow = 10.0 if elapsed <= 0 else min(10.0, 1.2 * target_s / elapsed)
        steps = min(max_steps, max(steps + 1, math.ceil(steps * grow)))


def compare(
    variants: Mapping[str, Callable[[], object]],
    *,
    timer=None,
    warmup: int = 1,
    repeats: int | None = None,
    min_seconds: float | None = None,
    steps: int | None = None,
    max_steps: int = 1_000_000,
    warmup_clock: Callable[[], float] | None = None,
    rotate: bool = True,
) -> dict[str, Measurement]:
    """Measure every variant (``name -> step()``, a callable doing one step) fairly.

    Phase 1, one variant after the other: ``warmup`` steps timed on their own (``warmup_s``),
    then the block size is calibrated so that ``repeats`` blocks add up to ``min_seconds``
    (or fixed by ``steps``). Phase 2: ``repeats`` rounds; in each, every variant times one
    block, the starting variant rotating from round to round.
    """
    timer = timer or SyncTimer()
    repeats = repeats or DEFAULT_REPEATS
    min_seconds = DEFAULT_MIN_SECONDS if min_seconds is None else min_seconds
    names = list(variants)
    results: dict[str, Measurement] = {}
    for name in names:
        fn = variants[name]
        warm_s = timer(fn, warmup) if warmup > 0 else 0.0
        n = steps or calibrate(fn, timer, min_seconds / repeats, max_steps)
        results[name] = Measurement(name, warmup, warm_s, n, method=timer.method)
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)] if rotate else names
        for name in order:
            results[name].blocks_s.append(timer(variants[name], results[name].steps))
    return results


# --------------------------------------------------------------------------- memory


def peak_memory_above_baseline(fn: Callable[[], object], device, steps: int = 2) -> int | None:
    """Bytes allocated at the peak of ``steps`` calls of ``fn`` above what was allocated just
    before them (weights, optimizer state, resident data): the memory the steps themselves need.
    ``None`` off CUDA, where PyTorch keeps no allocator statistics."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    baseline = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(steps):
        fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - baseline


# --------------------------------------------------------------------------- precision


def _effective(module, parent: str) -> str:
    value = getattr(module, "fp32_precision", "none")
    return value if value != "none" else (parent if parent != "none" else "ieee")


def precision_state(device="cuda", torch_module=None) -> dict:
    """How float32 matmuls and convolutions run right now on ``device``'s backend.

    Returns ``{"matmul": "ieee"|"tf32"|"bf16", "conv": ..., "api": "fp32_precision"|"legacy",
    "float32_matmul_precision": "highest"|"high"|"medium"|"unreadable"}``.

    On torch >= 2.9 the per-backend ``fp32_precision`` settings exist and are read first (they
    never raise). ``torch.get_float32_matmul_precision()`` raises a RuntimeError there once the
    process has mixed the two APIs, so it is only read for information.
    """
    torch = torch_module
    if torch is None:
        import torch
    dev_type = getattr(device, "type", str(device).split(":")[0])
    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:
        legacy = "unreadable"
    backends = torch.backends
    if hasattr(backends.cuda.matmul, "fp32_precision") or hasattr(backends, "fp32_precision"):
        parent = getattr(backends, "fp32_precision", "none")
        if dev_type == "cuda":
            matmul, conv = backends.cuda.matmul, backends.cudnn.conv
        else:
            matmul, conv = backends.mkldnn.matmul, backends.mkldnn.conv
        return {
            "matmul": _effective(matmul, parent),
            "conv": _effective(conv, parent),
            "api": "fp32_precision",
            "float32_matmul_precision": legacy,
        }
    if dev_type == "cuda":
        matmul = "tf32" if backends.cuda.matmul.allow_tf32 else "ieee"
        conv = "tf32" if backends.cudnn.allow_tf32 else "ieee"
    else:
        matmul, conv = ("bf16" if legacy == "medium" else "ieee"), "ieee"
    return {"matmul": matmul, "conv": conv, "api": "legacy", "float32_matmul_precision": legacy}


def precision_label(device="cuda", state: dict | None = None) -> str:
    """Short table cell for the fp32 precision state, e.g. ``"matmul ieee, conv tf32"``."""
    s = state or precision_state(device)
    return f"matmul {s['matmul']}, conv {s['conv']}"


@contextlib.contextmanager
def matmul_precision(mode: str, torch_module=None):
    """Run the block with CUDA float32 matmuls in ``"tf32"`` or ``"ieee"``, then restore.

    Uses ``torch.backends.cuda.matmul.fp32_precision`` where it exists (torch >= 2.9), else
    ``torch.set_float32_matmul_precision("high" | "highest")``. Affects only GPU matmuls.
    """
    if mode not in ("tf32", "ieee"):
        raise ValueError(f"mode must be 'tf32' or 'ieee', not {mode!r}")
    torch = torch_module
    if torch is None:
        import torch
    mm = torch.backends.cuda.matmul
    if hasattr(mm, "fp32_precision"):
        old = mm.fp32_precision
        mm.fp32_precision = mode
        try:
            yield
        finally:
            mm.fp32_precision = old
    else:
        old = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high" if mode == "tf32" else "highest")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(old)


# --------------------------------------------------------------------------- tables


def md_table(title: str, headers: list[str], rows: Iterable[Iterable[object]], note: str = "") -> None:
    """Print a markdown table under a ``#### title`` line; every row must have one cell per header."""
    rows = [[str(c) for c in r] for r in rows]
    for r in rows:
        if len(r) != len(headers):
            raise ValueError(f"row {r} has {len(r)} cells for {len(headers)} headers")
    print(f"#### {title}\n")
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" for _ in headers) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if note:
        print("\n" + note)
    print()


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.3f}" if ms < 1 else (f"{ms:.2f}" if ms < 100 else f"{ms:.0f}")


def timing_cells(m: Measurement) -> list[str]:
    """The cells for ``TIMING_HEADERS``: median ms per step, spread, repeats x steps, warm-up s."""
    return [fmt_ms(m.median_s), f"{100 * m.spread:.1f} %", f"{m.repeats} x {m.steps}", f"{m.warmup_s:.2f}"]


def skipped_cells() -> list[str]:
    """Placeholder cells for ``TIMING_HEADERS`` in the row of a variant that did not run."""
    return ["-"] * len(TIMING_HEADERS)


def timing_note(results: Mapping[str, Measurement] | None = None) -> str:
    """One line under a table saying how its figures were measured."""
    method = next(iter(results.values())).method if results else "sync"
    parts = [
        f"Median per step over the repeats; spread = (max - min) / median; each block of steps "
        f"timed between two {'CUDA events' if method == 'CUDA events' else 'synchronizations'}; "
        f"variants interleaved; warm-up timed apart and left out."
    ]
    if QUICK:
        parts.append("QUICK mode (WORKBENCH_NOTEBOOK_QUICK=1): short blocks, figures only check the code.")
    return " ".join(parts)
