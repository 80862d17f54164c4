import { Widget } from '@lumino/widgets';

import { GPUMetricsClient } from './client';
import { INotebookTorchMemory } from './torch';
import {
  chartPath,
  chartWindow,
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

const CHART_W = 260;
const CHART_H = 48;

interface IChartSpec {
  key: keyof IPoint;
  label: string;
  max: (g: IGPUReading) => number;
  format: (v: number | null) => string;
}

const CHARTS: IChartSpec[] = [
  { key: 'util', label: 'Utilization', max: () => 100, format: v => (v === null ? 'n/a' : `${Math.round(v)}%`) },
  { key: 'mem', label: 'Memory', max: g => g.memory_total_bytes ?? 1, format: v => formatBytes(v) },
  { key: 'temp', label: 'Temperature', max: () => 100, format: v => (v === null ? 'n/a' : `${Math.round(v)} °C`) },
  {
    key: 'power',
    label: 'Power',
    max: g => g.power_limit_w ?? 700,
    format: v => (v === null ? 'n/a' : `${Math.round(v)} W`)
  }
];

/** The side panel: 10-minute charts per GPU, processes, idle hint. */
export class GPUPanel extends Widget {
  readonly history = new GPUHistory(600);
  readonly hintRule = new IdleHintRule();
  private hint: string | null = null;
  /** Set by the plugin when a notebook tracker exists: asks kernels for torch memory. */
  torchSource: (() => Promise<INotebookTorchMemory[]>) | null = null;
  private torch: INotebookTorchMemory[] = [];
  private torchTimer: number | null = null;

  constructor(private client: GPUMetricsClient) {
    super();
    this.id = 'workbench-gpu-monitor-panel';
    this.addClass('jp-WorkbenchGPU-panel');
    this.title.caption = 'GPU Monitor';
    client.updated.connect(this._onUpdate, this);
    client.errorChanged.connect(() => this.render(), this);
  }

  private _onUpdate(_: GPUMetricsClient, s: ISnapshot): void {
    if (s.history) {
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
      }
      this.torchTimer = this.isVisible ? window.setTimeout(tick, 5000) : null;
    };
    this.torchTimer = window.setTimeout(tick, 0);
  }

  render(): void {
    const s = this.client.latest;
    const parts: string[] = ['<h2 class="jp-WorkbenchGPU-title">GPU Monitor</h2>'];
    if (s?.source === 'simulated') {
      parts.push('<div class="jp-WorkbenchGPU-banner">simulated GPUs: readings are made up</div>');
    }
    const state = stateText(s, this.client.error);
    if (state !== null) {
      parts.push(`<div class="jp-WorkbenchGPU-state">${esc(state)}</div>`);
    }
    if (this.hint) {
      parts.push(`<div class="jp-WorkbenchGPU-hint">${esc(this.hint)}</div>`);
    }
    for (const g of s?.gpus ?? []) {
      parts.push(this._gpuCard(g, s!.timestamp));
    }
    this.node.innerHTML = parts.join('');
  }

  private _gpuCard(g: IGPUReading, now: number): string {
    const points = this.history.points(g.uuid, now);
    const windowSeconds = chartWindow(points, now);
    const minutes = Math.round(windowSeconds / 60);
    const charts = CHARTS.map(spec => {
      const series = points.map(p => ({ t: p.t, v: p[spec.key] as number | null }));
      const d = chartPath(series, { now, windowSeconds, width: CHART_W, height: CHART_H, max: spec.max(g) });
      const last = series.length ? series[series.length - 1].v : null;
      return (
        `<div class="jp-WorkbenchGPU-chart" data-metric="${spec.key}">` +
        `<div class="jp-WorkbenchGPU-chartLabel">${spec.label} <b>${esc(spec.format(last))}</b>` +
        `<span class="jp-WorkbenchGPU-muted"> · last ${minutes} min</span></div>` +
        `<svg viewBox="0 0 ${CHART_W} ${CHART_H}" width="100%" height="${CHART_H}" preserveAspectRatio="none">` +
        `<rect x="0" y="0" width="${CHART_W}" height="${CHART_H}" class="jp-WorkbenchGPU-chartBg"/>` +
        `<path d="${d}" class="jp-WorkbenchGPU-line" vector-effect="non-scaling-stroke"/></svg></div>`
      );
    }).join('');
    const procs = g.processes.length
      ? '<table class="jp-WorkbenchGPU-procs"><thead><tr><th>PID</th><th>Process</th><th>GPU memory</th></tr></thead><tbody>' +
        g.processes
          .map(p => `<tr><td>${p.pid}</td><td>${esc(p.name)}</td><td>${esc(formatBytes(p.memory_used_bytes))}</td></tr>`)
          .join('') +
        '</tbody></table>'
      : '<div class="jp-WorkbenchGPU-muted">no processes of yours on this GPU</div>';
    const torch = this.torch.length
      ? '<h4>PyTorch memory per notebook</h4><ul class="jp-WorkbenchGPU-torch">' +
        this.torch
          .map(t => `<li>${esc(t.path)}: ${esc(formatTorchMemory(t.report, g.cuda_index))}</li>`)
          .join('') +
        '</ul>'
      : '';
    const note = g.memory_note ? `<div class="jp-WorkbenchGPU-muted">memory: ${esc(g.memory_note)}</div>` : '';
    const problem = g.state && g.state !== 'ok' ? `<div class="jp-WorkbenchGPU-state">${esc(g.message)}</div>` : '';
    const reserved =
      g.memory_reserved_bytes ? ` · ${esc(formatBytes(g.memory_reserved_bytes))} reserved by the driver` : '';
    return (
      `<section class="jp-WorkbenchGPU-card" data-uuid="${esc(g.uuid)}">` +
      `<h3>cuda:${esc(g.cuda_index ?? '?')} · ${esc(g.name)}</h3>` +
      `<div class="jp-WorkbenchGPU-muted">${esc(g.uuid)}</div>` +
      `<div>util ${esc(formatUtilization(g))} · memory <span data-level="${memoryLevel(g)}">${esc(
        formatMemory(g.memory_used_bytes, g.memory_total_bytes)
      )}</span>${reserved}</div>` +
      problem +
      note +
      charts +
      '<h4>Processes</h4>' +
      procs +
      torch +
      '</section>'
    );
  }
}
