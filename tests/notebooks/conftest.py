"""Fixtures for executing the starter notebooks in a fresh kernel.

The kernel is always the Python running pytest (a throw-away kernelspec pointing at
``sys.executable`` is put first on JUPYTER_PATH), so the notebooks see exactly the
packages of the test environment (torch 2.13.0 CPU, ipykernel, ...).

``run_notebook(name)`` executes ``notebooks/<name>`` with its working directory in a
temporary folder laid out like a user's ``~/notebooks`` (the helper modules of ``notebooks/``,
such as ``workbench_timing.py``, are copied next to it, as both backends copy the whole folder),
with ``WORKBENCH_NOTEBOOK_QUICK=1`` (short timing blocks), and returns (output text, parsed
markdown tables, seconds). Table rows whose cell count differs from the header's are collected
in ``markdown_tables.bad_rows`` so the tests can refuse them.
"""

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
KERNEL_NAME = "workbench-notebook-test"


@pytest.fixture(scope="session")
def kernel_name(tmp_path_factory):
    root = tmp_path_factory.mktemp("jupyter")
    spec_dir = root / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "workbench notebook tests",
                "language": "python",
            }
        )
    )
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(root)] + ([old] if old else []))
    yield KERNEL_NAME
    if old is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = old


def execute_notebook(path, kernel_name, workdir, timeout=600):
    """Run every cell of ``path`` in a fresh kernel (cwd = workdir); return (notebook, seconds)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    client = NotebookClient(
        nb, kernel_name=kernel_name, timeout=timeout, resources={"metadata": {"path": str(workdir)}}
    )
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError on the first failing cell
    return nb, time.perf_counter() - t0


def output_text(nb):
    """All stream and text/plain outputs of a notebook, concatenated."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out and "text/plain" in out["data"]:
                parts.append(out["data"]["text/plain"])
    return "\n".join(parts)


def markdown_tables(text):
    """Parse printed markdown tables: {title: [row dicts]}; title is the '#### ' line above."""
    tables, title, lines = {}, None, text.splitlines()
    markdown_tables.bad_rows = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("#### "):
            title = line[5:].strip()
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|(\s*:?-+:?\s*\|)+$", lines[i + 1].strip()):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if len(cells) != len(header):
                    markdown_tables.bad_rows.append((title, len(header), cells))
                rows.append(dict(zip(header, cells, strict=False)))  # a short or long row is recorded above
                i += 1
            tables[title or f"table {len(tables)}"] = rows
            title = None
            continue
        i += 1
    return tables


def copy_helpers(workdir):
    """Put the helper modules of notebooks/ next to the executed notebook, as in a user's home."""
    for helper in NOTEBOOK_DIR.glob("*.py"):
        shutil.copy2(helper, workdir / helper.name)


@pytest.fixture
def run_notebook(kernel_name, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_NOTEBOOK_QUICK", "1")  # the kernel inherits it

    def run(name):
        copy_helpers(tmp_path)
        nb, seconds = execute_notebook(NOTEBOOK_DIR / name, kernel_name, tmp_path)
        text = output_text(nb)
        tables = markdown_tables(text)
        return text, tables, seconds, list(markdown_tables.bad_rows)

    return run
