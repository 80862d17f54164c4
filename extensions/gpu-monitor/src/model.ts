/**
 * Pure logic of the GPU monitor frontend: types, formatting, history,
 * the idle-GPU hint, back-off and the server-sent-events parser.
 * No JupyterLab imports here, so it is unit-tested with vitest.
 */

export interface IGPUProcess {
  pid: number;
  name: string;
  memory_used_bytes: number | null;
  own?: boolean;
}

export interface IGPUReading {
  uuid: string;
  name: string;
  index?: number;
  cuda_index?: number | null;
  mig?: boolean;
  profile?: string | null;
  parent_uuid?: string | null;
  state?: string;
  message?: string;
  memory_used_bytes: number | null;
  memory_total_bytes: number | null;
  memory_reserved_bytes?: number | null;
  utilization_percent: number | null;
  temperature_c: number | null;
  power_w: number | null;
  power_limit_w?: number | null;
  processes: IGPUProcess[];
  memory_attribution?: string;
  memory_note?: string;
  unsupported?: { [key: string]: string };
}

export interface IHistorySeries {
  timestamp: number[];
  utilization_percent: (number | null)[];
  memory_used_bytes: (number | null)[];
  temperature_c: (number | null)[];
  power_w: (number | null)[];
}

export interface ISnapshot {
  source: string;
  state?: string;
  message?: string;
  timestamp: number;
  interval_seconds?: number;
  gpus: IGPUReading[];
  kernels?: { busy: number; total: number };
  history?: { [uuid: string]: IHistorySeries };
}

const GIB = 1024 ** 3;
const MIB = 1024 ** 2;

/** "12.3 GiB", "512 MiB"; "n/a" for null. */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !isFinite(bytes)) {
    return 'n/a';
  }
  if (bytes >= GIB) {
    return `${(bytes / GIB).toFixed(1)} GiB`;
  }
  return `${Math.round(bytes / MIB)} MiB`;
}

/** Used / total as "12.3/80.0 GiB". */
export function formatMemory(
  used: number | null,
  total: number | null
): string {
  if (used === null || total === null || total === undefined) {
    return used === null ? 'n/a' : formatBytes(used);
  }
  return `${(used / GIB).toFixed(1)}/${(total / GIB).toFixed(1)} GiB`;
}

/**
 * What a MIG slice is, in words, for its card: its profile and its GPU, and
 * plainly that NVML has no utilization for a slice. Empty for a whole GPU.
 */
export function sliceText(gpu: IGPUReading): string {
  if (!gpu.mig) {
    return '';
  }
  const profile = gpu.profile ? ` ${gpu.profile}` : '';
  const parent = gpu.parent_uuid ? ` (${gpu.parent_uuid})` : '';
  const what = `MIG slice${profile} of GPU ${gpu.index ?? '?'}${parent}`;
  const noUtil =
    gpu.utilization_percent === null || gpu.utilization_percent === undefined
      ? ': NVML has no utilization counter for a MIG slice, only its memory'
      : '';
  return what + noUtil;
}

/** Utilization as "37%", or the reason it is missing ("n/a (MIG)"). */
export function formatUtilization(gpu: IGPUReading): string {
  if (
    gpu.utilization_percent === null ||
    gpu.utilization_percent === undefined
  ) {
    return gpu.unsupported?.utilization_percent ?? 'n/a';
  }
  return `${Math.round(gpu.utilization_percent)}%`;
}

export function memoryFraction(gpu: IGPUReading): number | null {
  if (!gpu.memory_total_bytes || gpu.memory_used_bytes === null) {
    return null;
  }
  return gpu.memory_used_bytes / gpu.memory_total_bytes;
}

/** "high" above 90% memory (status bar turns red), else "normal". */
export function memoryLevel(
  gpu: IGPUReading,
  threshold = 0.9
): 'high' | 'normal' {
  const f = memoryFraction(gpu);
  return f !== null && f > threshold ? 'high' : 'normal';
}

/** Label of one GPU in the status bar: "GPU0 37% 12.3/80.0 GiB". */
export function formatGpuStatus(gpu: IGPUReading): string {
  const label = `GPU${gpu.cuda_index ?? gpu.index ?? ''}`;
  if (gpu.state && gpu.state !== 'ok') {
    return `${label} ${gpu.state === 'lost' ? 'lost' : 'error'}`;
  }
  return `${label} ${formatUtilization(gpu)} ${formatMemory(gpu.memory_used_bytes, gpu.memory_total_bytes)}`;
}

