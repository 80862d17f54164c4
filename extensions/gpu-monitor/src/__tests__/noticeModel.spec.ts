import { describe, expect, it } from 'vitest';
import {
  countdownText,
  diffNotices,
  dueSaveRounds,
  formatCountdown,
  INotice,
  localDeadline,
  mergeRounds,
  nameList,
  pollDelay,
  POLL_MS,
  savedText,
  savedTitle,
  saveReport,
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

describe('pollDelay', () => {
  const at = 1_000_000;
  it('asks every 10 s while a stop is far away or unknown', () => {
    expect(pollDelay([], at, at)).toBe(POLL_MS);
    expect(pollDelay([notice({ seconds_left: 600 })], at, at)).toBe(10_000);
    expect(pollDelay([notice({ seconds_left: null })], at, at)).toBe(10_000);
  });
  it('asks every 2 s under a minute before the stop', () => {
    expect(pollDelay([notice({ seconds_left: 59 })], at, at)).toBe(2_000);
    // 90 s left when it arrived, 31 s later: under a minute now
    expect(pollDelay([notice({ seconds_left: 90 })], at, at + 31_000)).toBe(
      2_000
    );
  });
  it('asks every 2 s while the hub is stopping the server', () => {
    expect(
      pollDelay([notice({ seconds_left: null, stopping: true })], at, at)
    ).toBe(2_000);
  });
});

describe('dueSaveRounds', () => {
  const at = 1_000_000;
  it('waits while the countdown runs', () => {
    expect(
      dueSaveRounds([notice({ seconds_left: 5 })], at, at, new Set())
    ).toEqual([]);
    expect(
      dueSaveRounds([notice({ seconds_left: null })], at, at + 9e9, new Set())
    ).toEqual([]);
  });
  it('saves when the countdown reaches 0, once', () => {
    const n = notice({ seconds_left: 5 });
    const due = dueSaveRounds([n], at, at + 5000, new Set());
    expect(due).toEqual([
      { notice: n, trigger: 'countdown', keys: ['1:countdown'] }
    ]);
    expect(dueSaveRounds([n], at, at + 9000, new Set(due[0].keys))).toEqual([]);
  });
  it('saves again when the hub says stopping, once', () => {
    const n = notice({ seconds_left: 0, stopping: true });
    const due = dueSaveRounds([n], at, at, new Set(['1:countdown']));
    expect(due.map(d => d.trigger)).toEqual(['stopping']);
    expect(dueSaveRounds([n], at, at, new Set(due[0].keys))).toEqual([]);
  });
  it('a notice first seen stopping is one round, not two', () => {
    const n = notice({ seconds_left: 0, stopping: true });
    const due = dueSaveRounds([n], at, at, new Set());
    expect(due).toHaveLength(1);
    expect(due[0].keys.sort()).toEqual(['1:countdown', '1:stopping']);
  });
  it('counts each notice on its own', () => {
    const a = notice({ id: 'a', seconds_left: 0 });
    const b = notice({ id: 'b', seconds_left: 100 });
    const c = notice({ id: 'c', seconds_left: null, stopping: true });
    expect(
      dueSaveRounds([a, b, c], at, at, new Set()).map(d => d.notice.id)
    ).toEqual(['a', 'c']);
  });
});

describe('mergeRounds', () => {
  it('adds what a second round saved, once', () => {
    expect(
      mergeRounds(
        { saved: ['a.ipynb'], failed: [] },
        { saved: ['a.ipynb', 'b.py'], failed: [] }
      )
    ).toEqual({ saved: ['a.ipynb', 'b.py'], failed: [] });
  });
  it('a path that failed and then saved is saved', () => {
    expect(
      mergeRounds(
        { saved: [], failed: ['a.ipynb', 'c.txt'] },
        { saved: ['a.ipynb'], failed: ['c.txt'] }
      )
    ).toEqual({ saved: ['a.ipynb'], failed: ['c.txt'] });
  });
});

describe('saveReport', () => {
  it('carries the tab, this round, at most 50 names, and the failures so far', () => {
    const saved = Array.from({ length: 60 }, (_, i) => `n${i}.ipynb`);
    const round = { saved, failed: [] };
    const tally = { saved: ['old.ipynb', ...saved], failed: ['x.py'] };
    const body = saveReport('7', 'tab1', round, tally);
    expect(body).toMatchObject({
      notice_id: '7',
      client: 'tab1',
      saved: 60,
      failed: 1
    });
    expect(body.names).toHaveLength(50);
    expect(body.names[0]).toBe('n0.ipynb');
  });
  it('a second round with nothing unsaved adds nothing', () => {
    const body = saveReport(
      '7',
      'tab1',
      { saved: [], failed: [] },
      { saved: ['a.ipynb'], failed: [] }
    );
    expect(body).toMatchObject({ saved: 0, failed: 0, names: [] });
  });
});

describe('savedText', () => {
  it.each([
    [[], [], 'all work saved before stopping'],
    [['a.ipynb'], [], 'saved 1 notebook before stopping'],
    [
      ['a.ipynb', 'dir/b.ipynb', 'c.ipynb'],
      [],
      'saved 3 notebooks before stopping'
    ],
    [
      ['a.ipynb', 'b.ipynb', 'x.py'],
      [],
      'saved 2 notebooks and 1 file before stopping'
    ],
    [['x.py', 'y.csv'], [], 'saved 2 files before stopping'],
    [
      ['a.ipynb'],
      ['dir/data.csv'],
      'saved 1 notebook before stopping; could not save data.csv'
    ],
    [[], ['a.ipynb', 'b.py'], 'could not save a.ipynb and b.py before stopping']
  ])('%j saved, %j failed: %s', (saved, failed, text) => {
    expect(savedText({ saved, failed })).toBe(text);
  });
});

describe('nameList', () => {
  it.each([
    [['a'], 'a'],
    [['d/a', 'b'], 'a and b'],
    [['a', 'b', 'c', 'd'], 'a, b and 2 more']
  ])('%j reads %s', (paths, text) => {
    expect(nameList(paths)).toBe(text);
  });
});

describe('savedTitle', () => {
  it('names every path, failures apart', () => {
    const title = savedTitle({ saved: ['a.ipynb'], failed: ['b.py'] });
    expect(title).toContain('a.ipynb');
    expect(title).toContain('Could not save');
    expect(title).toContain('b.py');
  });
  it('says when nothing needed saving', () => {
    expect(savedTitle({ saved: [], failed: [] })).toMatch(/unsaved changes/);
  });
});
