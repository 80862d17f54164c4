import { Notification, showDialog, Dialog } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import {
  countdownText,
  diffNotices,
  dueSaveRounds,
  INotice,
  INoticeList,
  ISaveRound,
  ISharing,
  localDeadline,
  mergeRounds,
  pollDelay,
  savedText,
  savedTitle,
  saveReport,
  SaveTrigger,
  sharingText,
  sharingTitle,
  soonest,
  toastText
} from './noticeModel';

/** This tab's name for the server: made once at load, sent on every poll and save report. */
function makeClientId(): string {
  const bytes = new Uint8Array(12);
  crypto.getRandomValues(bytes); // works over plain http too, unlike randomUUID
  return Array.from(bytes, b => b.toString(16).padStart(2, '0')).join('');
}

/**
 * The hub's notices for this server: a JupyterLab notification per notice and
 * a status-bar countdown to the soonest stop; without one, the status bar
 * says whether this server's GPU is time-sliced ("GPU shared with 2 others").
 *
 * Reads ``api/gpu/notices?client=<this tab>`` (posted there by the
 * workbench service on the hub) every 10 s, every 2 s while a stop is under a
 * minute away or under way; hidden tabs poll too, since their unsaved work
 * must be saved as well. The countdown ticks every second from the last
 * answer, in this browser's clock.
 *
 * Before a stop it saves: when a notice's countdown reaches 0, and again as
 * soon as a notice says the hub is stopping the server now, every open
 * document with unsaved changes is saved (`saveDocuments`), the status bar
 * says what was saved, and the round is reported to the server
 * (``POST api/gpu/saves``), where the hub's service reads it.
 */
export class NoticeStatusItem extends Widget {
  private notices: INotice[] = [];
  private sharing: ISharing[] = [];
  private receivedAt = 0;
  private toasts = new Map<string, string>();
  private pollTimer: number | null = null;
  private tickTimer: number | null = null;
  readonly clientId = makeClientId();
  private roundsDone = new Set<string>();
  private tallies = new Map<string, ISaveRound>();
  private lastTally: string | null = null;
  private saving: Promise<void> = Promise.resolve();

  constructor(
    private settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
    private saveDocuments: (() => Promise<ISaveRound>) | null = null
  ) {
    super();
    this.addClass('jp-WorkbenchGPU-notice');
    this.node.hidden = true;
    this.node.addEventListener('click', () => void this.showDetails());
    document.addEventListener('visibilitychange', this.onVisibility);
  }

  start(): void {
    void this.poll();
    this.tickTimer = window.setInterval(() => {
      this.startDueRounds();
      this.render();
    }, 1000);
  }

  dispose(): void {
    if (this.pollTimer !== null) {
      window.clearTimeout(this.pollTimer);
    }
    if (this.tickTimer !== null) {
      window.clearInterval(this.tickTimer);
    }
    document.removeEventListener('visibilitychange', this.onVisibility);
    super.dispose();
  }

  private onVisibility = (): void => {
    if (!document.hidden) {
      void this.poll();
    }
  };

  private async poll(): Promise<void> {
    if (this.pollTimer !== null) {
      window.clearTimeout(this.pollTimer);
      this.pollTimer = null;
    }
    try {
      const url =
        URLExt.join(this.settings.baseUrl, 'api/gpu/notices') +
        `?client=${encodeURIComponent(this.clientId)}`;
      const response = await ServerConnection.makeRequest(
        url,
        { cache: 'no-store' } as RequestInit,
        this.settings
      );
      if (response.ok) {
        this.receive((await response.json()) as INoticeList);
      }
    } catch {
      // The server is restarting or gone: keep the last notices and try again.
    }
    if (!this.isDisposed && this.pollTimer === null) {
      this.pollTimer = window.setTimeout(
        () => void this.poll(),
        pollDelay(this.notices, this.receivedAt, Date.now())
      );
    }
  }

  /** Starts the save rounds now due, one after another, each once per notice and trigger. */
  private startDueRounds(): void {
    if (!this.saveDocuments) {
      return;
    }
    const due = dueSaveRounds(
      this.notices,
      this.receivedAt,
      Date.now(),
      this.roundsDone
    );
    for (const { notice, trigger, keys } of due) {
      keys.forEach(k => this.roundsDone.add(k));
      this.saving = this.saving.then(() => this.saveRound(notice, trigger));
    }
  }

