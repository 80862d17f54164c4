import { Widget } from '@lumino/widgets';

import { GPUMetricsClient } from './client';
import { INotebookTorchMemory } from './torch';
import {
  formatMetric,
  IKernelMemory,
  kernelMemory,
  levelPath,
  memoryBreakdown,
  Metric,
  metricScale,
  seriesPath,
  timeTicks
} from './chart';
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
  stateText
} from './model';

function esc(text: unknown): string {
  return String(text ?? '').replace(/[&<>"']/g, c => `&#${c.charCodeAt(0)};`);
}

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
    const simulated = s?.source === 'simulated' ? '<span class="jp-WorkbenchGPU-sim">simulated</span>' : '';
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

// The plot's coordinate system; the SVG stretches to the panel's width
// (preserveAspectRatio="none", strokes do not scale).
const PLOT_W = 600;
const PLOT_H = 100;
const SVG_NS = 'http://www.w3.org/2000/svg';

interface IChartSpec {
  metric: Metric;
  label: string;
}

const CHARTS: IChartSpec[] = [
  { metric: 'util', label: 'Utilization' },
  { metric: 'mem', label: 'Memory' },
  { metric: 'temp', label: 'Temperature' },
  { metric: 'power', label: 'Power' }
];

function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls = '', text = ''): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text) {
    node.textContent = text;
  }
  return node;
}

function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: { [key: string]: string }): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG_NS, tag);
  for (const key of Object.keys(attrs)) {
    node.setAttribute(key, attrs[key]);
  }
  return node;
}