/** The state line for snapshots without GPU numbers, or null when there are numbers to show. */
export function stateText(
  s: ISnapshot | null,
  error: string | null = null
): string | null {
  if (error) {
    return `GPU: ${error}`;
  }
  if (!s) {
    return 'GPU: connecting…';
  }
  if (s.state === 'no-gpu') {
    return 'GPU: no GPU assigned';
  }
  if (s.state === 'unavailable' || s.state === 'error' || s.gpus.length === 0) {
    return `GPU: ${s.message || 'unavailable'}`;
  }
  return null;
}

/** A fixed-size ring buffer: the last `capacity` items, oldest first. */
export class RingBuffer<T> {
  private items: (T | undefined)[];
  private start = 0;
  private count = 0;

  constructor(readonly capacity: number) {
    if (capacity < 1) {
      throw new Error('capacity must be at least 1');
    }
    this.items = new Array(capacity);
  }

  get length(): number {
    return this.count;
  }

  push(item: T): void {
    const end = (this.start + this.count) % this.capacity;
    this.items[end] = item;
    if (this.count < this.capacity) {
      this.count++;
    } else {
      this.start = (this.start + 1) % this.capacity;
    }
  }

  last(): T | undefined {
    return this.count
      ? this.items[(this.start + this.count - 1) % this.capacity]
      : undefined;
  }

  toArray(): T[] {
    const out: T[] = [];
    for (let i = 0; i < this.count; i++) {
      out.push(this.items[(this.start + i) % this.capacity] as T);
    }
    return out;
  }

  clear(): void {
    this.start = 0;
    this.count = 0;
    this.items = new Array(this.capacity);
  }
}

export interface IPoint {
  t: number; // seconds since the epoch
  util: number | null;
  mem: number | null;
  temp: number | null;
  power: number | null;
}

/** Seconds between two samples at the fastest the server allows (sampler.MIN_INTERVAL_SECONDS). */
export const MIN_INTERVAL_SECONDS = 0.25;

/**
 * Ten minutes of points per GPU, keyed by UUID.  The default capacity holds
 * the whole window at the fastest sample interval, so a faster sampler never
 * shortens what the charts show.
 */
export class GPUHistory {
  readonly series = new Map<string, RingBuffer<IPoint>>();

  constructor(
    readonly windowSeconds = 600,
    readonly capacity = Math.ceil(windowSeconds / MIN_INTERVAL_SECONDS) + 16
  ) {}

  private ring(uuid: string): RingBuffer<IPoint> {
    let ring = this.series.get(uuid);
    if (!ring) {
      ring = new RingBuffer<IPoint>(this.capacity);
      this.series.set(uuid, ring);
    }
    return ring;
  }

  private pushPoint(uuid: string, p: IPoint): void {
    const ring = this.ring(uuid);
    const last = ring.last();
    if (last && p.t <= last.t) {
      return; // duplicate or out-of-order sample (reconnect replays the latest)
    }
    ring.push(p);
  }

  add(s: ISnapshot): void {
    for (const g of s.gpus) {
      this.pushPoint(g.uuid, {
        t: s.timestamp,
        util: g.utilization_percent,
        mem: g.memory_used_bytes,
        temp: g.temperature_c,
        power: g.power_w
      });
    }
  }

  /** Merge the server's compact history (sent on panel open / reconnect). */
  load(history: { [uuid: string]: IHistorySeries }): void {
    for (const uuid of Object.keys(history)) {
      const h = history[uuid];
      const merged = [...this.points(uuid)];
      h.timestamp.forEach((t, i) =>
        merged.push({
          t,
          util: h.utilization_percent[i],
          mem: h.memory_used_bytes[i],
          temp: h.temperature_c[i],
          power: h.power_w[i]
        })
      );
      merged.sort((a, b) => a.t - b.t);
      const ring = this.ring(uuid);
      ring.clear();
      for (const p of merged) {
        const last = ring.last();
        if (!last || p.t > last.t) {
          ring.push(p);
        }
      }
    }
  }

  /** Points of one GPU within the window ending at `now`. */
  points(uuid: string, now?: number): IPoint[] {
    const ring = this.series.get(uuid);
    if (!ring) {
      return [];
    }
    const all = ring.toArray();
    const end = now ?? (all.length ? all[all.length - 1].t : 0);
    return all.filter(p => p.t >= end - this.windowSeconds);
  }
}

