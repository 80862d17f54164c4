"""GPU Workbench GPU monitor: live GPU memory and utilization in JupyterLab.

* a jupyter-server extension (``GPUMonitorApp`` in ``app.py``) with one sampler
  thread per server that starts and stops with the server
  (``GET api/gpu/metrics``, ``GET api/gpu/stream``), see ``handlers.py``;
* a JupyterLab extension (status bar item and side panel), prebuilt in the wheel;
* ``GPUMonitor``, an ipywidgets widget for notebooks::

      from workbench_gpu_monitor import GPUMonitor
      GPUMonitor()

* ``on_stop``, so a training loop can checkpoint before the hub stops the server
  (``stop_notice.py``)::

      from workbench_gpu_monitor import on_stop
      stop = on_stop(save_checkpoint)   # or check stop.requested.is_set() each step
"""

from .stop_notice import StopHandle, on_stop  # stdlib only: cheap in every kernel

__version__ = "0.1.0"
__all__ = ["GPUMonitor", "StopHandle", "on_stop"]


def _jupyter_labextension_paths():
    return [{"src": "labextension", "dest": "workbench-gpu-monitor"}]


def _jupyter_server_extension_points():
    # Imported here: the kernel-side parts of the package must not need jupyter_server.
    from .app import GPUMonitorApp

    return [{"module": "workbench_gpu_monitor", "app": GPUMonitorApp}]


def load_ipython_extension(ipython):
    """``%load_ext workbench_gpu_monitor``: let the JupyterLab panel ask this kernel for torch memory."""
    from .kernel import load_ipython_extension as load

    load(ipython)


def __getattr__(name):
    # Import the widget lazily: the server extension must not need ipywidgets.
    if name == "GPUMonitor":
        from .widget import GPUMonitor

        return GPUMonitor
    raise AttributeError(name)
