import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { GPUMetricsClient } from './client';
import { watchCudaOom, watchKernelDeaths } from './memory';
import { NoticeStatusItem } from './notices';
import { saveOpenDocuments } from './saves';
import { askNotebooks } from './torch';
import { GPUPanel, GPUStatusItem } from './views';

const gpuIcon = new LabIcon({
  name: 'workbench-gpu-monitor:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<path d="M2 7h18v10H2z M4 9v6h14V9z M6 10h4v4H6z M12 10h4v4h-4z M21 9h1v6h-1z M5 17h2v2H5z M9 17h2v2H9z"/></g></svg>'
});

const OPEN_COMMAND = 'workbench-gpu-monitor:open';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'workbench-gpu-monitor:plugin',
  description:
    'GPU utilization and memory of this server in the status bar and a side panel.',
  autoStart: true,
  optional: [IStatusBar, ILabShell, ICommandPalette, INotebookTracker],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    labShell: ILabShell | null,
    palette: ICommandPalette | null,
    notebooks: INotebookTracker | null
  ) => {
    const client = new GPUMetricsClient(app.serviceManager.serverSettings);
    const panel = new GPUPanel(client);
    panel.title.icon = gpuIcon;
    if (notebooks) {
      panel.torchSource = () => askNotebooks(notebooks);
      // Out of memory, in words: a kernel killed by the server's limit, a cell's CUDA OOM error.
      watchKernelDeaths(notebooks, app.serviceManager.serverSettings);
      watchCudaOom(notebooks, client, panel);
    }
    app.shell.add(panel, 'right', { rank: 900 });

    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Open GPU Monitor',
      execute: () => app.shell.activateById(panel.id)
    });
    palette?.addItem({ command: OPEN_COMMAND, category: 'GPU' });

    if (statusBar) {
      const item = new GPUStatusItem(
        client,
        () => void app.commands.execute(OPEN_COMMAND)
      );
      statusBar.registerStatusItem('workbench-gpu-monitor:status', {
        item,
        align: 'left',
        rank: 1
      });
    }
    // The hub's notices ("your server will be stopped at ..."): a notification, a countdown in the
    // status bar, and every open document with unsaved changes saved before the stop.
    const notices = new NoticeStatusItem(
      app.serviceManager.serverSettings,
      () => saveOpenDocuments(app.shell.widgets('main'))
    );
    if (statusBar) {
      statusBar.registerStatusItem('workbench-gpu-monitor:notice', {
        item: notices,
        align: 'left',
        rank: 0
      });
    }
    notices.start();
    client.start();
  }
};

export default plugin;
