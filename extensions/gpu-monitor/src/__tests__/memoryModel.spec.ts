import { describe, expect, it } from 'vitest';
import {
  clockTime,
  cudaOomDevice,
  cudaOomText,
  isCudaOom,
  IServerMemory,
  limitText,
  oomKillText,
  recentOomKill
} from '../memoryModel';
import { IGPUReading, ISnapshot } from '../model';

const GIB = 1024 ** 3;

describe('oomKillText', () => {
  it('names the limit in GiB', () => {
    expect(oomKillText(16 * GIB)).toBe(
      'Your kernel was stopped because this server reached its memory limit (16 GiB): use a larger profile, or load less at once'
    );
  });
  it('says it without a known limit', () => {
    const text =
      'Your kernel was stopped because this server reached its memory limit: use a larger profile, or load less at once';
    expect(oomKillText(null)).toBe(text);
    expect(oomKillText(undefined)).toBe(text);
    expect(oomKillText(0)).toBe(text);
  });
});

describe('limitText', () => {
  it.each([
    [16 * GIB, '16 GiB'],
    [15.5 * GIB, '15.5 GiB'],
    [16.04 * GIB, '16 GiB'],
    [7.96 * GIB, '8 GiB'],
    [1.25 * GIB, '1.3 GiB'],
    [512 * 1024 ** 2, '512 MiB'],
    [100, '1 MiB']
  ])('%d bytes read %s', (bytes, text) => {
    expect(limitText(bytes)).toBe(text);
  });
});

describe('recentOomKill', () => {
  const memory = (at: string | null): IServerMemory => ({
    cgroup: 'v2',
    limit_bytes: 16 * GIB,
    usage_bytes: GIB,
    oom_kills: at ? 1 : 0,
    last_oom_kill_at: at,
    source: '/sys/fs/cgroup'
  });
  const now = Date.parse('2026-12-03T10:00:00Z');
  it('is true within the last minute, by the server clock', () => {
    expect(recentOomKill(memory('2026-12-03T09:59:30+00:00'), now)).toBe(true);
    expect(recentOomKill(memory('2026-12-03T10:00:00.400Z'), now)).toBe(true);
  });
  it('is false for an old kill, none, or nonsense', () => {
    expect(recentOomKill(memory('2026-12-03T09:58:59Z'), now)).toBe(false);
    expect(recentOomKill(memory(null), now)).toBe(false);
    expect(recentOomKill(memory('yesterday'), now)).toBe(false);
    expect(recentOomKill(null, now)).toBe(false);
  });
});

describe('isCudaOom', () => {
  it.each([
    [
      'OutOfMemoryError',
      'CUDA out of memory. Tried to allocate 20.00 GiB.',
      true
    ],
    ['torch.cuda.OutOfMemoryError', 'x', true],
    ['torch.OutOfMemoryError', 'x', true],
    ['RuntimeError', 'CUDA out of memory. Tried to allocate 2.00 MiB', true],
    ['MemoryError', '', false],
    ['RuntimeError', 'CUDA error: device-side assert triggered', false],
    ['NotOutOfMemoryErrorish', '', false]
  ])('%s: %s is %s', (ename, evalue, oom) => {
    expect(isCudaOom(ename, evalue)).toBe(oom);
  });
});

describe('cudaOomDevice', () => {
  it('reads the ordinal from the message', () => {
    expect(
      cudaOomDevice(
        'CUDA out of memory. Tried to allocate 20.00 GiB. GPU 1 has a total capacity of 79.15 GiB of which 1.2 GiB is free.'
      )
    ).toBe(1);
    expect(cudaOomDevice('CUDA out of memory.')).toBeNull();
  });
});

describe('clockTime', () => {
  it('is 24-hour, padded', () => {
    expect(clockTime(new Date(2026, 11, 3, 14, 3, 21))).toBe('14:03:21');
    expect(clockTime(new Date(2026, 11, 3, 9, 5, 7))).toBe('09:05:07');
  });
});

describe('cudaOomText', () => {
  const gpu = (over: Partial<IGPUReading> = {}): IGPUReading => ({
    uuid: 'GPU-a',
    name: 'H100',
    cuda_index: 0,
    memory_used_bytes: 79.1 * GIB,
    memory_total_bytes: 80 * GIB,
    utilization_percent: 90,
    temperature_c: 60,
    power_w: 300,
    processes: [],
    ...over
  });
  const snap = (gpus: IGPUReading[], source = 'nvml'): ISnapshot => ({
    source,
    timestamp: 0,
    gpus
  });
  const when = new Date(2026, 11, 3, 14, 3, 21);
  it('shows the GPU memory at that moment, simulated said', () => {
    expect(cudaOomText(snap([gpu()], 'simulated'), when, 0)).toBe(
      'CUDA out of memory at 14:03:21: GPU 0 had 79.1 of 80.0 GiB in use (simulated)'
    );
    expect(cudaOomText(snap([gpu()]), when, null)).toBe(
      'CUDA out of memory at 14:03:21: GPU 0 had 79.1 of 80.0 GiB in use'
    );
  });
  it('shows the GPU the error names, or all of them', () => {
    const two = snap([
      gpu(),
      gpu({ uuid: 'b', cuda_index: 1, memory_used_bytes: 2 * GIB })
    ]);
    expect(cudaOomText(two, when, 1)).toBe(
      'CUDA out of memory at 14:03:21: GPU 1 had 2.0 of 80.0 GiB in use'
    );
    expect(cudaOomText(two, when, null)).toBe(
      'CUDA out of memory at 14:03:21: GPU 0 had 79.1 of 80.0 GiB in use; GPU 1 had 2.0 of 80.0 GiB in use'
    );
    expect(cudaOomText(two, when, 5)).toContain('GPU 0 had');
  });
  it('says when the monitor has no reading', () => {
    expect(cudaOomText(null, when, 0)).toBe(
      "CUDA out of memory at 14:03:21: the GPU monitor has no reading of the GPU's memory"
    );
    expect(
      cudaOomText(
        snap([gpu({ memory_used_bytes: null, memory_total_bytes: null })]),
        when,
        0
      )
    ).toBe('CUDA out of memory at 14:03:21: GPU 0: memory in use unknown');
  });
});
