/**
 * Pure logic of the hub's notices ("your server will be stopped at 10:30
 * because ..."): types, the countdown text, and the deadline in this
 * browser's clock. No JupyterLab imports, so vitest tests it.
 */

export interface INotice {
  id: string;
  kind: string;
  message: string;
  hint: string;
  stop_at: string | null;
  seconds_left: number | null;
  /** The hub is stopping this server now (sent once more right before it stops it). */
  stopping?: boolean;
}

/** One of this server's time-sliced GPUs: how many servers it takes, how many others hold it now. */
export interface ISharing {
  uuid: string;
  slots: number;
  others: number;
}

export interface INoticeList {
  now: string;
  notices: INotice[];
  sharing?: ISharing[];
}

/**
 * The status-bar words for this server's time-sliced GPUs, or null when it
 * holds its GPUs alone: "GPU shared with 2 others", "GPU time-sliced: yours
 * alone now"; with several GPUs, the most crowded one speaks for them.
 */
export function sharingText(sharing: ISharing[] | undefined): string | null {
  if (!sharing || sharing.length === 0) {
    return null;
  }
  const others = Math.max(...sharing.map(s => s.others));
  const noun = sharing.length === 1 ? 'GPU' : 'GPUs';
  if (others === 0) {
    return `${noun} time-sliced: yours alone now`;
  }
  return `${noun} shared with ${sharing.length === 1 ? '' : 'up to '}${others} other${others === 1 ? '' : 's'}`;
}

/** The tooltip: each GPU, its servers at most and the others on it now. */
export function sharingTitle(sharing: ISharing[]): string {
  const lines = sharing.map(
    s =>
      `${s.uuid}: time-sliced, up to ${s.slots} servers; ${s.others} other server${s.others === 1 ? '' : 's'} on it now`
  );
  return [
    ...lines,
    '',
    'A time-sliced GPU divides its time, not its memory: the other servers use the same GPU memory.'
  ].join('\n');
}

/** "9:41", "1:02:03", "0:00"; whole seconds, never negative. */
export function formatCountdown(seconds: number): string {
  const total = Math.max(0, Math.ceil(seconds));
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const s = total % 60;
  const ss = String(s).padStart(2, '0');
  return h > 0 ? `${h}:${String(m).padStart(2, '0')}:${ss}` : `${m}:${ss}`;
}

/**
 * When the stop happens, in this browser's clock (ms since the epoch).
 *
 * The server counted ``seconds_left`` with its own clock when it answered;
 * adding it to the time the answer arrived here keeps the countdown right
 * even if this computer's clock is minutes off.
 */
export function localDeadline(
  notice: INotice,
  receivedAtMs: number
): number | null {
  if (
    notice.seconds_left === null ||
    notice.seconds_left === undefined ||
    !isFinite(notice.seconds_left)
  ) {
    return null;
  }
  return receivedAtMs + notice.seconds_left * 1000;
}

/** The first notice that will stop the server soonest (the one the status bar counts down to). */
export function soonest(notices: INotice[]): INotice | null {
  let best: INotice | null = null;
  for (const n of notices) {
    if (n.seconds_left === null) {
      continue;
    }
    if (best === null || (best.seconds_left ?? Infinity) > n.seconds_left) {
      best = n;
    }
  }
  return best ?? notices[0] ?? null;
}

/** The status-bar text: "GPU idle: stops in 9:41", or the kind's words. */
export function countdownText(
  notice: INotice,
  secondsLeft: number | null
): string {
  const what =
    notice.kind === 'idle'
      ? 'GPU idle'
      : notice.kind === 'preempt'
        ? 'GPU reserved'
        : 'Notice';
  if (secondsLeft === null) {
    return `${what}: see the notice`;
  }
  return secondsLeft <= 0
    ? `${what}: stopping now`
    : `${what}: stops in ${formatCountdown(secondsLeft)}`;
}

/** A JupyterLab toast shows at most 140 characters: cut at a word, with an ellipsis. */
export function toastText(message: string, limit = 140): string {
  if (message.length <= limit) {
    return message;
  }
  const cut = message.slice(0, limit - 1);
  const space = cut.lastIndexOf(' ');
  return (space > limit / 2 ? cut.slice(0, space) : cut) + '…';
}

/** What changed between two lists, so a notification is shown once per notice and updated, not repeated. */
export function diffNotices(
  before: INotice[],
  after: INotice[]
): { added: INotice[]; changed: INotice[]; removed: string[] } {
  const old = new Map(before.map(n => [n.id, n]));
  const now = new Set(after.map(n => n.id));
  const added = after.filter(n => !old.has(n.id));
  const changed = after.filter(n => {
    const o = old.get(n.id);
    return (
      o !== undefined &&
      (o.message !== n.message || o.hint !== n.hint || o.stop_at !== n.stop_at)
    );
  });
  const removed = before.filter(n => !now.has(n.id)).map(n => n.id);
  return { added, changed, removed };
}

/** How often to ask for notices: every 10 s, every 2 s while a stop is under a minute away or under way. */
export const POLL_MS = 10_000;
export const URGENT_POLL_MS = 2_000;

