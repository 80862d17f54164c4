import { INotebookTracker } from '@jupyterlab/notebook';
import { Kernel, KernelMessage } from '@jupyterlab/services';

import { ITorchReport } from './model';

const REQUEST = 'workbench_gpu_request';
const TIMEOUT_MS = 2000;

/** Ask one kernel for torch memory on its control channel (answers while a cell runs). */
export function askKernel(
  kernel: Kernel.IKernelConnection
): Promise<ITorchReport | null> {
  return new Promise(resolve => {
    const msg = KernelMessage.createMessage({
      msgType: REQUEST as any,
      channel: 'control',
      session: kernel.clientId,
      content: {} as any
    }) as KernelMessage.IControlMessage<any>;
    let done = false;
    let future: Kernel.IControlFuture<any, any> | null = null;
    const finish = (value: ITorchReport | null) => {
      if (!done) {
        done = true;
        window.clearTimeout(timer);
        future?.dispose();
        resolve(value);
      }
    };
    const timer = window.setTimeout(() => finish(null), TIMEOUT_MS);
    try {
      future = kernel.sendControlMessage(msg, true, false);
      future.onReply = reply =>
        finish(reply.content as unknown as ITorchReport);
      future.done.catch(() => finish(null));
    } catch {
      finish(null);
    }
  });
}

export interface INotebookTorchMemory {
  path: string;
  report: ITorchReport | null;
}

/** Torch memory of every open notebook's kernel. */
export async function askNotebooks(
  tracker: INotebookTracker
): Promise<INotebookTorchMemory[]> {
  const asks: Promise<INotebookTorchMemory>[] = [];
  tracker.forEach(panel => {
    const kernel = panel.sessionContext.session?.kernel;
    if (kernel && kernel.status !== 'dead') {
      asks.push(
        askKernel(kernel).then(report => ({ path: panel.context.path, report }))
      );
    }
  });
  return Promise.all(asks);
}