  private async saveRound(
    notice: INotice,
    trigger: SaveTrigger
  ): Promise<void> {
    let round: ISaveRound;
    try {
      round = await this.saveDocuments!();
    } catch (reason) {
      console.warn('workbench-gpu-monitor: save round failed', reason);
      round = { saved: [], failed: [] };
    }
    const before = this.tallies.get(notice.id) ?? { saved: [], failed: [] };
    const tally = mergeRounds(before, round);
    this.tallies.set(notice.id, tally);
    this.lastTally = notice.id;
    this.render();
    const body = JSON.stringify(
      saveReport(notice.id, this.clientId, round, tally)
    );
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        const response = await ServerConnection.makeRequest(
          URLExt.join(this.settings.baseUrl, 'api/gpu/saves'),
          {
            method: 'POST',
            body,
            keepalive: true,
            headers: { 'Content-Type': 'application/json' }
          } as RequestInit,
          this.settings
        );
        if (response.ok || response.status === 400) {
          if (!response.ok) {
            console.warn(
              `workbench-gpu-monitor: save report refused (${trigger}): ${await response.text()}`
            );
          }
          return;
        }
      } catch {
        // the server is busy stopping: try again once or twice
      }
      await new Promise(resolve => window.setTimeout(resolve, 1000));
    }
  }

  private receive(list: INoticeList): void {
    const { added, changed, removed } = diffNotices(this.notices, list.notices);
    this.notices = list.notices;
    this.sharing = list.sharing ?? [];
    this.receivedAt = Date.now();
    for (const id of [...this.tallies.keys()]) {
      if (!list.notices.some(n => n.id === id)) {
        this.tallies.delete(id); // the hub took the notice back: the stop is off
      }
    }
    for (const key of [...this.roundsDone]) {
      const id = key.slice(0, key.lastIndexOf(':'));
      if (!list.notices.some(n => n.id === id)) {
        this.roundsDone.delete(key); // a notice posted again later saves again
      }
    }
    for (const id of removed) {
      const toast = this.toasts.get(id);
      if (toast) {
        Notification.dismiss(toast);
        this.toasts.delete(id);
      }
    }
    for (const n of added) {
      const id = Notification.warning(toastText(n.message), {
        autoClose: false,
        actions: [
          { label: 'How to keep it', callback: () => void this.showDetails(n) }
        ]
      });
      this.toasts.set(n.id, id);
    }
    for (const n of changed) {
      const id = this.toasts.get(n.id);
      if (id) {
        Notification.update({
          id,
          message: toastText(n.message),
          type: 'warning',
          autoClose: false
        });
      }
    }
    this.startDueRounds();
    this.render();
  }

  private secondsLeft(n: INotice): number | null {
    const deadline = localDeadline(n, this.receivedAt);
    return deadline === null ? null : (deadline - Date.now()) / 1000;
  }

  render(): void {
    const n = soonest(this.notices);
    const shared = sharingText(this.sharing);
    this.node.hidden = n === null && shared === null;
    if (n === null) {
      this.node.textContent = shared ?? '';
      this.node.dataset.kind = shared === null ? '' : 'shared';
      this.node.title = shared === null ? '' : sharingTitle(this.sharing);
      return;
    }
    const tally =
      this.lastTally === null ? undefined : this.tallies.get(this.lastTally);
    const text = tally
      ? savedText(tally)
      : countdownText(n, this.secondsLeft(n));
    if (this.node.textContent !== text) {
      this.node.textContent = text;
    }
    this.node.dataset.kind = n.kind;
    this.node.dataset.saves = tally
      ? tally.failed.length
        ? 'failed'
        : 'saved'
      : '';
    const saves = tally ? `${savedTitle(tally)}\n\n` : '';
    this.node.title = `${saves}${n.message}\n\n${n.hint}\n\nClick for details.`;
  }

  private async showDetails(notice?: INotice): Promise<void> {
    const n = notice ?? soonest(this.notices);
    if (!n) {
      return;
    }
    const body = document.createElement('div');
    body.className = 'jp-WorkbenchGPU-noticeDialog';
    for (const text of [n.message, n.hint]) {
      if (text) {
        const p = document.createElement('p');
        p.textContent = text;
        body.appendChild(p);
      }
    }
    await showDialog({
      title: 'Your server will be stopped',
      body: new Widget({ node: body }),
      buttons: [Dialog.okButton({ label: 'OK' })]
    });
  }
}
