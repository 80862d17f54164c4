"""GPU Workbench GPU monitor: live GPU memory and utilization in JupyterLab.

* a jupyter-server extension with one sampler thread per server
  (``GET api/gpu/metrics``, ``GET api/gpu/stream``), see ``handlers.py``;
* a JupyterLab extension (status bar item and side panel), prebuilt in the wheel;
* ``GPUMonitor``, an ipywidgets widget for notebooks::

      from workbench_gpu_monitor import GPUMonitor
      GPUMonitor()
"""

__version__ = "0.1.0"


def _jupyter_labextension_paths():
    return [{"src": "labextension", "dest": "workbench-gpu-monitor"}]


def _jupyter_server_extension_points():
    return [{"module": "workbench_gpu_monitor"}]


def _load_jupyter_server_extension(serverapp):
    from .handlers import GPUMonitorServer, setup_handlers

    monitor = GPUMonitorServer(serverapp=serverapp)
    setup_handlers(serverapp, monitor)
    io_loop = getattr(serverapp, "io_loop", None)
    monitor.start(getattr(io_loop, "asyncio_loop", None))


def _unload_jupyter_server_extension(serverapp):
    """Stop the sampler thread (and close the streams) when the server stops."""
    from .handlers import monitor_of

    monitor = monitor_of(serverapp)
    if monitor is not None:
        monitor.stop()


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
