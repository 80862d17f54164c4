import { Widget } from '@lumino/widgets';

import { GPUMetricsClient } from './client';
import { INotebookTorchMemory } from './torch';
import { CHARTS, ChartView } from './chartView';
import { el, esc, setText } from './dom';
import { kernelMemory } from './chart';
import {
  formatBytes,
  formatGpuStatus,
  formatTorchMemory,
  formatMemory,
  formatUtilization,
  GPUHistory,
  IdleHintRule,
  IGPUReading,
  IPoint,
  ISnapshot,
  memoryLevel,
  sliceText,
  stateText
} from './model';

/** The status bar item: "GPU0 37% 12.3/80.0 GiB" per GPU; click opens the panel. */
export class GPUStatusItem extends Widget {
  constructor(
    private client: GPUMetricsClient,
    onClick: () => void
  ) {
    super();
    this.addClass('jp-WorkbenchGPU-status');
    this.node.title = 'GPU monitor: click for charts and processes';
    this.node.addEventListener('click', onClick);
    client.updated.connect(this.render, this);
    client.errorChanged.connect(this.render, this);
    this.render();
  }

  render(): void {
    const s = this.client.latest;
    const state = stateText(s, this.client.error);
    const simulated =
      s?.source === 'simulated'
        ? '<span class="jp-WorkbenchGPU-sim">simulated</span>'
        : '';
    if (state !== null) {
      this.node.innerHTML = `<span class="jp-WorkbenchGPU-state">${esc(state)}</span>${simulated}`;
      return;
    }
    this.node.innerHTML =
      s!.gpus
        .map(
          g =>
            `<span class="jp-WorkbenchGPU-gpu" data-level="${memoryLevel(g)}" data-uuid="${esc(g.uuid)}">${esc(
              formatGpuStatus(g)
            )}</span>`
        )
        .join('') + simulated;
  }
}

/** One GPU's card, built once per set of GPUs and updated in place on every sample. */
class GPUCard {
  readonly node: HTMLElement;
  private info: HTMLElement;
  private slice: HTMLElement;
  private problem: HTMLElement;
  private note: HTMLElement;
  private charts: ChartView[];
  private procs: HTMLElement;
  private procsKey = '';
  private torchList: HTMLElement;
  private torchKey = '';

  constructor(g: IGPUReading, simulated: boolean, windowSeconds: number) {
    const node = el('section', 'jp-WorkbenchGPU-card');
    node.dataset.uuid = g.uuid;
    const title = el('h3', '', `cuda:${g.cuda_index ?? '?'} · ${g.name}`);
    if (simulated && !/simulated/i.test(g.name)) {
      title.append(' ', el('span', 'jp-WorkbenchGPU-sim', 'simulated'));
    }
    this.info = el('div');
    this.slice = el('div', 'jp-WorkbenchGPU-slice');
    this.problem = el('div', 'jp-WorkbenchGPU-state');
    this.note = el('div', 'jp-WorkbenchGPU-muted');
    this.charts = CHARTS.map(spec => new ChartView(spec, windowSeconds));
    this.procs = el('div');
    this.torchList = el('div');
    node.append(
      title,
      el('div', 'jp-WorkbenchGPU-muted', g.uuid),
      this.slice,
      this.info,
      this.problem,
      this.note,
      ...this.charts.map(c => c.node),
      el('h4', '', 'Processes'),
      this.procs,
      this.torchList
    );
    this.node = node;
  }

  update(
    g: IGPUReading,
    points: IPoint[],
    now: number,
    torch: INotebookTorchMemory[]
  ): void {
    const reserved = g.memory_reserved_bytes
      ? ` · ${formatBytes(g.memory_reserved_bytes)} reserved by the driver`
      : '';
    setText(
      this.info,
      `util ${formatUtilization(g)} · memory ${formatMemory(g.memory_used_bytes, g.memory_total_bytes)}${reserved}`
    );
    this.info.dataset.level = memoryLevel(g);
    setText(this.slice, sliceText(g));
    this.slice.hidden = !g.mig;
    const problem = g.state && g.state !== 'ok' ? (g.message ?? g.state) : '';
    setText(this.problem, problem);
    this.problem.hidden = !problem;
    setText(this.note, g.memory_note ? `memory: ${g.memory_note}` : '');
    this.note.hidden = !g.memory_note;
    const kernels = kernelMemory(torch, g);
    for (const chart of this.charts) {
      chart.update(g, points, now, kernels);
    }
    this._updateProcesses(g);
    this._updateTorch(g, torch);
  }

  private _updateProcesses(g: IGPUReading): void {
    const key = g.processes.map(p => `${p.pid}:${p.name}`).join('|');
    if (key !== this.procsKey) {
      this.procsKey = key;
      this.procs.innerHTML = g.processes.length
        ? '<table class="jp-WorkbenchGPU-procs"><thead><tr><th>PID</th><th>Process</th><th>GPU memory</th></tr></thead><tbody>' +
          g.processes
            .map(
              p => `<tr><td>${p.pid}</td><td>${esc(p.name)}</td><td></td></tr>`
            )
            .join('') +
          '</tbody></table>'
        : '<div class="jp-WorkbenchGPU-muted">no processes of yours on this GPU</div>';
    }
    const rows = this.procs.querySelectorAll('tbody tr');
    g.processes.forEach((p, i) => {
      const cell = rows[i]?.lastElementChild;
      if (cell) {
        setText(cell, formatBytes(p.memory_used_bytes));
      }
    });
  }

