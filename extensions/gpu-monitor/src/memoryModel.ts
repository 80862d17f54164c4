/**
 * Pure logic of the two ways a notebook runs out of memory, in words:
 * a kernel killed by the server's memory limit (the cgroup's OOM killer,
 * read from `api/gpu/memory`), and a CUDA out-of-memory exception (the GPU
 * was full; the kernel lives on). No JupyterLab imports, so vitest tests it.
 */

import { IGPUReading, ISnapshot } from './model';

const GIB = 1024 ** 3;
const MIB = 1024 ** 2;

/** `GET api/gpu/memory`: the server's memory cgroup. */
export interface IServerMemory {
  cgroup: 'v1' | 'v2' | null;
  limit_bytes: number | null;
  usage_bytes: number | null;
  oom_kills: number | null;
  last_oom_kill_at: string | null;
  source: string | null;
}

/** "16", "15.5", "0.5": GiB with at most one decimal; "512 MiB" below 1 GiB, where GiB would read 0. */
export function limitText(bytes: number): string {
  if (bytes < GIB) {
    return `${Math.max(1, Math.round(bytes / MIB))} MiB`;
  }
  return `${Number((bytes / GIB).toFixed(1))} GiB`;
}

/** The sentence for a kernel the server's memory limit killed. */
export function oomKillText(limitBytes: number | null | undefined): string {
  const limit =
    limitBytes && isFinite(limitBytes) && limitBytes > 0
      ? ` (${limitText(limitBytes)})`
      : '';
  return `Your kernel was stopped because this server reached its memory limit${limit}: use a larger profile, or load less at once`;
}

/**
 * Whether the server's OOM killer struck in the last `windowSeconds`.
 * `serverNowMs` is the server's clock (the answer's Date header) where
 * known, so a browser clock that is minutes off does not matter.
 */
export function recentOomKill(
  memory: IServerMemory | null,
  serverNowMs: number,
  windowSeconds = 60
): boolean {
  if (!memory?.last_oom_kill_at) {
    return false;
  }
  const at = Date.parse(memory.last_oom_kill_at);
  if (isNaN(at)) {
    return false;
  }
  const age = (serverNowMs - at) / 1000;
  // a second of slack: the Date header has whole seconds
  return age >= -1 && age <= windowSeconds;
}

/** A cell's error that is CUDA running out of memory (torch.cuda.OutOfMemoryError, or its message). */
export function isCudaOom(ename: string, evalue: string): boolean {
  return (
    /(^|\.)OutOfMemoryError$/.test(ename ?? '') ||
    (evalue ?? '').includes('CUDA out of memory')
  );
}

/** The CUDA ordinal PyTorch names in its message ("... GPU 0 has a total capacity of ..."), or null. */
export function cudaOomDevice(evalue: string): number | null {
  const m = /\bGPU (\d+)\b/.exec(evalue ?? '');
  return m ? Number(m[1]) : null;
}

/** "14:03:21" in this browser's time. */
export function clockTime(when: Date): string {
  return [when.getHours(), when.getMinutes(), when.getSeconds()]
    .map(n => String(n).padStart(2, '0'))
    .join(':');
}

function gpuMemory(g: IGPUReading): string {
  const label = `GPU ${g.cuda_index ?? g.index ?? '?'}`;
  if (g.memory_used_bytes === null || g.memory_used_bytes === undefined) {
    return `${label}: memory in use unknown`;
  }
  const used = (g.memory_used_bytes / GIB).toFixed(1);
  return g.memory_total_bytes
    ? `${label} had ${used} of ${(g.memory_total_bytes / GIB).toFixed(1)} GiB in use`
    : `${label} had ${used} GiB in use`;
}

/**
 * The panel's line for a CUDA out-of-memory error: "CUDA out of memory at
 * 14:03:21: GPU 0 had 79.1 of 80.0 GiB in use (simulated)", from the
 * monitor's latest reading; the GPU the error names, or every GPU of the
 * server when it names none the monitor knows.
 */
export function cudaOomText(
  snapshot: ISnapshot | null,
  when: Date,
  device: number | null
): string {
  const head = `CUDA out of memory at ${clockTime(when)}`;
  const gpus = snapshot?.gpus ?? [];
  if (!gpus.length) {
    return `${head}: the GPU monitor has no reading of the GPU's memory`;
  }
  const named = gpus.filter(g => device !== null && g.cuda_index === device);
  const shown = (named.length ? named : gpus).map(gpuMemory).join('; ');
  const simulated = snapshot?.source === 'simulated' ? ' (simulated)' : '';
  return `${head}: ${shown}${simulated}`;
}
