"""The image a user picks on the spawn form is the image the pod runs, on the real test cluster.

``WORKBENCH_IMAGES`` offers two images (the single-user image and a second
one built from it, both in the node's Docker: nothing is pulled). A user
logged in as in a browser picks the second on the spawn form; the pod the
API lists runs it. The next start without a pick runs the configured image
again, and a pick of an image the hub does not offer is a 4xx sentence that
creates nothing.
"""

from __future__ import annotations

import html
import re
import subprocess
import uuid

import pytest
import requests

from tests.conftest import hub_form, hub_pool, native_sign_up, wait_until
from tests.kubernetes.kube import create_namespace, delete_namespace, delete_pods_of, hub_env, pods_of
from workbench_spawner.backends.kubernetes import cluster

pytestmark = [pytest.mark.kubernetes, pytest.mark.integration]

PASSWORD = "correct-horse-battery"
STOP_TIMEOUT = 180  # the kubelet confirms a pod's deletion in 8-17 s here, longer on a loaded host


@pytest.fixture(scope="module")
def other_image(singleuser_image):
    """A second single-user image in the node's Docker, built from the first (a label tells them apart)."""
    name = f"{singleuser_image}-k8s-pick"
    build = subprocess.run(
        ["docker", "build", "-t", name, "-"],
        input=f"FROM {singleuser_image}\nLABEL workbench.test-pick=1\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    yield name
    subprocess.run(["docker", "rmi", "-f", name], capture_output=True, check=False)


@pytest.fixture(scope="module")
def image_hub(k8s_cluster, singleuser_image, other_image, tmp_path_factory):
    """(hub, namespace): a gpu-kubernetes hub offering both images; the user ``picker`` may sign up."""
    namespace = create_namespace("wbt-img")
    env = {
        **hub_env(k8s_cluster, namespace, singleuser_image),
        "WORKBENCH_IMAGES": f"{singleuser_image},{other_image}",
        "WORKBENCH_ADMIN_USERS": "picker",
        "WORKBENCH_PROFILES": "small*:0.25:1G",  # the node has 2 cores; a pod's limits are its requests
    }
    try:
        with hub_pool(tmp_path_factory.mktemp("k8s-img")) as start:
            yield start(env), namespace
    finally:
        delete_namespace(namespace)


def running_image(namespace: str, user: str) -> str:
    """The image of the user's one live pod's container, as the Kubernetes API lists it."""
    live = [p for p in pods_of(namespace, user) if not p["metadata"].get("deletionTimestamp")]
    assert len(live) == 1, f"{user} has {len(live)} pods"
    (container,) = live[0]["spec"]["containers"]
    return container["image"]


def stop(hub, namespace: str, user: str) -> None:
    r = hub.api("DELETE", f"/users/{user}/server")
    assert r.status_code in (202, 204), r.text
    hub.wait_stopped(user, STOP_TIMEOUT)
    wait_until(lambda: not pods_of(namespace, user), 90, f"{user}'s pod to be deleted")


def test_the_image_picked_on_the_form_is_the_pods_and_the_next_start_runs_the_default_again(
    image_hub, singleuser_image, other_image
):
    hub, namespace = image_hub
    user = "picker"
    assert "The signup was successful" in native_sign_up(requests.Session(), hub.url, user, PASSWORD)
    session = requests.Session()
    assert hub_form(session, hub.url, "/hub/login", {"username": user, "password": PASSWORD}).status_code == 302
    try:
        form = session.get(f"{hub.url}/hub/spawn", timeout=30)
        assert form.status_code == 200, form.text[-2000:]
        select = re.search(r'<select[^>]*name="image"[^>]*>(.*?)</select>', form.text, re.S)
        assert select, form.text[-3000:]
        offered = [html.unescape(v) for v in re.findall(r'<option value="([^"]*)"', select.group(1))]
        assert offered == [singleuser_image, other_image], "the form offers the configured images, default first"

        # The user picks the second image and submits the form, as a browser does.
        r = hub_form(session, hub.url, "/hub/spawn", {"gpus": "1", "image": other_image})
        assert r.status_code == 302, r.text[-2000:]
        hub.wait_ready(user, 240)
        assert running_image(namespace, user) == other_image
        stop(hub, namespace, user)

        # Started again without a pick (the API, no image option): the configured image, not the last pick.
        assert hub.spawn(user, gpus=0).status_code in (201, 202)
        hub.wait_ready(user, 240)
        assert running_image(namespace, user) == singleuser_image
        stop(hub, namespace, user)
    finally:
        if hub.server(user) is not None:
            hub.api("DELETE", f"/users/{user}/server")
            hub.wait_stopped(user, STOP_TIMEOUT)
        delete_pods_of(namespace, user)


def test_an_image_the_hub_does_not_offer_is_a_4xx_sentence_that_creates_nothing(image_hub, singleuser_image):
    hub, namespace = image_hub
    user = f"refused{uuid.uuid4().hex[:5]}"
    hub.create_users(user)
    r = hub.spawn(user, gpus=1, image="alpine:latest")
    assert 400 <= r.status_code < 500, r.text
    message = r.json()["message"]
    assert "image 'alpine:latest' is not offered here; choose one of: " in message, message
    assert singleuser_image in message, message
    assert hub.server(user) is None
    assert pods_of(namespace, user) == []
    claims = cluster.blocking(lambda api: api.list_namespaced_persistent_volume_claim(namespace))
    assert not [c for c in claims.items if c.metadata.name.endswith(f"-home-{user}")], "no home was made either"