  private _updateTorch(g: IGPUReading, torch: INotebookTorchMemory[]): void {
    const lines = torch.map(
      t => `${t.path}: ${formatTorchMemory(t.report, g.cuda_index)}`
    );
    const key = lines.join('\n');
    if (key === this.torchKey) {
      return;
    }
    this.torchKey = key;
    this.torchList.innerHTML = lines.length
      ? '<h4>PyTorch memory per notebook</h4><ul class="jp-WorkbenchGPU-torch">' +
        lines.map(l => `<li>${esc(l)}</li>`).join('') +
        '</ul>'
      : '';
  }
}

/** The side panel: 10-minute charts per GPU, processes, idle hint. */
export class GPUPanel extends Widget {
  readonly history = new GPUHistory(600);
  readonly hintRule = new IdleHintRule();
  private hint: string | null = null;
  /** Set by the plugin when a notebook tracker exists: asks kernels for torch memory. */
  torchSource: (() => Promise<INotebookTorchMemory[]>) | null = null;
  private torch: INotebookTorchMemory[] = [];
  private torchTimer: number | null = null;
  private banner: HTMLElement;
  private stateLine: HTMLElement;
  private hintLine: HTMLElement;
  private oomList: HTMLElement;
  private cardsNode: HTMLElement;
  private cards = new Map<string, GPUCard>();
  private cardsKey = '';

  constructor(private client: GPUMetricsClient) {
    super();
    this.id = 'workbench-gpu-monitor-panel';
    this.addClass('jp-WorkbenchGPU-panel');
    this.title.caption = 'GPU Monitor';
    this.banner = el(
      'div',
      'jp-WorkbenchGPU-banner',
      'simulated GPUs: readings are made up'
    );
    this.stateLine = el('div', 'jp-WorkbenchGPU-state');
    this.hintLine = el('div', 'jp-WorkbenchGPU-hint');
    this.oomList = el('ul', 'jp-WorkbenchGPU-oom');
    this.oomList.hidden = true;
    this.cardsNode = el('div');
    this.node.append(
      el('h2', 'jp-WorkbenchGPU-title', 'GPU Monitor'),
      this.banner,
      this.stateLine,
      this.hintLine,
      this.oomList,
      this.cardsNode
    );
    client.updated.connect(this._onUpdate, this);
    client.errorChanged.connect(() => this.render(), this);
    this.render();
  }

  /**
   * A CUDA out-of-memory error in a notebook: a line with the GPU's memory at
   * that moment ("CUDA out of memory at 14:03:21: GPU 0 had 79.1 of 80.0 GiB
   * in use"), newest first, the last three kept; `title` names the notebook.
   */
  noteCudaOom(text: string, title: string): void {
    const line = el('li', '', text);
    line.title = title;
    this.oomList.prepend(line);
    while (this.oomList.children.length > 3) {
      this.oomList.lastElementChild!.remove();
    }
    this.oomList.hidden = false;
  }

  private _onUpdate(_: GPUMetricsClient, s: ISnapshot): void {
    if (s.history) {
      // The server's ten minutes: fills what this tab missed (opened late, hidden, reconnected).
      this.history.load(s.history);
    }
    this.history.add(s);
    this.hint = this.hintRule.update(s);
    if (this.isVisible) {
      this.render();
    }
  }

  protected onAfterShow(): void {
    this.render();
    this._pollTorch();
  }

  protected onAfterHide(): void {
    if (this.torchTimer !== null) {
      window.clearTimeout(this.torchTimer);
      this.torchTimer = null;
    }
  }

  /** Every 5 s while the panel is visible and the tab is shown. */
  private _pollTorch(): void {
    if (!this.torchSource || this.torchTimer !== null) {
      return;
    }
    const tick = async () => {
      if (this.isVisible && !document.hidden && this.torchSource) {
        try {
          this.torch = await this.torchSource();
        } catch {
          this.torch = [];
        }
        this.render();
      }
      this.torchTimer = this.isVisible ? window.setTimeout(tick, 5000) : null;
    };
    this.torchTimer = window.setTimeout(tick, 0);
  }

  /** One redraw: text nodes, path `d` attributes and bar heights; cards are re-created only when the GPUs change. */
  render(): void {
    const s = this.client.latest;
    this.banner.hidden = s?.source !== 'simulated';
    const state = stateText(s, this.client.error);
    setText(this.stateLine, state ?? '');
    this.stateLine.hidden = state === null;
    setText(this.hintLine, this.hint ?? '');
    this.hintLine.hidden = !this.hint;
    const gpus = s?.gpus ?? [];
    const key = `${s?.source}|${gpus.map(g => g.uuid).join(',')}`;
    if (key !== this.cardsKey) {
      this.cardsKey = key;
      this.cards.clear();
      for (const g of gpus) {
        this.cards.set(
          g.uuid,
          new GPUCard(g, s?.source === 'simulated', this.history.windowSeconds)
        );
      }
      this.cardsNode.replaceChildren(
        ...[...this.cards.values()].map(c => c.node)
      );
    }
    for (const g of gpus) {
      this.cards
        .get(g.uuid)
        ?.update(
          g,
          this.history.points(g.uuid, s!.timestamp),
          s!.timestamp,
          this.torch
        );
    }
  }
}
