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
