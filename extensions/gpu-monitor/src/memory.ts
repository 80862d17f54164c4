import { Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { Kernel, ServerConnection } from '@jupyterlab/services';

import { GPUMetricsClient } from './client';
import {
  cudaOomDevice,
  cudaOomText,
  isCudaOom,
  IServerMemory,
  oomKillText,
  recentOomKill
} from './memoryModel';
import { GPUPanel } from './views';

/** The server's memory cgroup and the server's clock (the answer's Date header), or null. */
async function readMemory(
  settings: ServerConnection.ISettings
): Promise<{ memory: IServerMemory; serverNow: number } | null> {
  try {
    const response = await ServerConnection.makeRequest(
      URLExt.join(settings.baseUrl, 'api/gpu/memory'),
      { cache: 'no-store' } as RequestInit,
      settings
    );
    if (!response.ok) {
      return null;
    }
    const date = Date.parse(response.headers.get('Date') ?? '');
    return {
      memory: (await response.json()) as IServerMemory,
      serverNow: isNaN(date) ? Date.now() : date
    };
  } catch {
    return null;
  }
}

/**
 * A notebook's kernel that dies ('dead', or 'autorestarting' when the server
 * restarts it) because the server's memory limit killed it: asks
 * `api/gpu/memory` whether the OOM killer struck in the last minute and says
 * so in a notification, once per kill. The server samples its cgroup every
 * second and may not have seen the kill yet, so a "no" is asked again once.
 */
export function watchKernelDeaths(
  notebooks: INotebookTracker,
  settings: ServerConnection.ISettings
): void {
  const told = new Set<string>();
  let asking = false;
  const ask = async () => {
    if (asking) {
      return;
    }
    asking = true;
    try {
      for (const wait of [0, 2000]) {
        await new Promise(resolve => window.setTimeout(resolve, wait));
        const answer = await readMemory(settings);
        if (answer && recentOomKill(answer.memory, answer.serverNow)) {
          const at = answer.memory.last_oom_kill_at!;
          if (!told.has(at)) {
            told.add(at);
            Notification.error(oomKillText(answer.memory.limit_bytes), {
              autoClose: false
            });
          }
          return;
        }
      }
    } finally {
      asking = false;
    }
  };
  const onStatus = (_: unknown, status: Kernel.Status) => {
    if (status === 'dead' || status === 'autorestarting') {
      void ask();
    }
  };
  notebooks.forEach(panel =>
    panel.sessionContext.statusChanged.connect(onStatus)
  );
  notebooks.widgetAdded.connect((_, panel) =>
    panel.sessionContext.statusChanged.connect(onStatus)
  );
}

/** An error output as nbformat writes it. */
interface IErrorOutput {
  output_type: string;
  ename?: string;
  evalue?: string;
}

/** The error outputs of a cell's output area model, for cells run without a reply's error. */
function errorOutputs(model: unknown): IErrorOutput[] {
  const outputs = (
    model as {
      outputs?: { length: number; get(i: number): { toJSON(): unknown } };
    }
  ).outputs;
  const found: IErrorOutput[] = [];
  for (let i = 0; outputs && i < outputs.length; i++) {
    const output = outputs.get(i).toJSON() as IErrorOutput;
    if (output.output_type === 'error') {
      found.push(output);
    }
  }
  return found;
}

/**
 * A cell that failed with CUDA out of memory (an exception; the kernel lives
 * on): the GPU panel shows the device's memory at that moment, from the
 * monitor's latest reading. One connection for every notebook: the cell
 * executed signal, so outputs restored from a saved notebook never count.
 */
export function watchCudaOom(
  notebooks: INotebookTracker,
  client: GPUMetricsClient,
  panel: GPUPanel
): void {
  NotebookActions.executed.connect((_, { notebook, cell, success, error }) => {
    if (success) {
      return;
    }
    const errors: IErrorOutput[] = error
      ? [
          {
            output_type: 'error',
            ename: error.errorName,
            evalue: error.errorValue
          }
        ]
      : errorOutputs(cell.model);
    const oom = errors.find(e => isCudaOom(e.ename ?? '', e.evalue ?? ''));
    if (!oom) {
      return;
    }
    const device = cudaOomDevice(oom.evalue ?? '');
    const path =
      notebooks.find(p => p.content === notebook)?.context.path ?? 'a notebook';
    panel.noteCudaOom(
      cudaOomText(client.latest, new Date(), device),
      `${path}: ${oom.ename}: ${oom.evalue}`
    );
  });
}
