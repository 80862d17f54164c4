import { describe, expect, it } from 'vitest';
import {
  backoffDelay,
  chartPath,
  formatBytes,
  formatGpuStatus,
  formatMemory,
  GPUHistory,
  IDLE_HINT_TEXT,
  IdleHintRule,
  IGPUReading,
  ISnapshot,
  sliceText,
  memoryLevel,
  RingBuffer,
  SSEParser,
  stateText
} from '../model';

const GIB = 1024 ** 3;

function gpu(over: Partial<IGPUReading> = {}): IGPUReading {
  return {
    uuid: 'GPU-sim-00-h100-80gb',
    name: 'H100',
    cuda_index: 0,
    state: 'ok',
    memory_used_bytes: 12 * GIB,
    memory_total_bytes: 80 * GIB,
    utilization_percent: 37.4,
    temperature_c: 50,
    power_w: 300,
    processes: [],
    ...over
  };
}

function snap(t: number, util: number | null, busy = 1): ISnapshot {
  return {
    source: 'simulated',
    state: 'ok',
    timestamp: t,
    gpus: [gpu({ utilization_percent: util })],
    kernels: { busy, total: 1 }
  };
}

describe('formatting', () => {
  it('formats bytes', () => {
    expect(formatBytes(null)).toBe('n/a');
    expect(formatBytes(512 * 1024 ** 2)).toBe('512 MiB');
    expect(formatBytes(12.34 * GIB)).toBe('12.3 GiB');
    expect(formatMemory(12 * GIB, 80 * GIB)).toBe('12.0/80.0 GiB');
  });
  it('formats one GPU for the status bar', () => {
    expect(formatGpuStatus(gpu())).toBe('GPU0 37% 12.0/80.0 GiB');
    expect(
      formatGpuStatus(
        gpu({
          utilization_percent: null,
          unsupported: { utilization_percent: 'n/a (MIG)' }
        })
      )
    ).toBe('GPU0 n/a (MIG) 12.0/80.0 GiB');
    expect(formatGpuStatus(gpu({ state: 'lost' }))).toBe('GPU0 lost');
  });
  it('names a MIG slice, its GPU, and that NVML has no utilization for it', () => {
    expect(sliceText(gpu())).toBe('');
    expect(
      sliceText(
        gpu({
          mig: true,
          index: 0,
          profile: '1g.18gb',
          parent_uuid: 'GPU-77b0',
          utilization_percent: null
        })
      )
    ).toBe(
      'MIG slice 1g.18gb of GPU 0 (GPU-77b0): NVML has no utilization counter for a MIG slice, only its memory'
    );
    expect(
      sliceText(
        gpu({ mig: true, index: 2, profile: '3g.71gb', parent_uuid: null })
      )
    ).toBe('MIG slice 3g.71gb of GPU 2');
  });
  it('flags memory above 90%', () => {
    expect(memoryLevel(gpu())).toBe('normal');
    expect(memoryLevel(gpu({ memory_used_bytes: 73 * GIB }))).toBe('high');
    expect(memoryLevel(gpu({ memory_used_bytes: null }))).toBe('normal');
  });
  it('describes states without numbers', () => {
    expect(
      stateText({ source: 'none', state: 'no-gpu', timestamp: 0, gpus: [] })
    ).toBe('GPU: no GPU assigned');
    expect(
      stateText({
        source: 'nvml',
        state: 'unavailable',
        message: 'no NVIDIA driver found',
        timestamp: 0,
        gpus: []
      })
    ).toBe('GPU: no NVIDIA driver found');
    expect(stateText(snap(0, 10))).toBeNull();
    expect(stateText(null, 'server unreachable')).toBe(
      'GPU: server unreachable'
    );
  });
});

describe('RingBuffer', () => {
  it('keeps the last items in order', () => {
    const r = new RingBuffer<number>(3);
    expect(r.toArray()).toEqual([]);
    [1, 2, 3, 4, 5].forEach(i => r.push(i));
    expect(r.toArray()).toEqual([3, 4, 5]);
    expect(r.length).toBe(3);
    expect(r.last()).toBe(5);
    r.clear();
    expect(r.length).toBe(0);
    expect(() => new RingBuffer(0)).toThrow();
  });
});

