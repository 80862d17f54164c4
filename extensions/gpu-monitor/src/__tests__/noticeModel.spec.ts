import { describe, expect, it } from 'vitest';
import {
  countdownText,
  diffNotices,
  formatCountdown,
  INotice,
  localDeadline,
  sharingText,
  sharingTitle,
  soonest,
  toastText
} from '../noticeModel';

function notice(over: Partial<INotice> = {}): INotice {
  return {
    id: '1',
    kind: 'idle',
    message:
      'Your server will be stopped at 10:30 because its GPU has been idle for 20 min.',
    hint: 'Use the GPU to keep it.',
    stop_at: '2026-12-03T10:30:00+00:00',
    seconds_left: 600,
    ...over
  };
}

describe('formatCountdown', () => {
  it.each([
    [0, '0:00'],
    [-5, '0:00'],
    [0.2, '0:01'],
    [59, '0:59'],
    [60, '1:00'],
    [581, '9:41'],
    [3723, '1:02:03']
  ])('%s s reads %s', (seconds, text) => {
    expect(formatCountdown(seconds)).toBe(text);
  });
});

describe('localDeadline', () => {
  it('adds the seconds the server counted to the time the answer arrived here', () => {
    expect(localDeadline(notice({ seconds_left: 90 }), 1_000_000)).toBe(
      1_090_000
    );
  });
  it('has no deadline without seconds_left', () => {
    expect(localDeadline(notice({ seconds_left: null }), 5)).toBeNull();
  });
});

describe('soonest and countdownText', () => {
  it('counts down to the stop that comes first', () => {
    const a = notice({ id: 'a', seconds_left: 500 });
    const b = notice({ id: 'b', kind: 'preempt', seconds_left: 100 });
    expect(soonest([a, b])?.id).toBe('b');
    expect(soonest([])).toBeNull();
    expect(soonest([notice({ seconds_left: null })])?.id).toBe('1');
  });
  it.each([
    ['idle', 581, 'GPU idle: stops in 9:41'],
    ['preempt', 60, 'GPU reserved: stops in 1:00'],
    ['idle', 0, 'GPU idle: stopping now'],
    ['other', null, 'Notice: see the notice']
  ])('%s with %s s left reads %s', (kind, left, text) => {
    expect(
      countdownText(notice({ kind: kind as string }), left as number | null)
    ).toBe(text);
  });
});

describe('toastText', () => {
  it('keeps short messages and cuts long ones at a word within 140 characters', () => {
    expect(toastText('short')).toBe('short');
    const long = 'word '.repeat(60);
    const cut = toastText(long);
    expect(cut.length).toBeLessThanOrEqual(140);
    expect(cut.endsWith('…')).toBe(true);
    expect(cut).not.toMatch(/wor…$/);
  });
});

describe('diffNotices', () => {
  it('tells new, changed and withdrawn notices apart', () => {
    const a = notice({ id: 'a' });
    const b = notice({ id: 'b' });
    const b2 = notice({ id: 'b', stop_at: '2026-12-03T10:40:00+00:00' });
    const c = notice({ id: 'c' });
    expect(diffNotices([a, b], [b2, c])).toEqual({
      added: [c],
      changed: [b2],
      removed: ['a']
    });
    expect(diffNotices([a], [notice({ id: 'a', seconds_left: 5 })])).toEqual({
      added: [],
      changed: [],
      removed: []
    });
  });
});

describe('sharingText', () => {
  const gpu = (others: number, slots = 4, uuid = 'GPU-a') => ({
    uuid,
    slots,
    others
  });
  it.each([
    [undefined, null],
    [[], null],
    [[gpu(0)], 'GPU time-sliced: yours alone now'],
    [[gpu(1)], 'GPU shared with 1 other'],
    [[gpu(3)], 'GPU shared with 3 others'],
    [[gpu(1), gpu(2, 4, 'GPU-b')], 'GPUs shared with up to 2 others'],
    [[gpu(0), gpu(0, 2, 'GPU-b')], 'GPUs time-sliced: yours alone now']
  ])('%j -> %s', (sharing, text) => {
    expect(sharingText(sharing)).toBe(text);
  });

  it('names each GPU and warns that memory is not divided', () => {
    const title = sharingTitle([gpu(2, 4, 'GPU-sim-00-t4-16gb')]);
    expect(title).toContain(
      'GPU-sim-00-t4-16gb: time-sliced, up to 4 servers; 2 other servers on it now'
    );
    expect(title).toContain('divides its time, not its memory');
  });
});