function setText(node: Element, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

/**
 * One chart, built once: y-axis labels, grid, time axis, the series path and,
 * on the memory chart, torch's reservations.  `update` sets a path's `d` and a
 * few text nodes; nothing is re-created per sample.
 */
class ChartView {
  readonly node: HTMLDivElement;
  private value: HTMLElement;
  private scaleNote: HTMLElement;
  private yTicks: HTMLElement[] = [];
  private line: SVGPathElement;
  private reserved: SVGPathElement | null = null;
  private bar: HTMLElement | null = null;
  private legend: HTMLElement | null = null;
  private barKey = '';
  private scaleKey = '';

  constructor(
    readonly spec: IChartSpec,
    readonly windowSeconds: number
  ) {
    const node = el('div', 'jp-WorkbenchGPU-chart');
    node.dataset.metric = spec.metric;
    const head = el('div', 'jp-WorkbenchGPU-chartLabel');
    head.append(el('span', 'jp-WorkbenchGPU-chartTitle', spec.label + ' '));
    this.value = el('b', 'jp-WorkbenchGPU-value', 'n/a');
    this.scaleNote = el('span', 'jp-WorkbenchGPU-muted');
    head.append(this.value, this.scaleNote);

    const body = el('div', 'jp-WorkbenchGPU-chartBody');
    const yAxis = el('div', 'jp-WorkbenchGPU-yAxis');
    for (let i = 0; i < 3; i++) {
      const tick = el('span', 'jp-WorkbenchGPU-yTick');
      this.yTicks.push(tick);
      yAxis.append(tick);
    }
    const plot = el('div', 'jp-WorkbenchGPU-plot');
    const chart = svg('svg', {
      viewBox: `0 0 ${PLOT_W} ${PLOT_H}`,
      preserveAspectRatio: 'none',
      width: '100%',
      height: '100%'
    });
    chart.append(svg('rect', { x: '0', y: '0', width: `${PLOT_W}`, height: `${PLOT_H}`, class: 'jp-WorkbenchGPU-chartBg' }));
    const ticks = timeTicks(windowSeconds);
    let grid = '';
    for (const f of [0.25, 0.5, 0.75]) {
      grid += `M0,${PLOT_H * (1 - f)}H${PLOT_W}`;
    }
    for (const t of ticks) {
      if (t.fraction > 0 && t.fraction < 1) {
        grid += `M${(t.fraction * PLOT_W).toFixed(1)},0V${PLOT_H}`;
      }
    }
    let minor = '';
    for (const t of timeTicks(windowSeconds, 60)) {
      if (t.fraction > 0 && t.fraction < 1 && !ticks.some(major => major.fraction === t.fraction)) {
        minor += `M${(t.fraction * PLOT_W).toFixed(1)},0V${PLOT_H}`;
      }
    }
    chart.append(svg('path', { d: minor, class: 'jp-WorkbenchGPU-gridMinor', 'vector-effect': 'non-scaling-stroke' }));
    chart.append(svg('path', { d: grid, class: 'jp-WorkbenchGPU-grid', 'vector-effect': 'non-scaling-stroke' }));
    if (spec.metric === 'mem') {
      this.reserved = svg('path', { d: '', class: 'jp-WorkbenchGPU-reserved', 'vector-effect': 'non-scaling-stroke' });
      chart.append(this.reserved);
    }
    this.line = svg('path', { d: '', class: 'jp-WorkbenchGPU-line', 'vector-effect': 'non-scaling-stroke' });
    chart.append(this.line);
    plot.append(chart);
    body.append(yAxis, plot);
    if (spec.metric === 'mem') {
      this.bar = el('div', 'jp-WorkbenchGPU-memBar');
      this.bar.title = 'memory now: torch reserved per notebook, other use, free';
      body.append(this.bar);
      node.classList.add('jp-WorkbenchGPU-withBar');
    }
    const xAxis = el('div', 'jp-WorkbenchGPU-xAxis');
    for (const t of ticks) {
      const tick = el('span', 'jp-WorkbenchGPU-xTick', t.label);
      tick.style.left = `${t.fraction * 100}%`;
      tick.dataset.edge = t.fraction === 0 ? 'start' : t.fraction === 1 ? 'end' : '';
      xAxis.append(tick);
    }
    body.append(xAxis);
    node.append(head, body);
    if (spec.metric === 'mem') {
      this.legend = el('div', 'jp-WorkbenchGPU-legend');
      node.append(this.legend);
    }
    this.node = node;
  }

  update(g: IGPUReading, points: IPoint[], now: number, kernels: IKernelMemory[]): void {
    const metric = this.spec.metric;
    const scale = metricScale(metric, g, points);
    const key = scale.ticks.map(t => t.label).join('|');
    if (key !== this.scaleKey) {
      this.scaleKey = key;
      scale.ticks.forEach((t, i) => {
        const tick = this.yTicks[i];
        tick.textContent = t.label;
        tick.style.top = `${(1 - t.fraction) * 100}%`;
        tick.dataset.edge = t.fraction === 1 ? 'top' : t.fraction === 0 ? 'bottom' : '';
      });
    }
    const series = points.map(p => ({ t: p.t, v: p[metric] }));
    const gap = Math.max(5, 5 * (this._interval(points) || 1));
    this.line.setAttribute(
      'd',
      seriesPath(series, { now, windowSeconds: this.windowSeconds, width: PLOT_W, height: PLOT_H, max: scale.max, maxGapSeconds: gap })
    );
    const last = points.length ? points[points.length - 1][metric] : null;
    setText(this.value, formatMetric(metric, last));
    if (metric === 'mem') {
      setText(this.scaleNote, g.memory_total_bytes ? ` of ${formatBytes(g.memory_total_bytes)}` : '');
      this._updateTorch(g, scale.max, kernels);
    } else if (metric === 'power') {
      setText(this.scaleNote, g.power_limit_w ? ` of ${Math.round(g.power_limit_w)} W limit` : '');
    }
  }

  /** Median spacing of the last few samples: how long a gap is a real gap. */
  private _interval(points: IPoint[]): number {
    const n = points.length;
    if (n < 3) {
      return 0;
    }
    const d = [points[n - 1].t - points[n - 2].t, points[n - 2].t - points[n - 3].t].sort((a, b) => a - b);
    return d[0];
  }

  private _updateTorch(g: IGPUReading, max: number, kernels: IKernelMemory[]): void {
    const total = kernels.reduce((sum, k) => sum + k.reserved, 0);
    this.reserved!.setAttribute('d', total > 0 ? levelPath([total], { width: PLOT_W, height: PLOT_H, max }) : '');
    const segments = memoryBreakdown(g.memory_used_bytes, g.memory_total_bytes, kernels);
    const key = segments.map(s => `${s.kind}:${s.label}`).join('|');
    if (key !== this.barKey) {
      // The set of notebooks changed (at most every 5 s): rebuild the bar and the legend.
      this.barKey = key;
      this.bar!.replaceChildren(
        ...segments.map((s, i) => {
          const seg = el('div', 'jp-WorkbenchGPU-seg');
          seg.dataset.kind = s.kind;
          seg.dataset.slot = String(i % 4);
          if (s.kind === 'torch') {
            seg.append(el('div', 'jp-WorkbenchGPU-segAllocated'));
          }
          return seg;
        })
      );
      const rows = [
        '<span class="jp-WorkbenchGPU-key" data-kind="line"></span>device used (NVML)',
        ...kernels.map(
          (k, i) =>
            `<span class="jp-WorkbenchGPU-key" data-kind="torch" data-slot="${i % 4}"></span>${esc(k.label)}: ` +
            `torch reserved <b data-role="reserved"></b> (allocated <span data-role="allocated"></span>)`
        )
      ];
      if (kernels.length) {
        rows.push('<span class="jp-WorkbenchGPU-key" data-kind="reserved"></span>torch reserved, all notebooks');
      } else {
        rows.push('<span class="jp-WorkbenchGPU-muted">torch reserved: no notebook uses torch on this GPU</span>');
      }
      this.legend!.innerHTML = rows.map(r => `<div>${r}</div>`).join('');
    }
    segments.forEach((s, i) => {
      const seg = this.bar!.children[i] as HTMLElement | undefined;
      if (!seg) {
        return;
      }
      seg.style.height = `${(s.fraction * 100).toFixed(2)}%`;
      seg.title = `${s.label}: ${formatBytes(s.bytes)}`;
      const alloc = seg.firstElementChild as HTMLElement | null;
      if (alloc) {
        alloc.style.height = `${((s.allocatedFraction ?? 0) * 100).toFixed(1)}%`;
      }
    });
    const reservedCells = this.legend!.querySelectorAll('[data-role="reserved"]');
    const allocatedCells = this.legend!.querySelectorAll('[data-role="allocated"]');
    kernels.forEach((k, i) => {
      if (reservedCells[i]) {
        setText(reservedCells[i], formatBytes(k.reserved));
      }
      if (allocatedCells[i]) {
        setText(allocatedCells[i], formatBytes(k.allocated));
      }
    });
  }
}

/** One GPU's card, built once per set of GPUs and updated in place on every sample. */
class GPUCard {
  readonly node: HTMLElement;
  private info: HTMLElement;
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
    this.problem = el('div', 'jp-WorkbenchGPU-state');
    this.note = el('div', 'jp-WorkbenchGPU-muted');
    this.charts = CHARTS.map(spec => new ChartView(spec, windowSeconds));
    this.procs = el('div');
    this.torchList = el('div');
    node.append(
      title,
      el('div', 'jp-WorkbenchGPU-muted', g.uuid),
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

  update(g: IGPUReading, points: IPoint[], now: number, torch: INotebookTorchMemory[]): void {
    const reserved = g.memory_reserved_bytes ? ` · ${formatBytes(g.memory_reserved_bytes)} reserved by the driver` : '';
    setText(
      this.info,
      `util ${formatUtilization(g)} · memory ${formatMemory(g.memory_used_bytes, g.memory_total_bytes)}${reserved}`
    );
    this.info.dataset.level = memoryLevel(g);
    const problem = g.state && g.state !== 'ok' ? g.message ?? g.state : '';
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
          g.processes.map(p => `<tr><td>${p.pid}</td><td>${esc(p.name)}</td><td></td></tr>`).join('') +
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
    const lines = torch.map(t => `${t.path}: ${formatTorchMemory(t.report, g.cuda_index)}`);
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
  private cardsNode: HTMLElement;
  private cards = new Map<string, GPUCard>();
  private cardsKey = '';

  constructor(private client: GPUMetricsClient) {
    super();
    this.id = 'workbench-gpu-monitor-panel';
    this.addClass('jp-WorkbenchGPU-panel');
    this.title.caption = 'GPU Monitor';
    this.banner = el('div', 'jp-WorkbenchGPU-banner', 'simulated GPUs: readings are made up');
    this.stateLine = el('div', 'jp-WorkbenchGPU-state');
    this.hintLine = el('div', 'jp-WorkbenchGPU-hint');
    this.cardsNode = el('div');
    this.node.append(el('h2', 'jp-WorkbenchGPU-title', 'GPU Monitor'), this.banner, this.stateLine, this.hintLine, this.cardsNode);
    client.updated.connect(this._onUpdate, this);
    client.errorChanged.connect(() => this.render(), this);
    this.render();
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
        this.cards.set(g.uuid, new GPUCard(g, s?.source === 'simulated', this.history.windowSeconds));
      }
      this.cardsNode.replaceChildren(...[...this.cards.values()].map(c => c.node));
    }
    for (const g of gpus) {
      this.cards.get(g.uuid)?.update(g, this.history.points(g.uuid, s!.timestamp), s!.timestamp, this.torch);
    }
  }
}
