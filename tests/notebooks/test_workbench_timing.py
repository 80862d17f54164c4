"""Unit tests of notebooks/workbench_timing.py, the timing helper the starter notebooks share.

A fake clock advances only when a fake step "runs", so every figure is exact: warm-up kept
apart, one synchronization (or one pair of CUDA events) per block and not per step, blocks
calibrated to the time budget, median and spread, variants interleaved. Fake torch modules
stand in for the two precision APIs (the torch >= 2.9 ``fp32_precision`` settings and the
legacy getter that raises once the two are mixed).
"""

import importlib.util
import itertools
import sys
import types
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "notebooks" / "workbench_timing.py"


@pytest.fixture(scope="module")
def wt():
    spec = importlib.util.spec_from_file_location("workbench_timing_under_test", PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.reads = 0

    def __call__(self):
        self.reads += 1
        return self.now


class FakeDevice:
    """Steps advance the clock; sync() counts calls; events read the clock when recorded."""

    def __init__(self, clock):
        self.clock, self.syncs, self.log = clock, 0, []

    def step(self, name, cost):
        def run():
            self.clock.now += cost(name) if callable(cost) else cost
            self.log.append(name)

        return run

    def sync(self):
        self.syncs += 1


def test_sync_timer_syncs_twice_per_block_not_per_step(wt):
    clock = FakeClock()
    dev = FakeDevice(clock)
    timer = wt.SyncTimer(sync=dev.sync, clock=clock)
    assert timer(dev.step("a", 0.01), 50) == pytest.approx(0.5)
    assert dev.syncs == 2, "one sync before and one after the block"
    assert clock.reads == 2
    assert len(dev.log) == 50


def test_event_timer_uses_two_events_per_block(wt):
    clock = FakeClock()
    dev = FakeDevice(clock)
    made = []

    class FakeEvent:
        def __init__(self):
            self.t, self.synced = None, 0
            made.append(self)

        def record(self):
            self.t = clock.now

        def synchronize(self):
            self.synced += 1

        def elapsed_time(self, other):
            return (other.t - self.t) * 1000.0  # milliseconds, like torch.cuda.Event

    entered = []

    class Ctx:
        def __enter__(self):
            entered.append(True)

        def __exit__(self, *exc):
            return False

    timer = wt.EventTimer(event_factory=FakeEvent, device_context=Ctx)
    assert timer(dev.step("a", 0.002), 10) == pytest.approx(0.02)
    assert len(made) == 2
    assert made[0].synced == 0
    assert made[1].synced == 1
    assert entered == [True], "the device is made current while timing"
    assert dev.syncs == 0


def test_compare_keeps_warmup_apart_and_calibrates_to_the_budget(wt):
    clock = FakeClock()
    dev = FakeDevice(clock)
    calls = {"n": 0}

    def cost(name):
        calls["n"] += 1
        return 5.0 if calls["n"] == 1 else 0.001  # the first call "compiles"

    timer = wt.SyncTimer(sync=dev.sync, clock=clock)
    res = wt.compare({"v": dev.step("v", cost)}, timer=timer, warmup=3, repeats=4, min_seconds=1.0)
    m = res["v"]
    assert m.warmup_steps == 3
    assert m.warmup_s == pytest.approx(5.002)
    assert m.repeats == 4
    assert m.steps * 0.001 >= 1.0 / 4 * 0.999, "each block reaches min_seconds / repeats"
    assert m.timed_s >= 0.999
    assert m.median_s == pytest.approx(0.001), "the compile step is not in the figure"
    assert m.spread == pytest.approx(0.0, abs=1e-9)
    assert dev.syncs % 2 == 0


def test_compare_median_and_spread(wt):
    clock = FakeClock()
    dev = FakeDevice(clock)
    costs = iter([0.0, 0.01, 0.012, 0.011, 0.03, 0.009])  # warm-up, then one cost per block
    res = wt.compare(
        {"v": dev.step("v", lambda _: next(costs))}, timer=wt.SyncTimer(dev.sync, clock), warmup=1, repeats=5, steps=1
    )
    m = res["v"]
    assert m.per_step_s == pytest.approx([0.010, 0.012, 0.011, 0.030, 0.009])
    assert m.median_s == pytest.approx(0.011)
    assert m.spread == pytest.approx((0.030 - 0.009) / 0.011)
    cells = wt.timing_cells(m)
    assert cells == ["11.00", f"{100 * (0.021 / 0.011):.1f} %", "5 x 1", "0.00"]
    assert len(cells) == len(wt.TIMING_HEADERS)


def test_compare_interleaves_variants_with_rotation(wt):
    clock = FakeClock()
    dev = FakeDevice(clock)
    variants = {k: dev.step(k, 0.01) for k in "abc"}
    wt.compare(variants, timer=wt.SyncTimer(dev.sync, clock), warmup=1, repeats=3, steps=2)
    timed = dev.log[3:]  # after one warm-up step each
    rounds = [timed[i : i + 6] for i in range(0, 18, 6)]
    assert [r[::2] for r in rounds] == [list("abc"), list("bca"), list("cab")]
    assert all(r[0::2] == r[1::2] for r in rounds), "a block is steps of one variant"


def test_calibrate_grows_at_most_tenfold(wt):
    seen = []

    def timer(fn, steps):
        seen.append(steps)
        return steps * 1e-6

    assert wt.calibrate(lambda: None, timer, target_s=0.01) >= 10_000
    assert all(b <= 10 * a for a, b in itertools.pairwise(seen))


def fake_torch(new_api, legacy_raises=False, **values):
    def getter():
        if legacy_raises:
            raise RuntimeError("mixed legacy and new APIs")
        return values.get("legacy", "highest")

    set_calls = []
    t = types.SimpleNamespace(
        get_float32_matmul_precision=getter, set_float32_matmul_precision=set_calls.append, set_calls=set_calls
    )
    cuda_mm = types.SimpleNamespace(allow_tf32=values.get("allow_tf32", False))
    cudnn = types.SimpleNamespace(allow_tf32=values.get("cudnn_tf32", True))
    b = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=cuda_mm), cudnn=cudnn)
    if new_api:
        b.fp32_precision = values.get("global", "none")
        cuda_mm.fp32_precision = values.get("matmul", "none")
        cudnn.conv = types.SimpleNamespace(fp32_precision=values.get("conv", "tf32"))
        b.mkldnn = types.SimpleNamespace(
            matmul=types.SimpleNamespace(fp32_precision="none"), conv=types.SimpleNamespace(fp32_precision="none")
        )
    t.backends = b
    return t