export const IDLE_HINT_TEXT =
  'GPU utilization under 30% for 2 minutes while your notebook runs: the input pipeline may be the ' +
  'bottleneck, try DataLoader num_workers and pin_memory.';

/**
 * The idle-GPU hint: utilization of every GPU under `threshold` % for
 * `durationSeconds` while at least one kernel is busy.  Any sample that
 * breaks the condition (GPU busy, kernel idle, no utilization counter) resets it.
 */
export class IdleHintRule {
  private since: number | null = null;

  constructor(
    readonly threshold = 30,
    readonly durationSeconds = 120
  ) {}

  update(s: ISnapshot): string | null {
    const busy = (s.kernels?.busy ?? 0) > 0;
    const utils = s.gpus.map(g => g.utilization_percent);
    const idle =
      utils.length > 0 && utils.every(u => u !== null && u < this.threshold);
    if (!busy || !idle) {
      this.since = null;
      return null;
    }
    if (this.since === null) {
      this.since = s.timestamp;
    }
    return s.timestamp - this.since >= this.durationSeconds
      ? IDLE_HINT_TEXT
      : null;
  }

  reset(): void {
    this.since = null;
  }
}

/** Delay before reconnect attempt `attempt` (0-based): exponential with jitter, capped. */
export function backoffDelay(
  attempt: number,
  baseMs = 1000,
  maxMs = 30000,
  random: () => number = Math.random
): number {
  const exp = Math.min(maxMs, baseMs * 2 ** Math.max(0, attempt));
  return Math.round(exp * (0.5 + 0.5 * random()));
}

/** Incremental parser for text/event-stream: feed chunks, get complete `data` payloads. */
export class SSEParser {
  private buffer = '';

  feed(chunk: string): string[] {
    this.buffer += chunk.replace(/\r\n?/g, '\n');
    const events: string[] = [];
    let end: number;
    while ((end = this.buffer.indexOf('\n\n')) >= 0) {
      const block = this.buffer.slice(0, end);
      this.buffer = this.buffer.slice(end + 2);
      const data: string[] = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('data:')) {
          data.push(line.slice(5).replace(/^ /, ''));
        }
      }
      if (data.length) {
        events.push(data.join('\n'));
      }
    }
    return events;
  }
}

/** SVG path for one series over a time window, broken at missing values. */
export function chartPath(
  points: { t: number; v: number | null }[],
  opts: {
    now: number;
    windowSeconds: number;
    width: number;
    height: number;
    max: number;
  }
): string {
  const { now, windowSeconds, width, height } = opts;
  const max = opts.max > 0 ? opts.max : 1;
  let d = '';
  let pen = false;
  for (const p of points) {
    if (p.v === null || p.v === undefined || p.t < now - windowSeconds) {
      pen = false;
      continue;
    }
    const x = ((p.t - (now - windowSeconds)) / windowSeconds) * width;
    const y = height - (Math.min(Math.max(p.v, 0), max) / max) * height;
    d += `${pen ? 'L' : 'M'}${x.toFixed(1)},${y.toFixed(1)}`;
    pen = true;
  }
  return d;
}

/** A kernel's answer to `workbench_gpu_request` (see workbench_gpu_monitor/kernel.py). */
export interface ITorchReport {
  pid: number;
  torch_imported: boolean;
  torch_version?: string | null;
  devices: {
    cuda_index: number;
    uuid?: string;
    allocated_bytes: number;
    reserved_bytes: number;
  }[];
}

/**
 * One line per notebook for the panel: PyTorch's allocated / reserved memory
 * on the GPU with this CUDA ordinal, or why there is no number.
 */
export function formatTorchMemory(
  report: ITorchReport | null | undefined,
  cudaIndex: number | null | undefined
): string {
  if (report === undefined) {
    return 'asking the kernel…';
  }
  if (report === null) {
    return 'no answer: run %load_ext workbench_gpu_monitor in the notebook';
  }
  if (!report.torch_imported) {
    return 'torch not imported';
  }
  const device = report.devices.find(d => d.cuda_index === cudaIndex);
  if (!device) {
    return 'torch has not used this GPU';
  }
  return `torch ${formatBytes(device.allocated_bytes)} allocated · ${formatBytes(device.reserved_bytes)} reserved (caching allocator)`;
}
