"""No committed result records a machine's path (issue 39, item 9): results and recorded
commands name runs relative to the repository (``scorelib._io.portable_path``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from experiments.tables.common import command_line, metadata, relative_path
from scorelib._io import _ABSOLUTE, portable_path, portable_text

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ("experiments/tables/results", "benchmarks/results")
TEXT = {".md", ".json", ".csv", ".tex", ".txt", ".yaml"}


def committed_results() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", *RESULTS], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / f for f in out if Path(f).suffix in TEXT]


def absolute_paths(text: str) -> list[str]:
    return _ABSOLUTE.findall(text)


def test_the_scan_finds_a_planted_path():
    # the check below can fail: each of these holds a machine path
    for text in (
        "table.model=/tmp/demo/outputs/digits_edm",
        '"model": "/home/me/repo/outputs/run"',
        "Command: `python x.py --out /scratch/a/b.json`",
        "[/work/main/outputs/a,/work/main/outputs/b]",
    ):
        assert absolute_paths(text), text
    for text in ("outputs/digits_edm", "1/2 of the runs", "a/b", "<outside>/digits_edm", "w/o"):
        assert not absolute_paths(text), text


def test_no_committed_result_holds_an_absolute_path():
    files = committed_results()
    assert len(files) > 20  # the scan sees the committed tables and benchmarks
    found = {}
    for f in files:
        hits = absolute_paths(f.read_text(errors="replace"))
        if hits:
            found[str(f.relative_to(ROOT))] = hits[:3]
    assert not found, f"machine paths in committed results: {found}"


def test_portable_path_inside_and_outside_the_root(tmp_path):
    root = tmp_path / "repo"
    (root / "outputs" / "run").mkdir(parents=True)
    assert portable_path(root / "outputs" / "run", root) == "outputs/run"
    assert portable_path(root, root) == "."
    assert portable_path(tmp_path / "elsewhere" / "run", root) == "<outside>/run"
    assert portable_path("outputs/run", root) == "outputs/run"  # relative: as given
    text = f"table.model={root}/outputs/run hydra.run.dir=/scratch/x/y"
    assert portable_text(text, root) == "table.model=outputs/run hydra.run.dir=<outside>/y"


def test_recorded_commands_and_configs_are_portable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs" / "m").mkdir(parents=True)
    cmd = command_line(
        ["table=msma", f"table.model={tmp_path}/outputs/m", "hydra.run.dir=/elsewhere/r/msma"]
    )
    assert cmd == (
        "python -m experiments.reproduce table=msma table.model=outputs/m "
        "'hydra.run.dir=<outside>/msma'"
    )
    meta = metadata(
        {"model": f"{tmp_path}/outputs/m", "list": ["/a/b/c"]}, command=cmd, seeds=[0], wall_s=1.0
    )
    assert meta["config"] == {"model": "outputs/m", "list": ["<outside>/c"]}
    assert relative_path("/x/y/run", tmp_path) == "<outside>/run"


def test_the_msma_note_names_its_model_portably(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from experiments.tables.msma import model_note

    monkeypatch.chdir(tmp_path)
    model = tmp_path / "outputs" / "digits_edm"
    model.mkdir(parents=True)
    note = model_note(OmegaConf.create({"model": str(model)}), model)
    assert "`table.model=outputs/digits_edm`" in note and str(tmp_path) not in note
