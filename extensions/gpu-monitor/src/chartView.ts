/** One chart of the GPU panel: axes, grid, series path and torch's reservations, built once. */

import { el, esc, setText, svg } from './dom';
import {
  formatMetric,
  IKernelMemory,
  levelPath,
  memoryBreakdown,
  Metric,
  metricScale,
  seriesPath,
  timeTicks
} from './chart';
import { formatBytes, IGPUReading, IPoint } from './model';

// The plot's coordinate system; the SVG stretches to the panel's width
// (preserveAspectRatio="none", strokes do not scale).
const PLOT_W = 600;
const PLOT_H = 100;

interface IChartSpec {
  metric: Metric;
  label: string;
}

export const CHARTS: IChartSpec[] = [
  { metric: 'util', label: 'Utilization' },
  { metric: 'mem', label: 'Memory' },
  { metric: 'temp', label: 'Temperature' },
  { metric: 'power', label: 'Power' }
];

/**
 * One chart, built once: y-axis labels, grid, time axis, the series path and,
 * on the memory chart, torch's reservations.  `update` sets a path's `d` and a
 * few text nodes; nothing is re-created per sample.
 */
export class ChartView {
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
    chart.append(
      svg('rect', {
        x: '0',
        y: '0',
        width: `${PLOT_W}`,
        height: `${PLOT_H}`,
        class: 'jp-WorkbenchGPU-chartBg'
      })
    );
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
      if (
        t.fraction > 0 &&
        t.fraction < 1 &&
        !ticks.some(major => major.fraction === t.fraction)
      ) {
        minor += `M${(t.fraction * PLOT_W).toFixed(1)},0V${PLOT_H}`;
      }
    }
    chart.append(
      svg('path', {
        d: minor,
        class: 'jp-WorkbenchGPU-gridMinor',
        'vector-effect': 'non-scaling-stroke'
      })
    );
    chart.append(
      svg('path', {
        d: grid,
        class: 'jp-WorkbenchGPU-grid',
        'vector-effect': 'non-scaling-stroke'
      })
    );
    if (spec.metric === 'mem') {
      this.reserved = svg('path', {
        d: '',
        class: 'jp-WorkbenchGPU-reserved',
        'vector-effect': 'non-scaling-stroke'
      });
      chart.append(this.reserved);
    }
    this.line = svg('path', {
      d: '',
      class: 'jp-WorkbenchGPU-line',
      'vector-effect': 'non-scaling-stroke'
    });
    chart.append(this.line);
    plot.append(chart);
    body.append(yAxis, plot);
    if (spec.metric === 'mem') {
      this.bar = el('div', 'jp-WorkbenchGPU-memBar');
      this.bar.title =
        'memory now: torch reserved per notebook, other use, free';
      body.append(this.bar);
      node.classList.add('jp-WorkbenchGPU-withBar');
    }
    const xAxis = el('div', 'jp-WorkbenchGPU-xAxis');
    for (const t of ticks) {
      const tick = el('span', 'jp-WorkbenchGPU-xTick', t.label);
      tick.style.left = `${t.fraction * 100}%`;
      tick.dataset.edge =
        t.fraction === 0 ? 'start' : t.fraction === 1 ? 'end' : '';
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

  update(
    g: IGPUReading,
    points: IPoint[],
    now: number,
    kernels: IKernelMemory[]
  ): void {
    const metric = this.spec.metric;
    const scale = metricScale(metric, g, points);
    const key = scale.ticks.map(t => t.label).join('|');
    if (key !== this.scaleKey) {
      this.scaleKey = key;
      scale.ticks.forEach((t, i) => {
        const tick = this.yTicks[i];
        tick.textContent = t.label;
        tick.style.top = `${(1 - t.fraction) * 100}%`;
        tick.dataset.edge =
          t.fraction === 1 ? 'top' : t.fraction === 0 ? 'bottom' : '';
      });
    }
    const series = points.map(p => ({ t: p.t, v: p[metric] }));
    const gap = Math.max(5, 5 * (this._interval(points) || 1));
    this.line.setAttribute(
      'd',
      seriesPath(series, {
        now,
        windowSeconds: this.windowSeconds,
        width: PLOT_W,
        height: PLOT_H,
        max: scale.max,
        maxGapSeconds: gap
      })
    );
    const last = points.length ? points[points.length - 1][metric] : null;
    setText(this.value, formatMetric(metric, last));
    if (metric === 'mem') {
      setText(
        this.scaleNote,
        g.memory_total_bytes ? ` of ${formatBytes(g.memory_total_bytes)}` : ''
      );
      this._updateTorch(g, scale.max, kernels);
    } else if (metric === 'power') {
      setText(
        this.scaleNote,
        g.power_limit_w ? ` of ${Math.round(g.power_limit_w)} W limit` : ''
      );
    }
  }

  /** Median spacing of the last few samples: how long a gap is a real gap. */
  private _interval(points: IPoint[]): number {
    const n = points.length;
    if (n < 3) {
      return 0;
    }
    const d = [
      points[n - 1].t - points[n - 2].t,
      points[n - 2].t - points[n - 3].t
    ].sort((a, b) => a - b);
    return d[0];
  }

  private _updateTorch(
    g: IGPUReading,
    max: number,
    kernels: IKernelMemory[]
  ): void {
    const total = kernels.reduce((sum, k) => sum + k.reserved, 0);
    this.reserved!.setAttribute(
      'd',
      total > 0
        ? levelPath([total], { width: PLOT_W, height: PLOT_H, max })
        : ''
    );
    const segments = memoryBreakdown(
      g.memory_used_bytes,
      g.memory_total_bytes,
      kernels
    );
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
        rows.push(
          '<span class="jp-WorkbenchGPU-key" data-kind="reserved"></span>torch reserved, all notebooks'
        );
      } else {
        rows.push(
          '<span class="jp-WorkbenchGPU-muted">torch reserved: no notebook uses torch on this GPU</span>'
        );
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
    const reservedCells = this.legend!.querySelectorAll(
      '[data-role="reserved"]'
    );
    const allocatedCells = this.legend!.querySelectorAll(
      '[data-role="allocated"]'
    );
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
