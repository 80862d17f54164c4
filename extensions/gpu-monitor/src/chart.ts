/**
 * Scales, axes and paths of the panel's charts: pure functions, unit-tested with vitest.
 *
 * Every chart has a fixed scale where the quantity has one (0–100 %
 * utilization, 0–device total memory, 0–power limit) so a glance compares
 * two moments or two GPUs; the time axis always spans the full window
 * (10 minutes), ending at the latest sample.
 */

import { formatBytes, IGPUReading, IPoint, ITorchReport } from './model';

const GIB = 1024 ** 3;

/** A tick on an axis: where it is (0 = bottom/left, 1 = top/right) and what it says. */
export interface IAxisTick {
  fraction: number;
  label: string;
}

/** The smallest "nice" number (1, 2, 2.5, 5 × 10^k) that is at least `value`. */
export function niceCeil(value: number): number {
  if (!(value > 0) || !isFinite(value)) {
    return 1;
  }
  const power = 10 ** Math.floor(Math.log10(value));
  for (const m of [1, 2, 2.5, 5, 10]) {
    if (m * power >= value * (1 - 1e-9)) {
      return m * power;
    }
  }
  return 10 * power;
}

/** Largest finite value of a series, or 0. */
export function seriesMax(values: (number | null | undefined)[]): number {
  let max = 0;
  for (const v of values) {
    if (v !== null && v !== undefined && isFinite(v) && v > max) {
      max = v;
    }
  }
  return max;
}

export type Metric = 'util' | 'mem' | 'temp' | 'power';

/** One chart's vertical scale: its top value, the unit, and the tick labels. */
export interface IScale {
  max: number;
  unit: string;
  /** True when the top is a property of the device (100 %, total memory, power limit), not of the data. */
  fixed: boolean;
  ticks: IAxisTick[];
}

/** A number without useless decimals: 80, 39.8, 2.5, 0. */
function trim(value: number, decimals = 1): string {
  const s = value.toFixed(decimals);
  return s.includes('.') ? s.replace(/\.?0+$/, '') : s;
}

/** Tick labels at the bottom, middle and top of a 0–max scale, with the unit on each. */
export function valueTicks(max: number, unit: string, scale = 1): IAxisTick[] {
  return [0, 0.5, 1].map(fraction => ({
    fraction,
    label: `${trim((max * fraction) / scale)}${unit === '%' ? '' : ' '}${unit}`
  }));
}

/**
 * The scale of one metric for one GPU.  Fixed where the device defines it:
 * utilization 0–100 %, memory 0–total (GiB), power 0–enforced limit,
 * temperature 0–100 °C; a series that has no such bound, or that exceeds it,
 * gets the next nice number above its largest value.
 */
export function metricScale(
  metric: Metric,
  gpu: IGPUReading,
  points: IPoint[]
): IScale {
  const observed = seriesMax(points.map(p => p[metric]));
  switch (metric) {
    case 'util':
      return { max: 100, unit: '%', fixed: true, ticks: valueTicks(100, '%') };
    case 'mem': {
      const total = gpu.memory_total_bytes;
      const fixed = !!total && total > 0;
      const max = fixed
        ? (total as number)
        : niceCeil(Math.max(observed, GIB) / GIB) * GIB;
      return { max, unit: 'GiB', fixed, ticks: valueTicks(max, 'GiB', GIB) };
    }
    case 'temp': {
      const max = observed > 100 ? niceCeil(observed) : 100;
      return {
        max,
        unit: '°C',
        fixed: max === 100,
        ticks: valueTicks(max, '°C')
      };
    }
    case 'power': {
      const limit = gpu.power_limit_w;
      const fixed = !!limit && limit > 0 && observed <= (limit as number);
      const max = fixed ? (limit as number) : niceCeil(Math.max(observed, 1));
      return { max, unit: 'W', fixed, ticks: valueTicks(max, 'W') };
    }
  }
}

/**
 * Ticks of the time axis: one every `stepSeconds` over the window, "now" at
 * the right end ("−10 min", "−5 min", "now" by default: three labels fit the
 * narrowest side panel).
 */
export function timeTicks(windowSeconds = 600, stepSeconds = 300): IAxisTick[] {
  const ticks: IAxisTick[] = [];
  for (let ago = windowSeconds; ago >= 0; ago -= stepSeconds) {
    const label = ago === 0 ? 'now' : `−${trim(ago / 60)} min`;
    ticks.push({ fraction: (windowSeconds - ago) / windowSeconds, label });
  }
  return ticks;
}

/** The current value of a metric with its unit, as the chart's header shows it. */
export function formatMetric(
  metric: Metric,
  value: number | null | undefined
): string {
  if (value === null || value === undefined || !isFinite(value)) {
    return 'n/a';
  }
  switch (metric) {
    case 'util':
      return `${Math.round(value)} %`;
    case 'mem':
      return formatBytes(value);
    case 'temp':
      return `${Math.round(value)} °C`;
    case 'power':
      return `${Math.round(value)} W`;
  }
}

