"""The cluster/ group and the Slurm launcher config, without a Slurm: the launcher takes its
resources from cluster/, no cluster field is part of a run's name, a sweep's job writes
where the same single run writes, and the docs' CIFAR-10 recipe (docs/clusters.md) points the
table at the directory its training command writes."""

from __future__ import annotations

import re
import shlex

import pytest
from doc_pages import all_text
from hydra import compose, initialize_config_dir
from slurm_helpers import ROOT

from experiments import schema
from experiments.runs.identity import identity


def _compose(overrides, name="train", hydra=True):
    schema.register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(name, overrides=overrides, return_hydra_config=hydra)


def _run_dir(cfg) -> str:
    return f"{cfg.hydra.sweep.dir}/{cfg.hydra.job.override_dirname}"


@pytest.mark.parametrize("option", ["local", "cpu", "gpu"])
def test_launcher_takes_its_resources_from_the_cluster_group(option):
    cfg = _compose(["hydra/launcher=slurm", f"cluster={option}", "cluster.mem_gb=3"])
    launcher, cluster = cfg.hydra.launcher, cfg.cluster
    assert launcher.mem_gb == 3
    for field, key in [
        ("timeout_min", "time_min"),
        ("nodes", "nodes"),
        ("tasks_per_node", "tasks_per_node"),
        ("gpus_per_node", "gpus_per_node"),
        ("cpus_per_task", "cpus_per_task"),
        ("partition", "partition"),
        ("account", "account"),
        ("signal_delay_s", "signal_delay_s"),
        ("max_num_timeout", "max_num_timeout"),
    ]:
        assert launcher[field] == cluster[key], field
    assert (cluster.gpus_per_node > 0) == (option == "gpu")


def test_reproduce_gets_the_launcher_defaults_without_a_cluster_node():
    cfg = _compose(["hydra/launcher=slurm", "table=gaussian_teleport"], name="reproduce")
    assert (cfg.hydra.launcher.gpus_per_node, cfg.hydra.launcher.timeout_min) == (1, 1440)


def test_no_cluster_field_names_or_identifies_a_run():
    fields = [f"cluster.{f}" for f in schema.CLUSTER_FIELDS]
    plain = _compose(["experiment=toy_dsm", "trainer.seed=1"])
    moved = _compose(
        ["experiment=toy_dsm", "trainer.seed=1", "hydra/launcher=slurm", "cluster=gpu"]
        + [f"{f}=1" for f in fields if f.endswith(("nodes", "_per_node", "num_processes"))]
    )
    assert _run_dir(plain) == _run_dir(moved) == "outputs/toy_dsm/trainer.seed-1"
    plain, moved = (_compose(c.hydra.overrides.task, hydra=False) for c in (plain, moved))
    assert identity(plain) == identity(moved)
    assert not any(k.startswith("cluster") for k in identity(moved))


def test_bad_cluster_field_is_refused_at_start_up():
    with pytest.raises(Exception, match="gpus_per_node"):
        _compose(["cluster.gpus_per_node=two"])


def test_the_docs_cifar_recipe_points_the_table_at_the_trained_run():
    text = all_text()
    block = re.search(
        r"python -m experiments\.train -m (hydra/launcher=slurm cluster=gpu [^#]*?"
        r"name=cifar10_edm[^#]*?)\n# the run directory",
        text,
    )
    assert block, "the CIFAR-10 recipe is not where this test expects it"
    overrides = shlex.split(block[1].replace("\\\n", " "))
    (shown,) = re.findall(r"RUN='(outputs/cifar10_edm/[^']+)'", text)
    assert _run_dir(_compose(overrides)) == shown
    assert '"table.checkpoint=$RUN"' in text


@pytest.mark.parametrize("module", ["train", "distill", "sample", "evaluate", "reproduce"])
def test_the_task_function_pickles_by_value(module):
    """Submitit pickles the Hydra task function with cloudpickle, by value when the command
    runs as ``python -m experiments.<module>`` (module ``__main__``): every global it
    reaches must pickle (a ContextVar did not, and broke hydra/launcher=slurm)."""
    import importlib

    import cloudpickle

    mod = importlib.import_module(f"experiments.{module}")
    task = mod.main.__wrapped__  # what hydra.main hands the launcher
    cloudpickle.register_pickle_by_value(mod)
    try:
        back = cloudpickle.loads(cloudpickle.dumps(task))
    finally:
        cloudpickle.unregister_pickle_by_value(mod)
    assert callable(back)


@pytest.mark.slow
def test_a_sweep_through_the_submitit_launcher_runs_without_slurm(tmp_path):
    """``-m hydra/launcher=submitit_local``: the same pickling and job start-up as the Slurm
    launcher, on any machine; the job writes where the single run would. (One job: 30-40 s
    on 2 cores, most of it JAX's start-up in the job.)"""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    for k in list(env):
        if k.startswith(("SLURM_", "SUBMITIT_")):
            del env[k]
    args = ["experiment=toy_dsm", "trainer.steps=5", "trainer.log_every=5", "model.width=8"]
    args += ["sampler.steps=2", "sampler.num_samples=8", "trainer.seed=1"]  # one job
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.train", "-m", "hydra/launcher=submitit_local", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "outputs/toy_dsm/model.width-8+trainer.seed-1"
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [5], proc.stderr[-3000:]
    assert (run_dir / "samples/step5").is_dir()
    assert (tmp_path / "outputs/toy_dsm/.submitit").is_dir()  # it went through submitit


def test_the_cifar10_fdistill_recipe_asks_the_launcher_for_a_node_of_gpus():
    """The Slurm command in the fdistill_cifar10 preset's comment composes to the preset
    with 8 GPUs per job, one task (JAX process) each, the 2048 batch a multiple of them
    (without ``cluster=gpu`` the jobs get ``cluster=local``'s resources: no GPU); the
    docs give the same command."""
    command = re.search(
        r"#   (python -m experiments\.distill -m (?:[^\n]*\\\n#)*[^\n]*)",
        (ROOT / "configs/experiment/fdistill_cifar10.yaml").read_text(),
    )
    assert command, "the preset's Slurm command is not where this test expects it"
    words = shlex.split(re.sub(r"\\\n#", " ", command[1]).replace("<your CIFAR-10 EDM run>", "t"))
    assert words[:4] == ["python", "-m", "experiments.distill", "-m"]
    overrides = [w.split(",")[0] for w in words[4:]]  # a sweep's first job
    cfg = _compose(overrides, name="distill")
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.gpus_per_node == 8 and cfg.cluster.gpus_per_node == 8
    assert cfg.hydra.launcher.tasks_per_node == 8 and cfg.cluster.tasks_per_node == 8
    assert cfg.trainer.batch_size % 8 == 0
    assert (cfg.trainer.batch_size, cfg.trainer.steps, cfg.distill.r1_weight) == (2048, 60000, 1)
    docs = " ".join(all_text().split())
    assert " ".join(words[:7]) in docs, " ".join(words[:7])
