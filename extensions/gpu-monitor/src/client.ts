import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { backoffDelay, ISnapshot, SSEParser } from './model';

/**
 * One connection to the server's GPU stream, shared by the status bar and the panel.
 *
 * Loads the snapshot with history once, then reads `api/gpu/stream`
 * (server-sent events over fetch, so the usual token header is sent).
 * Stops while the browser tab is hidden and reconnects with exponential
 * back-off after errors.
 */
export class GPUMetricsClient {
  private _updated = new Signal<this, ISnapshot>(this);
  private _errorChanged = new Signal<this, string | null>(this);
  private _abort: AbortController | null = null;
  private _attempt = 0;
  private _timer: number | null = null;
  private _running = false;
  private _disposed = false;
  latest: ISnapshot | null = null;
  error: string | null = null;

  constructor(
    private settings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {
    document.addEventListener('visibilitychange', this._onVisibility);
  }

  get updated(): ISignal<this, ISnapshot> {
    return this._updated;
  }

  get errorChanged(): ISignal<this, string | null> {
    return this._errorChanged;
  }

  start(): void {
    if (this._running || this._disposed) {
      return;
    }
    this._running = true;
    if (!document.hidden) {
      void this._connect();
    }
  }

  stop(): void {
    this._running = false;
    this._disconnect();
  }

  dispose(): void {
    this._disposed = true;
    this.stop();
    document.removeEventListener('visibilitychange', this._onVisibility);
    Signal.clearData(this);
  }

  private _onVisibility = (): void => {
    if (!this._running) {
      return;
    }
    if (document.hidden) {
      this._disconnect();
    } else if (!this._abort) {
      this._attempt = 0;
      void this._connect();
    }
  };

  private _disconnect(): void {
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
    if (this._abort) {
      this._abort.abort();
      this._abort = null;
    }
  }

  private _setError(error: string | null): void {
    if (error !== this.error) {
      this.error = error;
      this._errorChanged.emit(error);
    }
  }

  private _emit(s: ISnapshot): void {
    this.latest = s;
    this._updated.emit(s);
  }

  private _url(path: string): string {
    return URLExt.join(this.settings.baseUrl, 'api/gpu', path);
  }

  private async _connect(): Promise<void> {
    const abort = new AbortController();
    this._abort = abort;
    try {
      const first = await ServerConnection.makeRequest(
        this._url('metrics') + '?history=1',
        { signal: abort.signal } as RequestInit,
        this.settings
      );
      if (!first.ok) {
        throw new Error(`HTTP ${first.status}`);
      }
      this._emit((await first.json()) as ISnapshot);
      const response = await ServerConnection.makeRequest(
        this._url('stream'),
        { signal: abort.signal, cache: 'no-store' } as RequestInit,
        this.settings
      );
      if (!response.ok || !response.body) {
        throw new Error(`HTTP ${response.status}`);
      }
      this._setError(null);
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      const parser = new SSEParser();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) {
          throw new Error('stream closed by the server');
        }
        for (const data of parser.feed(
          decoder.decode(value, { stream: true })
        )) {
          this._attempt = 0;
          this._emit(JSON.parse(data) as ISnapshot);
        }
      }
    } catch (reason) {
      if (abort.signal.aborted || this._abort !== abort) {
        return; // stopped on purpose (tab hidden, disposed)
      }
      this._abort = null;
      this._setError(
        `server unreachable (${(reason as Error).message ?? reason}), retrying`
      );
      const delay = backoffDelay(this._attempt++);
      this._timer = window.setTimeout(() => {
        this._timer = null;
        if (this._running && !document.hidden) {
          void this._connect();
        }
      }, delay);
    }
  }
}