describe('GPUHistory', () => {
  it('keeps a 10-minute window, drops duplicates and merges server history', () => {
    const h = new GPUHistory(600, 1000);
    for (let t = 0; t <= 700; t += 1) {
      h.add(snap(t, t % 100));
    }
    h.add(snap(700, 1)); // duplicate timestamp ignored
    const pts = h.points('GPU-sim-00-h100-80gb');
    expect(pts[0].t).toBe(100);
    expect(pts[pts.length - 1]).toMatchObject({ t: 700, util: 0 });
    const h2 = new GPUHistory();
    h2.add(snap(10, 5));
    h2.load({
      'GPU-sim-00-h100-80gb': {
        timestamp: [8, 9, 10],
        utilization_percent: [1, 2, 3],
        memory_used_bytes: [1, 2, 3],
        temperature_c: [1, 2, 3],
        power_w: [1, 2, 3]
      }
    });
    expect(h2.points('GPU-sim-00-h100-80gb').map(p => p.t)).toEqual([8, 9, 10]);
  });
});

describe('IdleHintRule', () => {
  it('fires after 2 minutes under 30% while a kernel is busy', () => {
    const rule = new IdleHintRule();
    expect(rule.update(snap(0, 10))).toBeNull();
    expect(rule.update(snap(119, 10))).toBeNull();
    expect(rule.update(snap(120, 29))).toBe(IDLE_HINT_TEXT);
  });
  it('resets when the GPU works, the kernel idles or the counter is missing', () => {
    const rule = new IdleHintRule();
    rule.update(snap(0, 10));
    rule.update(snap(60, 80));
    expect(rule.update(snap(121, 10))).toBeNull();
    expect(rule.update(snap(200, 10, 0))).toBeNull();
    rule.update(snap(300, 10));
    expect(rule.update(snap(400, null))).toBeNull();
    expect(rule.update(snap(500, 10))).toBeNull();
  });
});

describe('backoffDelay', () => {
  it('grows exponentially, is capped and jittered', () => {
    expect(backoffDelay(0, 1000, 30000, () => 1)).toBe(1000);
    expect(backoffDelay(3, 1000, 30000, () => 1)).toBe(8000);
    expect(backoffDelay(20, 1000, 30000, () => 1)).toBe(30000);
    expect(backoffDelay(3, 1000, 30000, () => 0)).toBe(4000);
  });
});

describe('SSEParser', () => {
  it('joins chunks split anywhere and ignores comments and retry', () => {
    const p = new SSEParser();
    expect(p.feed('retry: 2000\n\n: keep-alive\n\nda')).toEqual([]);
    expect(p.feed('ta: {"a":1}\n')).toEqual([]);
    expect(p.feed('\ndata: {"b":2}\r\n\r\ndata: x')).toEqual([
      '{"a":1}',
      '{"b":2}'
    ]);
    expect(p.feed('\n\n')).toEqual(['x']);
  });
});

describe('chartPath', () => {
  it('scales into the box and breaks at gaps', () => {
    const d = chartPath(
      [
        { t: 0, v: 0 },
        { t: 50, v: 100 },
        { t: 60, v: null },
        { t: 100, v: 50 }
      ],
      { now: 100, windowSeconds: 100, width: 100, height: 10, max: 100 }
    );
    expect(d).toBe('M0.0,10.0L50.0,0.0M100.0,5.0');
  });
});

import { formatTorchMemory } from '../model';

describe('formatTorchMemory', () => {
  it('explains every case', () => {
    expect(formatTorchMemory(undefined, 0)).toBe('asking the kernel…');
    expect(formatTorchMemory(null, 0)).toContain(
      '%load_ext workbench_gpu_monitor'
    );
    expect(
      formatTorchMemory({ pid: 1, torch_imported: false, devices: [] }, 0)
    ).toBe('torch not imported');
    const report = {
      pid: 1,
      torch_imported: true,
      devices: [
        { cuda_index: 0, allocated_bytes: GIB, reserved_bytes: 2 * GIB }
      ]
    };
    expect(formatTorchMemory(report, 1)).toBe('torch has not used this GPU');
    expect(formatTorchMemory(report, 0)).toBe(
      'torch 1.0 GiB allocated · 2.0 GiB reserved (caching allocator)'
    );
  });
});

describe('GPUHistory capacity', () => {
  it('holds ten minutes at the fastest sample interval (0.25 s)', () => {
    const h = new GPUHistory(600);
    for (let i = 0; i <= 2400; i++) {
      h.add(snap(1000 + i * 0.25, 10));
    }
    const pts = h.points('GPU-sim-00-h100-80gb');
    expect(pts[0].t).toBe(1000);
    expect(pts[pts.length - 1].t).toBe(1600);
  });
});