export function pollDelay(
  notices: INotice[],
  receivedAtMs: number,
  nowMs: number
): number {
  for (const n of notices) {
    const deadline = localDeadline(n, receivedAtMs);
    if (n.stopping || (deadline !== null && deadline - nowMs < 60_000)) {
      return URGENT_POLL_MS;
    }
  }
  return POLL_MS;
}

/** What starts a save round: a notice's countdown reaching 0, or the hub saying it is stopping now. */
export type SaveTrigger = 'countdown' | 'stopping';

/**
 * The save rounds due now, each at most once per notice and trigger: `done`
 * holds the keys ("<id>:<trigger>") of rounds already started. A notice first
 * seen stopping is one round (its countdown is over too), marked for both.
 */
export function dueSaveRounds(
  notices: INotice[],
  receivedAtMs: number,
  nowMs: number,
  done: ReadonlySet<string>
): { notice: INotice; trigger: SaveTrigger; keys: string[] }[] {
  const due: { notice: INotice; trigger: SaveTrigger; keys: string[] }[] = [];
  for (const n of notices) {
    const countdown = `${n.id}:countdown`;
    const stopping = `${n.id}:stopping`;
    if (n.stopping && !done.has(stopping)) {
      due.push({ notice: n, trigger: 'stopping', keys: [stopping, countdown] });
      continue;
    }
    const deadline = localDeadline(n, receivedAtMs);
    if (deadline !== null && deadline <= nowMs && !done.has(countdown)) {
      due.push({ notice: n, trigger: 'countdown', keys: [countdown] });
    }
  }
  return due;
}

/** One save round's outcome: the paths saved and the paths that could not be saved. */
export interface ISaveRound {
  saved: string[];
  failed: string[];
}

/**
 * Everything saved for one notice so far (a notice may have two rounds): a
 * path saved once stays saved; a path fails only if its last try failed.
 */
export function mergeRounds(before: ISaveRound, round: ISaveRound): ISaveRound {
  const saved = [...before.saved];
  for (const path of round.saved) {
    if (!saved.includes(path)) {
      saved.push(path);
    }
  }
  const failed = [
    ...before.failed.filter(p => !round.saved.includes(p)),
    ...round.failed.filter(p => !before.failed.includes(p))
  ];
  return { saved, failed };
}

/**
 * The body of `POST api/gpu/saves` after a round: what this round saved (the
 * server adds up the rounds' counts and names), and this tab's failures so
 * far (the server keeps each tab's latest: a later round retries them).
 */
export function saveReport(
  noticeId: string,
  client: string,
  round: ISaveRound,
  tally: ISaveRound
): {
  notice_id: string;
  client: string;
  saved: number;
  failed: number;
  names: string[];
} {
  return {
    notice_id: noticeId,
    client,
    saved: round.saved.length,
    failed: tally.failed.length,
    names: round.saved.slice(0, 50)
  };
}

function plural(n: number, noun: string): string {
  return `${n} ${noun}${n === 1 ? '' : 's'}`;
}

function baseName(path: string): string {
  return path.slice(path.lastIndexOf('/') + 1) || path;
}

/** "a.ipynb", "a.ipynb and b.py", "a.ipynb, b.py and 2 more". */
export function nameList(paths: string[], most = 2): string {
  const names = paths.map(baseName);
  if (names.length <= most) {
    return names.length === 2 ? names.join(' and ') : names.join('');
  }
  return `${names.slice(0, most).join(', ')} and ${names.length - most} more`;
}

/**
 * The status-bar words after a save round: "saved 3 notebooks before
 * stopping", "saved 2 notebooks and 1 file before stopping", "all work saved
 * before stopping" when nothing needed saving; failures are named ("could not
 * save data.csv").
 */
export function savedText(tally: ISaveRound): string {
  const notebooks = tally.saved.filter(p => p.endsWith('.ipynb')).length;
  const files = tally.saved.length - notebooks;
  const failed = tally.failed.length
    ? `could not save ${nameList(tally.failed)}`
    : '';
  if (notebooks === 0 && files === 0) {
    return failed
      ? `${failed} before stopping`
      : 'all work saved before stopping';
  }
  const what =
    notebooks && files
      ? `${plural(notebooks, 'notebook')} and ${plural(files, 'file')}`
      : notebooks
        ? plural(notebooks, 'notebook')
        : plural(files, 'file');
  return `saved ${what} before stopping${failed ? `; ${failed}` : ''}`;
}

/** The tooltip: every path saved and every path that could not be saved. */
export function savedTitle(tally: ISaveRound): string {
  const lines: string[] = [];
  if (tally.saved.length) {
    lines.push(
      'Saved before the server stops:',
      ...tally.saved.map(p => `  ${p}`)
    );
  }
  if (tally.failed.length) {
    lines.push(
      'Could not save (copy what you need now):',
      ...tally.failed.map(p => `  ${p}`)
    );
  }
  if (!lines.length) {
    lines.push('No open document had unsaved changes.');
  }
  return lines.join('\n');
}
