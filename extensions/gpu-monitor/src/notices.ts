import { Notification, showDialog, Dialog } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import {
  countdownText,
  diffNotices,
  INotice,
  INoticeList,
  ISharing,
  localDeadline,
  sharingText,
  sharingTitle,
  soonest,
  toastText
} from './noticeModel';

const POLL_MS = 10_000;

/**
 * The hub's notices for this server: a JupyterLab notification per notice and
 * a status-bar countdown to the soonest stop; without one, the status bar
 * says whether this server's GPU is time-sliced ("GPU shared with 2 others").
 *
 * Reads ``api/gpu/notices`` (posted there by the workbench service on the
 * hub) every 10 s while the tab is visible; the countdown ticks every second
 * from the last answer, in this browser's clock.
 */
export class NoticeStatusItem extends Widget {
  private notices: INotice[] = [];
  private sharing: ISharing[] = [];
  private receivedAt = 0;
  private toasts = new Map<string, string>();
  private pollTimer: number | null = null;
  private tickTimer: number | null = null;

  constructor(
    private settings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {
    super();
    this.addClass('jp-WorkbenchGPU-notice');
    this.node.hidden = true;
    this.node.addEventListener('click', () => void this.showDetails());
    document.addEventListener('visibilitychange', this.onVisibility);
  }

  start(): void {
    void this.poll();
    this.tickTimer = window.setInterval(() => this.render(), 1000);
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
    if (!document.hidden) {
      try {
        const response = await ServerConnection.makeRequest(
          URLExt.join(this.settings.baseUrl, 'api/gpu/notices'),
          { cache: 'no-store' } as RequestInit,
          this.settings
        );
        if (response.ok) {
          this.receive((await response.json()) as INoticeList);
        }
      } catch {
        // The server is restarting or gone: keep the last notices and try again.
      }
    }
    if (!this.isDisposed) {
      this.pollTimer = window.setTimeout(() => void this.poll(), POLL_MS);
    }
  }

  private receive(list: INoticeList): void {
    const { added, changed, removed } = diffNotices(this.notices, list.notices);
    this.notices = list.notices;
    this.sharing = list.sharing ?? [];
    this.receivedAt = Date.now();
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
    const text = countdownText(n, this.secondsLeft(n));
    if (this.node.textContent !== text) {
      this.node.textContent = text;
    }
    this.node.dataset.kind = n.kind;
    this.node.title = `${n.message}\n\n${n.hint}\n\nClick for details.`;
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
