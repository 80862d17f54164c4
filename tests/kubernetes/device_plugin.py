"""A stand-in for NVIDIA's Kubernetes device plugin: simulated GPUs the kubelet can schedule.

    python tests/kubernetes/device_plugin.py --proto-dir /var/lib/wb-k8s/proto
    python tests/kubernetes/device_plugin.py --proto-dir ... --spec '' \\
        --resource nvidia.com/mig-1g.18gb=MIG-a,MIG-b --resource nvidia.com/mig-3g.71gb=MIG-c

It speaks the kubelet's device-plugin API v1beta1 (gRPC over unix sockets, deviceplugin_v1beta1.proto
beside this file) exactly as a real plugin does, so scheduling, ``Insufficient nvidia.com/gpu``
events and the release of a device when its pod ends are the kubelet's and scheduler's own behaviour,
not a simulation. Only the devices are made up.

- By default one resource, ``nvidia.com/gpu``, whose device IDs are the UUIDs that
  ``workbench_devices.parse_simulated_spec(spec, node)`` gives (the hub's simulated inventory uses the
  same function, so the hub and the pods agree on which GPU is which). A GPU the spec lays out in MIG
  slices (``1xH200-141GB:mig=2x1g.18gb+1x3g.71gb``) is advertised as its slices instead, one resource
  per profile (``nvidia.com/mig-1g.18gb``, NVIDIA's "mixed" strategy) with the slices' ``MIG-sim-...``
  UUIDs as device IDs.
- ``--resource NAME=ID,ID`` (repeatable) adds a resource, e.g. MIG slices in NVIDIA's "mixed"
  strategy. Each resource is one plugin server on its own socket, as NVIDIA's plugin does it: the
  kubelet allows one resource name per registration.
- ``Allocate`` answers ``NVIDIA_VISIBLE_DEVICES=<ids>`` for each container, which is what NVIDIA's
  plugin sets (its default "envvar" strategy) and what the container toolkit reads.
- The kubelet wipes its device-plugins folder whenever it starts, plugin sockets included, and
  forgets every registration. The plugin therefore watches that folder: when its socket is gone or
  kubelet.sock is a new file, it serves again and registers again.
- ``--health-file FILE`` (optional, JSON ``{"<device id>": "Unhealthy"}``) is re-read every
  second; a change is streamed to the kubelet (ListAndWatch), which then drops the device from the
  node's allocatable count, as when a real GPU falls off the bus.
- SIGTERM or SIGINT: stop serving, remove the sockets, exit 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc

HERE = Path(__file__).resolve().parent
PROTO = HERE / "deviceplugin_v1beta1.proto"
API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
DEFAULT_SPEC = "2xH200-141GB"
DEFAULT_NODE = "wbk8s-node1"
# The kubelet's folder is fixed in 1.20 (pluginapi.DevicePluginPath); --plugin-dir is for tests.
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"

log = logging.getLogger("device-plugin")


def load_stubs(proto_dir: Path):
    """The compiled API (cluster.sh compiles it at start); compiled here when missing or older than
    the .proto, so the plugin also runs on its own."""
    pb2 = proto_dir / "deviceplugin_v1beta1_pb2.py"
    if not pb2.exists() or pb2.stat().st_mtime < PROTO.stat().st_mtime:
        proto_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{HERE}",
                f"--python_out={proto_dir}",
                f"--grpc_python_out={proto_dir}",
                PROTO.name,
            ],
            check=True,
        )
    # The generated _grpc module imports its _pb2 sibling by bare name.
    sys.path.insert(0, str(proto_dir))
    import deviceplugin_v1beta1_pb2 as pb
    import deviceplugin_v1beta1_pb2_grpc as pb_grpc

    return pb, pb_grpc


class Resource:
    """One extended resource (``nvidia.com/gpu``) with its devices and their health."""

    def __init__(self, name: str, ids: list[str]):
        self.name = name
        self.ids = ids
        self.health = dict.fromkeys(ids, HEALTHY)
        self.version = 0  # bumped on every health change; ListAndWatch streams compare it
        self.changed = threading.Condition()

    @property
    def socket_name(self) -> str:
        return "wb-" + self.name.replace("/", "_") + ".sock"

    def set_health(self, table: dict[str, str]) -> None:
        new = {i: (UNHEALTHY if table.get(i) == UNHEALTHY else HEALTHY) for i in self.ids}
        if new != self.health:
            with self.changed:
                self.health = new
                self.version += 1
                self.changed.notify_all()
            log.info("%s health now %s", self.name, new)


def make_servicer(pb, pb_grpc, resource: Resource, env_var: str, stopping: threading.Event):
    class DevicePlugin(pb_grpc.DevicePluginServicer):
        def GetDevicePluginOptions(self, request, context):
            return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

        def ListAndWatch(self, request, context):
            # One stream per kubelet connection, held open for as long as the kubelet listens: the
            # kubelet counts a resource as present only while this stream lives.
            log.info("%s: kubelet listening", resource.name)
            seen = -1
            while context.is_active() and not stopping.is_set():
                with resource.changed:
                    if seen == resource.version:
                        resource.changed.wait(timeout=1)
                        continue
                    seen = resource.version
                    devices = [pb.Device(ID=i, health=h) for i, h in resource.health.items()]
                yield pb.ListAndWatchResponse(devices=devices)
            log.info("%s: kubelet stream ended", resource.name)

        def GetPreferredAllocation(self, request, context):
            # Not advertised (see the options above), answered anyway: the required IDs first.
            answers = []
            for req in request.container_requests:
                chosen = list(req.must_include_deviceIDs)
                chosen += [i for i in req.available_deviceIDs if i not in chosen]
                answers.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen[: req.allocation_size]))
            return pb.PreferredAllocationResponse(container_responses=answers)

        def Allocate(self, request, context):
            answers = []
            for req in request.container_requests:
                ids = list(req.devicesIDs)
                unknown = [i for i in ids if i not in resource.health]
                if unknown:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown {resource.name} devices {unknown}")
                log.info("%s: allocate %s", resource.name, ids)
                answers.append(pb.ContainerAllocateResponse(envs={env_var: ",".join(ids)}))
            return pb.AllocateResponse(container_responses=answers)

        def PreStartContainer(self, request, context):
            return pb.PreStartContainerResponse()

    return DevicePlugin()


class Plugin:
    """One resource's gRPC server on its socket, and its registration with the kubelet."""

    def __init__(self, pb, pb_grpc, resource: Resource, plugin_dir: Path, env_var: str):
        self.pb, self.pb_grpc = pb, pb_grpc
        self.resource = resource
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / resource.socket_name
        self.env_var = env_var
        self.server: grpc.Server | None = None
        self.stopping: threading.Event | None = None
        self.registered_with: tuple[int, int] | None = None  # kubelet.sock's (inode, ctime)

    def serve(self) -> None:
        self.stop()
        self.socket.unlink(missing_ok=True)
        self.stopping = threading.Event()
        # A worker per open ListAndWatch stream plus a few for unary calls; kubelet keeps one stream.
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.pb_grpc.add_DevicePluginServicer_to_server(
            make_servicer(self.pb, self.pb_grpc, self.resource, self.env_var, self.stopping), self.server
        )
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()
        log.info("%s: serving on %s", self.resource.name, self.socket)

    def register(self, kubelet_id: tuple[int, int]) -> bool:
        request = self.pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket.name,  # relative to the kubelet's device-plugins folder
            resource_name=self.resource.name,
            options=self.pb.DevicePluginOptions(),
        )
        try:
            with grpc.insecure_channel(f"unix://{self.plugin_dir / 'kubelet.sock'}") as channel:
                self.pb_grpc.RegistrationStub(channel).Register(request, timeout=5)
        except grpc.RpcError as e:
            log.warning("%s: registration failed (%s), retrying", self.resource.name, e.details() or e.code())
            return False
        self.registered_with = kubelet_id
        log.info("%s: registered %d devices %s", self.resource.name, len(self.resource.ids), self.resource.ids)
        return True

    def tick(self) -> None:
        """Serve and register again where the kubelet has lost us (restarted, folder wiped)."""
        kubelet_sock = self.plugin_dir / "kubelet.sock"
        try:
            st = kubelet_sock.stat()
        except FileNotFoundError:
            return  # no kubelet (yet): nothing to register with
        kubelet_id = (st.st_ino, st.st_ctime_ns)
        if self.server is None or not self.socket.exists():
            self.serve()
            self.registered_with = None
        if self.registered_with != kubelet_id:
            self.register(kubelet_id)

    def stop(self) -> None:
        if self.server is not None:
            self.stopping.set()
            self.server.stop(grace=1).wait()
            self.server = None
        self.socket.unlink(missing_ok=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--spec",
        default=os.environ.get("WB_K8S_GPUS", DEFAULT_SPEC),
        help="simulated GPUs for nvidia.com/gpu (workbench_devices spec; '' for none) [env WB_K8S_GPUS]",
    )
    p.add_argument("--node", default=DEFAULT_NODE, help="node name the simulated UUIDs are made for")
    p.add_argument(
        "--resource",
        action="append",
        default=[],
        metavar="NAME=ID,ID",
        help="an extra resource and its device IDs (repeatable); NAME nvidia.com/gpu replaces the spec's",
    )
    p.add_argument("--proto-dir", type=Path, required=True, help="where the compiled API lives (or goes)")
    p.add_argument("--plugin-dir", type=Path, default=Path(PLUGIN_DIR))
    p.add_argument("--env-var", default="NVIDIA_VISIBLE_DEVICES", help="what Allocate sets to the device IDs")
    p.add_argument("--health-file", type=Path, help='JSON {"<device id>": "Unhealthy"}, re-read every second')
    return p.parse_args(argv)