/**
 * SVG path of one series on a `width` × `height` plot whose right edge is
 * `now` and left edge `now - windowSeconds`; broken where values are missing
 * or where two samples are further apart than `maxGapSeconds` (a tab that
 * could not get the server's history for that time shows a gap, not a
 * straight line across it).
 */
export function seriesPath(
  points: { t: number; v: number | null | undefined }[],
  opts: {
    now: number;
    windowSeconds: number;
    width: number;
    height: number;
    max: number;
    maxGapSeconds?: number;
  }
): string {
  const { now, windowSeconds, width, height } = opts;
  const max = opts.max > 0 ? opts.max : 1;
  const start = now - windowSeconds;
  const gap = opts.maxGapSeconds ?? Infinity;
  const parts: string[] = [];
  let pen = false;
  let lastT = -Infinity;
  for (const p of points) {
    if (
      p.v === null ||
      p.v === undefined ||
      !isFinite(p.v) ||
      p.t < start ||
      p.t > now
    ) {
      pen = false;
      continue;
    }
    if (p.t - lastT > gap) {
      pen = false;
    }
    const x = ((p.t - start) / windowSeconds) * width;
    const y = height - (Math.min(Math.max(p.v, 0), max) / max) * height;
    parts.push(`${pen ? 'L' : 'M'}${x.toFixed(1)},${y.toFixed(1)}`);
    pen = true;
    lastT = p.t;
  }
  return parts.join('');
}

/** Horizontal lines across the plot at each value (torch's reserved memory on the memory chart). */
export function levelPath(
  values: number[],
  opts: { width: number; height: number; max: number }
): string {
  const max = opts.max > 0 ? opts.max : 1;
  return values
    .filter(v => isFinite(v) && v >= 0)
    .map(
      v =>
        `M0,${(opts.height - (Math.min(v, max) / max) * opts.height).toFixed(1)}H${opts.width}`
    )
    .join('');
}

/** One notebook kernel's PyTorch memory on one GPU. */
export interface IKernelMemory {
  label: string;
  reserved: number;
  allocated: number;
}

/** The torch device entry of a kernel's report that is this GPU: by UUID when both know it, else CUDA index. */
export function torchDeviceFor(
  report: ITorchReport | null | undefined,
  gpu: Pick<IGPUReading, 'uuid' | 'cuda_index'>
): ITorchReport['devices'][number] | undefined {
  if (!report || !report.torch_imported) {
    return undefined;
  }
  return (
    report.devices.find(d => d.uuid !== undefined && d.uuid === gpu.uuid) ??
    report.devices.find(
      d => d.uuid === undefined && d.cuda_index === gpu.cuda_index
    )
  );
}

/** The kernels whose torch holds memory on this GPU, largest reservation first. */
export function kernelMemory(
  reports: { path: string; report: ITorchReport | null }[],
  gpu: Pick<IGPUReading, 'uuid' | 'cuda_index'>
): IKernelMemory[] {
  const out: IKernelMemory[] = [];
  for (const r of reports) {
    const d = torchDeviceFor(r.report, gpu);
    if (d && d.reserved_bytes > 0) {
      out.push({
        label: r.path,
        reserved: d.reserved_bytes,
        allocated: d.allocated_bytes
      });
    }
  }
  return out.sort((a, b) => b.reserved - a.reserved);
}

/** A piece of the memory bar beside the chart: a share of the device total. */
export interface ISegment {
  kind: 'torch' | 'other' | 'free';
  label: string;
  bytes: number;
  fraction: number;
  /** For torch segments: the part of the reservation held by live tensors (0–1 of the segment). */
  allocatedFraction?: number;
}

/**
 * The device total split into what each kernel's caching allocator reserved,
 * the rest of the used memory (CUDA contexts, non-torch use, other processes,
 * the driver) and free memory.  Torch segments are clipped to what the
 * device reports as used, so the bar never exceeds the total even when the
 * two readings are a few seconds apart.
 */
export function memoryBreakdown(
  used: number | null,
  total: number | null,
  kernels: IKernelMemory[]
): ISegment[] {
  if (!total || total <= 0 || used === null) {
    return [];
  }
  const segments: ISegment[] = [];
  let left = Math.min(Math.max(used, 0), total);
  for (const k of kernels) {
    const bytes = Math.min(k.reserved, left);
    left -= bytes;
    segments.push({
      kind: 'torch',
      label: k.label,
      bytes,
      fraction: bytes / total,
      allocatedFraction:
        k.reserved > 0 ? Math.min(1, k.allocated / k.reserved) : 0
    });
  }
  segments.push({
    kind: 'other',
    label: 'other use',
    bytes: left,
    fraction: left / total
  });
  const free = total - Math.min(Math.max(used, 0), total);
  segments.push({
    kind: 'free',
    label: 'free',
    bytes: free,
    fraction: free / total
  });
  return segments;
}