def test_precision_state_new_api_when_the_legacy_getter_raises(wt):
    t = fake_torch(True, legacy_raises=True, matmul="tf32")
    s = wt.precision_state("cuda", torch_module=t)
    assert s == {"matmul": "tf32", "conv": "tf32", "api": "fp32_precision", "float32_matmul_precision": "unreadable"}
    assert wt.precision_label("cuda", s) == "matmul tf32, conv tf32"


def test_precision_state_new_api_inherits_the_global_setting(wt):
    t = fake_torch(True, matmul="none", conv="none", **{"global": "ieee"})
    assert wt.precision_state("cuda", torch_module=t)["matmul"] == "ieee"
    t = fake_torch(True, matmul="none", conv="none", **{"global": "tf32"})
    s = wt.precision_state("cuda", torch_module=t)
    assert (s["matmul"], s["conv"]) == ("tf32", "tf32")
    assert wt.precision_state("cpu", torch_module=fake_torch(True))["matmul"] == "ieee"


def test_precision_state_legacy_api(wt):
    t = fake_torch(False, legacy="high", allow_tf32=True, cudnn_tf32=False)
    s = wt.precision_state("cuda", torch_module=t)
    assert s == {"matmul": "tf32", "conv": "ieee", "api": "legacy", "float32_matmul_precision": "high"}
    assert wt.precision_state("cpu", torch_module=fake_torch(False, legacy="medium"))["matmul"] == "bf16"


def test_matmul_precision_sets_and_restores_both_apis(wt):
    t = fake_torch(True, matmul="ieee")
    with wt.matmul_precision("tf32", torch_module=t):
        assert t.backends.cuda.matmul.fp32_precision == "tf32"
    assert t.backends.cuda.matmul.fp32_precision == "ieee"
    t = fake_torch(False, legacy="highest")
    with wt.matmul_precision("tf32", torch_module=t):
        pass
    assert t.set_calls == ["high", "highest"]
    with (
        pytest.raises(ValueError, match="mode must be 'tf32' or 'ieee', not 'fast'"),
        wt.matmul_precision("fast", torch_module=t),
    ):
        pass


def test_precision_state_on_the_installed_torch(wt):
    import torch

    s = wt.precision_state("cpu")
    assert s["matmul"] in ("ieee", "tf32", "bf16")
    assert s["conv"] in ("ieee", "tf32", "bf16")
    before = wt.precision_state("cuda")
    with wt.matmul_precision("tf32"):
        assert wt.precision_state("cuda")["matmul"] == "tf32"
    assert wt.precision_state("cuda") == before
    del torch


def test_md_table_refuses_a_row_with_a_missing_cell(wt, capsys):
    wt.md_table("ok", ["a", "b"], [[1, 2]], note="a note")
    out = capsys.readouterr().out
    assert "#### ok" in out
    assert "| 1 | 2 |" in out
    assert "a note" in out
    with pytest.raises(ValueError, match="1 cells for 2 headers"):
        wt.md_table("bad", ["a", "b"], [[1]])


def test_quick_mode_from_the_environment(monkeypatch):
    for value, repeats in (("1", 3), ("", 5)):
        monkeypatch.setenv("WORKBENCH_NOTEBOOK_QUICK", value)
        spec = importlib.util.spec_from_file_location("wt_env", PATH)
        mod = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, mod)  # dataclasses look their module up
        spec.loader.exec_module(mod)
        assert repeats == mod.DEFAULT_REPEATS
        assert (mod.DEFAULT_MIN_SECONDS < 1.0) == (value == "1")
