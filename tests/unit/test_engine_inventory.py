"""What any engine's inventory shares (placement/engine_inventory.py, ledger/node_book.py), driven by a toy third
engine: simulated devices take a node's first places and placeholders the rest, the sentence an admin reads, and
a book that names placeholders by the places its reports name. (Slurm's and Kubernetes' own words:
test_slurm_slices.py, test_kubernetes_inventory.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from workbench_devices import DeviceInventory, GPUDevice, parse_simulated_spec
from workbench_spawner.ledger.node_book import NodeBook
from workbench_spawner.placement.engine_inventory import is_simulated, node_devices, summarized


def toy_placeholder(node: str, index: int) -> GPUDevice:
    return GPUDevice(uuid=f"TOY-{node}-gpu{index}", index=index, name=f"GPU on {node}", memory_total_bytes=7, node=node)


class ToyBook(NodeBook):
    """A third engine's book: per node, index -> uuid."""

    key = "toy-node-gpus"
    engine = "toy"

    @staticmethod
    def places(known: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
        return {(node, int(index)): {"uuid": uuid} for node, rows in known.items() for index, uuid in rows.items()}

    def accept(self, node: str, index: int, uuid: str) -> None:
        def learn(known: dict[str, Any]) -> bool:
            if uuid in self.owners(known):
                raise ValueError(f"{uuid} is known at {self.owners(known)[uuid]}")
            known.setdefault(node, {})[str(index)] = uuid
            return True

        self.update(learn)


class EntryBook(ToyBook):
    """A book whose reports say more than the UUID (as Slurm's jobs do): per node, a list of entries by index."""

    @staticmethod
    def places(known: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
        return {(node, i): entry for node, rows in known.items() for i, entry in enumerate(rows)}


@pytest.mark.parametrize(
    ("spec", "simulated"), [("", False), ("0", False), (" 0 ", False), ("2", True), ("1xA100", True)]
)
def test_simulated_nodes_are_asked_for_by_a_spec_other_than_nothing_or_zero(spec, simulated):
    assert is_simulated(spec) is simulated


def test_the_spec_takes_a_nodes_first_places_and_placeholders_the_rest():
    spec = parse_simulated_spec("2xH100-80GB", "n1")
    devices = node_devices("n1", spec, [toy_placeholder("n1", i) for i in range(3)])
    assert [(d.uuid, d.index, d.node) for d in devices] == [
        (spec[0].uuid, 0, "n1"),
        (spec[1].uuid, 1, "n1"),
        ("TOY-n1-gpu2", 2, "n1"),  # the spec lists fewer devices than the engine counts
    ]
    one = node_devices("n1", spec, [toy_placeholder("n1", 0)])
    assert [d.uuid for d in one] == [spec[0].uuid]  # a node takes as many as the engine counts
    assert node_devices("n1", [], []) == []


def test_the_inventory_says_what_was_found_in_the_engines_words():
    whole = [toy_placeholder("n1", 0), toy_placeholder("n1", 1)]
    real = summarized("toy", "Toy", False, whole, "n1 (2)")
    assert (real.source, real.devices, real.message) == ("toy", whole, "2 GPU(s) on Toy nodes n1 (2)")
    simulated = summarized("toy", "Toy", True, whole, "n1 (2)")
    assert (simulated.source, simulated.message) == (
        "simulated",
        "2 simulated GPU(s), readings made up on Toy nodes n1 (2)",
    )
    sliced = [*whole, GPUDevice("MIG-a", 0, "slice", 1, mig=True, profile="1g.18gb")]
    assert summarized("toy", "Toy", False, sliced, "n1").message == "3 GPU(s) on Toy nodes n1"  # slices are GPUs
    assert summarized("toy", "Toy", False, sliced, "n1", slices_apart=True).message == (
        "2 GPU(s) and 1 MIG slice(s) on Toy nodes n1"
    )


def test_a_book_names_its_engines_placeholders_by_place_and_keeps_a_uuid_in_one_place(store):
    inventory = DeviceInventory("toy", node_devices("n1", [], [toy_placeholder("n1", i) for i in range(2)]), "m")
    book = ToyBook(store)
    assert book.resolve(inventory) == inventory
    book.accept("n1", 1, "GPU-b")
    assert [(d.uuid, d.name, d.memory_total_bytes) for d in book.resolve(inventory).devices] == [
        ("TOY-n1-gpu0", "GPU on n1", 7),
        ("GPU-b", "GPU on n1", 7),  # a report that names only the UUID keeps the placeholder's name and memory
    ]
    assert book.resolve(inventory).message == "m"
    with pytest.raises(ValueError, match=r"GPU-b is known at \('n1', 1\)"):
        book.accept("n2", 0, "GPU-b")
    simulated = DeviceInventory("simulated", inventory.devices, "")
    assert ToyBook.resolve_with(simulated, book.known()) == simulated  # another source's devices are its own
    assert book.forget("n1")
    assert book.resolve(inventory) == inventory


def test_a_report_names_a_slices_gpu_only_where_it_is_that_slice():
    slice_ = GPUDevice("TOY-n1-gpu0", 0, "1g.18gb slice on n1", 0, mig=True, node="n1", profile="1g.18gb")
    entry = {"uuid": "MIG-x", "name": "H200 MIG", "memory_total_bytes": 18, "profile": "1g.18gb"}
    entry |= {"parent_uuid": "GPU-p", "model": "H200-141GB"}

    def named(**changes: Any) -> GPUDevice:
        (device,) = EntryBook.resolve_with(DeviceInventory("toy", [slice_], ""), {"n1": [entry | changes]}).devices
        return device

    device = named()
    assert (device.uuid, device.name, device.memory_total_bytes) == ("MIG-x", "H200 MIG", 18)
    assert (device.parent_uuid, device.model) == ("GPU-p", "H200-141GB")
    other = named(profile="3g.71gb")
    assert (other.uuid, other.parent_uuid, other.model) == ("MIG-x", "", "")
