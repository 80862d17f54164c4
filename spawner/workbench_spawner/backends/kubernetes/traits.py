"""The Kubernetes backend's own settings, beside KubeSpawner's (namespace, image, storage class, node selector...)."""

from __future__ import annotations

from traitlets import Bool, Float, List, Unicode
from traitlets.config import Configurable


class KubernetesTraits(Configurable):
    """What the GPU policy needs to know about the cluster's GPUs and what it adds to each pod."""

    gpu_resource_name = Unicode(
        "nvidia.com/gpu",
        help="""
        The extended resource a pod asks for its GPUs (``limits``), as the
        device plugin advertises it. NVIDIA's device plugin and the GPU
        Operator use ``nvidia.com/gpu``; change it only for a plugin that
        renames the resource (for example time-sliced GPUs renamed to
        ``nvidia.com/gpu.shared``). MIG slices are not asked for by this name:
        a ``gpu_profile`` request asks for the plugin's mixed-strategy
        resource of that profile (``nvidia.com/mig-1g.18gb``).
        """,
    ).tag(config=True)

    gpu_product_label = Unicode(
        "nvidia.com/gpu.product",
        help="""
        The node label naming the GPU product (GPU Feature Discovery sets it,
        e.g. ``NVIDIA-H200``). A spawn that asks for a model gets a node
        selector on it; the inventory names each node's GPUs by it.
        """,
    ).tag(config=True)

    gpu_memory_label = Unicode(
        "nvidia.com/gpu.memory",
        help="""
        The node label with each GPU's memory in MiB (GPU Feature Discovery
        sets it). With the product label it makes the model name the spawn
        form offers (``H200-141GB``), and a model request selects on both.
        """,
    ).tag(config=True)

    workbench_network_policy = Bool(
        True,
        help="""
        Keep a NetworkPolicy in the namespace that lets user pods be reached
        only by the hub and the proxy and reach only the hub API, DNS and the
        internet, never another user's pod or a private range (Zero to
        JupyterHub's singleuser policy). Turn it off under Zero to JupyterHub,
        whose chart makes its own (``singleuser.networkPolicy``). It takes
        effect only where the cluster's network plugin enforces
        NetworkPolicies (Calico, Cilium...).
        """,
    ).tag(config=True)

    hub_ingress_cidrs = List(
        Unicode(),
        help="""
        Where the hub and the proxy reach user pods from, when they run
        outside the cluster (CIDRs, e.g. ``["172.17.0.1/32"]``): the
        NetworkPolicy's ingress rule. Empty: pods labelled
        ``hub.jupyter.org/network-access-singleuser: "true"`` in the
        namespace (the hub and proxy pods under Zero to JupyterHub).
        """,
    ).tag(config=True)

    home_volume_size = Unicode(
        "10Gi",
        help="""
        Size of each user's home volume (a PersistentVolumeClaim per user,
        mounted at the image's home). The storage class is KubeSpawner's
        ``storage_class`` (empty: the cluster's default).
        """,
    ).tag(config=True)

    datasets_claim = Unicode(
        "",
        help="""
        A PersistentVolumeClaim in the namespace with the shared datasets,
        mounted read-only at ``/datasets`` in every user pod. Empty: none.
        """,
    ).tag(config=True)

    allowed_host_paths = List(
        Unicode(),
        help="""
        hostPath volumes a site may add to user pods (through KubeSpawner's
        ``volumes``), by path. Any other hostPath volume, and host network,
        PID or IPC namespaces, make the hub refuse to create the pod: they
        give a student the node.
        """,
    ).tag(config=True)

    k8s_poll_interval = Float(
        0.2,
        min=0.1,
        help="""
        Seconds between looks at a pending pod (the scheduler's words on the
        progress page, the queue timeout). The pod's state comes from
        KubeSpawner's watch, so a look costs no API call.
        """,
    ).tag(config=True)

    k8s_report_timeout = Float(
        120.0,
        min=1.0,
        help="""
        Seconds a scheduled pod has to report the GPUs the device plugin gave
        it (the image's start-up does, before Jupyter starts: pulling the
        image counts). Past it, the pod is deleted and the user told.
        """,
    ).tag(config=True)
