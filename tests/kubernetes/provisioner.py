"""A stand-in volume provisioner for the test cluster: every claim of one storage class gets a folder.

A real cluster has a provisioner behind its storage classes (a cloud disk, a
NAS, Rancher's local-path); the test cluster has none, so the homes the
kubernetes backend asks for (one PersistentVolumeClaim per user) would stay
Pending and so would their pods. This does what such a provisioner does, on
one node: it watches claims of the storage class ``workbench-test-local``,
makes a folder for each under ``--root`` (owned by the image's user, uid
1000 gid 100, so the home is writable without an init container) and a
PersistentVolume bound to the claim; a released volume is deleted with its
folder. The hostPath is in the *volume*, which only the cluster admin can
create; user pods still mount only their claim.

    python tests/kubernetes/provisioner.py --kubeconfig KUBECONFIG --root /var/lib/wb-k8s/volumes
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
from pathlib import Path

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

STORAGE_CLASS = "workbench-test-local"
OWNER = (1000, 100)

log = logging.getLogger("provisioner")


def volume_for(claim, root: Path) -> dict:
    name = f"pv-{claim.metadata.uid}"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {"workbench.test/provisioned": "1"}},
        "spec": {
            "capacity": {"storage": claim.spec.resources.requests.get("storage", "1Gi")},
            "accessModes": claim.spec.access_modes or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": str(root / name), "type": "DirectoryOrCreate"},
            "claimRef": {
                "namespace": claim.metadata.namespace,
                "name": claim.metadata.name,
                "uid": claim.metadata.uid,
            },
        },
    }


async def ensure_storage_class(storage: client.StorageV1Api) -> None:
    body = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": "workbench.test/local",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }
    try:
        await storage.create_storage_class(body)
    except ApiException as exc:
        if exc.status != 409:
            raise


async def provision(core: client.CoreV1Api, root: Path) -> None:
    """Give every unbound claim of the class a volume; delete released volumes (one pass)."""
    claims = await core.list_persistent_volume_claim_for_all_namespaces()
    volumes = {v.metadata.name: v for v in (await core.list_persistent_volume()).items}
    for claim in claims.items:
        if claim.spec.storage_class_name != STORAGE_CLASS or claim.spec.volume_name:
            continue
        manifest = volume_for(claim, root)
        if manifest["metadata"]["name"] in volumes:
            continue
        folder = Path(manifest["spec"]["hostPath"]["path"])
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, *OWNER)
        try:
            await core.create_persistent_volume(manifest)
            log.info("volume %s for claim %s/%s", folder.name, claim.metadata.namespace, claim.metadata.name)
        except ApiException as exc:
            if exc.status != 409:
                raise
    for name, volume in volumes.items():
        if volume.spec.storage_class_name == STORAGE_CLASS and volume.status.phase in ("Released", "Failed"):
            await core.delete_persistent_volume(name)
            shutil.rmtree(root / name, ignore_errors=True)
            log.info("deleted released volume %s", name)


async def main(kubeconfig: str, root: Path) -> None:
    await config.load_kube_config(config_file=kubeconfig)
    async with client.ApiClient() as api:
        core = client.CoreV1Api(api)
        await ensure_storage_class(client.StorageV1Api(api))
        while True:
            try:
                await provision(core, root)
                # Wake on any claim change; the timeout makes a pass at least every 10 s (released volumes).
                async with watch.Watch().stream(
                    core.list_persistent_volume_claim_for_all_namespaces, timeout_seconds=10
                ) as stream:
                    async for _event in stream:
                        await provision(core, root)
            except (TimeoutError, ApiException, OSError) as exc:
                log.warning("provisioner pass failed: %s", exc)
                await asyncio.sleep(1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--root", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    asyncio.run(main(args.kubeconfig, args.root))
