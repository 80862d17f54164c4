import { describe, expect, it } from 'vitest';
import {
  formatMetric,
  kernelMemory,
  levelPath,
  memoryBreakdown,
  metricScale,
  niceCeil,
  seriesMax,
  seriesPath,
  timeTicks,
  torchDeviceFor,
  valueTicks
} from '../chart';
import { IGPUReading, IPoint, ITorchReport } from '../model';

const GIB = 1024 ** 3;

function gpu(over: Partial<IGPUReading> = {}): IGPUReading {
  return {
    uuid: 'GPU-sim-00-h100-80gb',
    name: 'H100',
    cuda_index: 0,
    memory_used_bytes: 12 * GIB,
    memory_total_bytes: 80 * GIB,
    utilization_percent: 37,
    temperature_c: 50,
    power_w: 300,
    power_limit_w: 700,
    processes: [],
    ...over
  };
}

function pts(values: Partial<IPoint>[]): IPoint[] {
  return values.map((v, i) => ({
    t: i,
    util: null,
    mem: null,
    temp: null,
    power: null,
    ...v
  }));
}

describe('nice numbers', () => {
  it('rounds up to 1, 2, 2.5, 5 x 10^k', () => {
    expect(niceCeil(0)).toBe(1);
    expect(niceCeil(7)).toBe(10);
    expect(niceCeil(10)).toBe(10);
    expect(niceCeil(11)).toBe(20);
    expect(niceCeil(212)).toBe(250);
    expect(niceCeil(480)).toBe(500);
    expect(niceCeil(0.3)).toBeCloseTo(0.5);
  });
  it('finds the largest finite value', () => {
    expect(seriesMax([null, 3, undefined, NaN, 7, 2])).toBe(7);
    expect(seriesMax([])).toBe(0);
  });
});

describe('value axes', () => {
  it('labels bottom, middle and top with the unit', () => {
    expect(valueTicks(100, '%')).toEqual([
      { fraction: 0, label: '0%' },
      { fraction: 0.5, label: '50%' },
      { fraction: 1, label: '100%' }
    ]);
    expect(valueTicks(80 * GIB, 'GiB', GIB).map(t => t.label)).toEqual([
      '0 GiB',
      '40 GiB',
      '80 GiB'
    ]);
    expect(valueTicks(79.6 * GIB, 'GiB', GIB).map(t => t.label)).toEqual([
      '0 GiB',
      '39.8 GiB',
      '79.6 GiB'
    ]);
  });

  it('utilization is always 0-100 %, whatever the data', () => {
    const s = metricScale('util', gpu(), pts([{ util: 3 }, { util: 4 }]));
    expect(s.max).toBe(100);
    expect(s.fixed).toBe(true);
    expect(s.ticks.map(t => t.label)).toEqual(['0%', '50%', '100%']);
  });

  it('memory is 0 to the device total, not to the largest value seen', () => {
    const s = metricScale('mem', gpu(), pts([{ mem: 1 * GIB }]));
    expect(s.max).toBe(80 * GIB);
    expect(s.fixed).toBe(true);
    expect(s.ticks[2].label).toBe('80 GiB');
    // no total (a device that does not report it): a nice number above the data
    const free = metricScale(
      'mem',
      gpu({ memory_total_bytes: null }),
      pts([{ mem: 3 * GIB }])
    );
    expect(free.fixed).toBe(false);
    expect(free.max).toBe(5 * GIB);
  });

  it('power is 0 to the enforced limit; temperature 0-100 °C unless exceeded', () => {
    expect(
      metricScale('power', gpu(), pts([{ power: 650 }])).ticks.map(t => t.label)
    ).toEqual(['0 W', '350 W', '700 W']);
    const noLimit = metricScale(
      'power',
      gpu({ power_limit_w: null }),
      pts([{ power: 212 }])
    );
    expect(noLimit.max).toBe(250);
    expect(noLimit.fixed).toBe(false);
    expect(metricScale('temp', gpu(), pts([{ temp: 60 }])).max).toBe(100);
    expect(metricScale('temp', gpu(), pts([{ temp: 104 }])).max).toBe(200);
  });

  it('formats the current value with its unit', () => {
    expect(formatMetric('util', 37.4)).toBe('37 %');
    expect(formatMetric('mem', 12 * GIB)).toBe('12.0 GiB');
    expect(formatMetric('temp', 55.2)).toBe('55 °C');
    expect(formatMetric('power', 299.6)).toBe('300 W');
    expect(formatMetric('util', null)).toBe('n/a');
  });
});

describe('time axis', () => {
  it('spans ten minutes, labelled every five, "now" at the right', () => {
    const ticks = timeTicks();
    expect(ticks.map(t => t.label)).toEqual(['−10 min', '−5 min', 'now']);
    expect(ticks.map(t => t.fraction)).toEqual([0, 0.5, 1]);
    expect(timeTicks(600, 120).map(t => t.fraction)).toEqual([
      0, 0.2, 0.4, 0.6, 0.8, 1
    ]);
    expect(timeTicks(600, 60)).toHaveLength(11);
  });
});

