"""The example notebooks run top to bottom (nbclient), are stored without outputs, and show what a notebook
user expects: at least one figure inline and one table as a DataFrame."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def _outputs(book) -> list[dict]:
    return [out for cell in book.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_shows_a_figure_and_a_dataframe(path):
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("ipykernel")
    pytest.importorskip("pandas")
    book = nbformat.read(path, as_version=4)
    assert not _outputs(book), "store notebooks with their outputs cleared"
    nbclient.NotebookClient(book, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = _outputs(book)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    shown = [o.get("data", {}) for o in outputs if o.get("output_type") in ("display_data", "execute_result")]
    assert any("image/png" in data for data in shown), f"{path.name} shows no figure inline"
    assert any('class="dataframe"' in data.get("text/html", "") for data in shown), \
        f"{path.name} shows no DataFrame"
    assert not any("Figure size" in data.get("text/plain", "") and "image/png" not in data for data in shown), \
        "a figure printed as text instead of drawn"


def test_there_are_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert len(names) >= 3 and "validation_parity.ipynb" in names
