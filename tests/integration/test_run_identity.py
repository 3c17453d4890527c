"""A run is named by what defines its model: another sampler reuses the checkpoint, a larger
``trainer.steps`` continues the run, and a refused command writes nothing."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from doc_pages import all_text
from entry_helpers import ROOT, TOY, TOY_STEPS, copy_run, run, run_inprocess
from omegaconf import OmegaConf

from experiments import schema
from experiments.runs import saved_steps
from scorelib.samplers import SAMPLERS


def _exclude_keys() -> list[str]:
    """The keys ``experiments.train`` leaves out of a run's directory, as Hydra composes them."""
    from hydra import compose, initialize_config_dir

    schema.register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", return_hydra_config=True)
    return list(cfg.hydra.job.config.override_dirname.exclude_keys)


def test_sampler_and_steps_are_not_part_of_the_run_name():
    keys = set(_exclude_keys())
    fields = {f for name in SAMPLERS for f in schema.sampler_schema(name).__dataclass_fields__}
    assert {f"sampler.{f}" for f in fields} | {"sampler"} <= keys
    assert {f"trainer.{f}" for f in schema.TRAINER_NOT_IDENTITY} <= keys
    # what defines the model stays in the name
    for key in (
        "trainer.seed",
        "trainer.batch_size",
        "trainer.ema_decay",
        "init_from",
        "model.width",
        "process",
        "data",
        "objective",
        "optim.lr",
    ):
        assert key not in keys


def _run_dir_of(command: str) -> str:
    """The directory ``python -m experiments.train <overrides>`` writes (Hydra compose)."""
    from hydra import compose, initialize_config_dir

    overrides = [a for a in shlex.split(command) if "=" in a and not a.startswith("-")]
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    return f"outputs/{cfg.name}/{cfg.hydra.job.override_dirname}".rstrip("/")


def test_the_docs_show_the_directory_each_training_example_writes():
    """Each ``python -m experiments.train ...  # -> outputs/...`` of README.md and docs/*.md."""
    schema.register_configs()
    text = all_text()
    examples = re.findall(r"python -m experiments\.train ([^\n#]*?)\s*# -> (outputs/\S+)", text)
    assert len(examples) >= 12, examples
    for command, shown in examples:
        assert _run_dir_of(command) == shown, command


@pytest.mark.slow
def test_another_sampler_reuses_the_checkpoint_and_more_steps_continue(
    toy_run, tmp_path, monkeypatch
):
    """The commands run through ``experiments.train``'s ``main()`` in ``tmp_path``."""
    home = tmp_path
    monkeypatch.chdir(home)  # outputs/ lands here
    run_dir = copy_run(toy_run, home / "outputs" / "toy_dsm")
    metrics = (run_dir / "metrics.jsonl").read_text()
    launches = len(json.loads((run_dir / "run_info.json").read_text())["launches"])

    # another sampler: the same run directory, no training, samples with the new sampler
    toy = [a for a in TOY if not a.startswith("sampler.steps=")]
    r = run_inprocess("train", *toy, "sampler=dpmpp_2m", "sampler.steps=10")
    assert r.code == 0, r.stderr[-3000:]
    assert "run directory: outputs/toy_dsm\n" in r.stdout, r.stdout  # relative to the cwd
    assert (run_dir / f"samples/step{TOY_STEPS}/dpmpp_2m_10_n1000_seed0/samples.npz").is_file()
    assert (run_dir / "metrics.jsonl").read_text() == metrics  # not one step trained
    assert saved_steps(run_dir)[-1] == TOY_STEPS
    info = json.loads((run_dir / "run_info.json").read_text())
    assert len(info["launches"]) == launches + 1
    assert "sampler=dpmpp_2m" in info["launches"][-1]["command"]
    assert "sampling (dpmpp_2m)" in r.stderr  # the progress bar

    # a larger trainer.steps continues the run from its checkpoint
    more = TOY_STEPS + 50
    r = run_inprocess("train", *TOY, f"trainer.steps={more}")
    assert r.code == 0, r.stderr[-3000:]
    assert saved_steps(run_dir)[-1] == more
    new = (run_dir / "metrics.jsonl").read_text()
    assert new.startswith(metrics) and json.loads(new.splitlines()[-1])["step"] == more
    assert (run_dir / f"samples/step{more}/euler_maruyama_100_n1000_seed0/samples.npz").is_file()

    # a smaller one says so, naming the field, and writes nothing
    snapshot = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    r = run_inprocess("train", *TOY, f"trainer.steps={TOY_STEPS // 2}")
    assert r.code == 2 and len(r.err_lines) == 1, r.stderr[-2000:]
    assert f"trainer.steps must be >= {more}" in r.err_lines[0]
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == snapshot


@pytest.mark.slow
def test_a_refused_resume_writes_nothing(toy_run, tmp_path):
    """A checkpoint of another model is refused clearly through the real command line:
    exit status 2, one line naming the field, no traceback, and nothing written."""
    run_dir = copy_run(toy_run, tmp_path / "run")
    snapshot = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    r = run("train", *TOY, "model.width=64", f"hydra.run.dir={run_dir}", check=False)
    assert r.code == 2 and len(r.err_lines) == 1, r.stderr[-2000:]
    assert "model.width: run 256, this command 64" in r.err_lines[0]
    assert "Traceback" not in r.stderr
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == snapshot


def _compose(*overrides):
    from hydra import compose, initialize_config_dir

    schema.register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def test_a_run_written_before_a_field_existed_resumes_while_it_holds_its_default(tmp_path):
    """A config.yaml without objective.p_uniform / sigma_range (a run from before they
    existed) is the same run as today's default; a non-default value is another run."""
    from experiments.runs.identity import check_same_run

    cfg = _compose("experiment=digits_edm")
    old = OmegaConf.to_container(cfg, resolve=True)
    del old["objective"]["p_uniform"], old["objective"]["sigma_range"]
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(old))
    check_same_run(tmp_path, cfg)  # no error
    other = _compose(
        "experiment=digits_edm", "objective.p_uniform=0.1", "objective.sigma_range=[0.002,80]"
    )
    with pytest.raises(ValueError, match="objective.p_uniform: run '<absent>', this command 0.1"):
        check_same_run(tmp_path, other)
    old["model"]["width"] = 7  # a real difference is still one
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(old))
    with pytest.raises(ValueError, match="model.width: run 7"):
        check_same_run(tmp_path, cfg)