describe('seriesPath', () => {
  const opts = {
    now: 600,
    windowSeconds: 600,
    width: 600,
    height: 100,
    max: 100
  };

  it('maps the window to the full width and the scale to the full height', () => {
    expect(
      seriesPath(
        [
          { t: 0, v: 0 },
          { t: 300, v: 50 },
          { t: 600, v: 100 }
        ],
        opts
      )
    ).toBe('M0.0,100.0L300.0,50.0L600.0,0.0');
  });

  it('a minute of history sits in the last tenth of a ten-minute axis', () => {
    const d = seriesPath(
      [
        { t: 540, v: 10 },
        { t: 600, v: 10 }
      ],
      opts
    );
    expect(d).toBe('M540.0,90.0L600.0,90.0');
  });

  it('clamps values to the scale and drops points outside the window', () => {
    expect(
      seriesPath(
        [
          { t: -10, v: 50 },
          { t: 100, v: 150 },
          { t: 200, v: -5 }
        ],
        opts
      )
    ).toBe('M100.0,0.0L200.0,100.0');
  });

  it('breaks at missing values and at gaps longer than maxGapSeconds', () => {
    expect(
      seriesPath(
        [
          { t: 0, v: 1 },
          { t: 1, v: null },
          { t: 2, v: 1 }
        ],
        opts
      )
    ).toBe('M0.0,99.0M2.0,99.0');
    const gapped = seriesPath(
      [
        { t: 0, v: 1 },
        { t: 1, v: 1 },
        { t: 100, v: 1 }
      ],
      { ...opts, maxGapSeconds: 5 }
    );
    expect(gapped).toBe('M0.0,99.0L1.0,99.0M100.0,99.0');
  });

  it('draws level lines for reserved memory', () => {
    expect(
      levelPath([20 * GIB], { width: 600, height: 100, max: 80 * GIB })
    ).toBe('M0,75.0H600');
    expect(levelPath([], { width: 600, height: 100, max: 1 })).toBe('');
  });
});

describe('torch memory beside the device total', () => {
  const report = (devices: ITorchReport['devices']): ITorchReport => ({
    pid: 1,
    torch_imported: true,
    devices
  });

  it('finds this GPU in a kernel report by UUID, else by CUDA index', () => {
    const g = gpu({ uuid: 'GPU-abc', cuda_index: 1 });
    const byUuid = report([
      { cuda_index: 0, uuid: 'GPU-abc', allocated_bytes: 1, reserved_bytes: 2 },
      {
        cuda_index: 1,
        uuid: 'GPU-other',
        allocated_bytes: 3,
        reserved_bytes: 4
      }
    ]);
    expect(torchDeviceFor(byUuid, g)?.reserved_bytes).toBe(2);
    expect(
      torchDeviceFor(
        report([{ cuda_index: 1, allocated_bytes: 3, reserved_bytes: 4 }]),
        g
      )?.reserved_bytes
    ).toBe(4);
    expect(torchDeviceFor(null, g)).toBeUndefined();
    expect(
      torchDeviceFor({ pid: 1, torch_imported: false, devices: [] }, g)
    ).toBeUndefined();
  });

  it('lists kernels that reserved memory, largest first', () => {
    const ks = kernelMemory(
      [
        {
          path: 'a.ipynb',
          report: report([
            { cuda_index: 0, allocated_bytes: GIB, reserved_bytes: 2 * GIB }
          ])
        },
        {
          path: 'b.ipynb',
          report: report([
            { cuda_index: 0, allocated_bytes: GIB, reserved_bytes: 6 * GIB }
          ])
        },
        {
          path: 'c.ipynb',
          report: report([
            { cuda_index: 0, allocated_bytes: 0, reserved_bytes: 0 }
          ])
        },
        { path: 'd.ipynb', report: null }
      ],
      gpu()
    );
    expect(ks.map(k => k.label)).toEqual(['b.ipynb', 'a.ipynb']);
  });

  it('splits the device total into torch reserved per kernel, other use and free', () => {
    const segs = memoryBreakdown(12 * GIB, 80 * GIB, [
      { label: 'b.ipynb', reserved: 6 * GIB, allocated: 3 * GIB },
      { label: 'a.ipynb', reserved: 2 * GIB, allocated: 2 * GIB }
    ]);
    expect(segs.map(s => [s.kind, s.bytes / GIB])).toEqual([
      ['torch', 6],
      ['torch', 2],
      ['other', 4],
      ['free', 68]
    ]);
    expect(segs[0].allocatedFraction).toBe(0.5);
    expect(segs.reduce((sum, s) => sum + s.fraction, 0)).toBeCloseTo(1);
  });

  it('never exceeds the used memory when readings are seconds apart', () => {
    const segs = memoryBreakdown(4 * GIB, 80 * GIB, [
      { label: 'a', reserved: 6 * GIB, allocated: GIB }
    ]);
    expect(segs.map(s => s.bytes / GIB)).toEqual([4, 0, 76]);
    expect(memoryBreakdown(null, 80 * GIB, [])).toEqual([]);
  });
});