def resources_from(args: argparse.Namespace) -> list[Resource]:
    table: dict[str, list[str]] = {}
    if args.spec:
        from workbench_devices import parse_simulated_spec

        # Whole GPUs are nvidia.com/gpu; a GPU the spec lays out in MIG slices is not, its slices are
        # nvidia.com/mig-<profile> each (NVIDIA's "mixed" strategy), with their MIG-sim-... UUIDs as IDs.
        for gpu in parse_simulated_spec(args.spec, args.node):
            name = f"nvidia.com/mig-{gpu.profile}" if gpu.mig else "nvidia.com/gpu"
            table.setdefault(name, []).append(gpu.uuid)
    for item in args.resource:
        name, sep, ids = item.partition("=")
        id_list = [i for i in ids.split(",") if i]
        if not sep or "/" not in name or not id_list:
            raise SystemExit(f"--resource wants NAME=ID,ID (NAME like nvidia.com/mig-1g.18gb), got {item!r}")
        table[name] = id_list
    if not table:
        raise SystemExit("nothing to advertise: give --spec or --resource")
    return [Resource(name, ids) for name, ids in table.items()]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    resources = resources_from(args)
    pb, pb_grpc = load_stubs(args.proto_dir)
    args.plugin_dir.mkdir(parents=True, exist_ok=True)
    plugins = [Plugin(pb, pb_grpc, r, args.plugin_dir, args.env_var) for r in resources]

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())

    health_mtime = None
    while not done.is_set():
        if args.health_file:
            try:
                mtime = args.health_file.stat().st_mtime_ns
            except FileNotFoundError:
                mtime = 0
            if mtime != health_mtime:
                health_mtime = mtime
                try:
                    table = json.loads(args.health_file.read_text()) if mtime else {}
                except (OSError, ValueError) as e:
                    log.warning("health file %s unreadable (%s); keeping the last state", args.health_file, e)
                else:
                    for r in resources:
                        r.set_health(table)
        for plugin in plugins:
            try:
                plugin.tick()
            except Exception:  # one bad tick (a socket race with a wiping kubelet) must not end the plugin
                log.exception("%s: serving failed, retrying", plugin.resource.name)
                plugin.server = None
        done.wait(1)

    log.info("stopping")
    for plugin in plugins:
        plugin.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
