"""Each main command end to end with ``--device cuda`` (marked ``gpu``: skipped without a CUDA device).

Complements test_cuda_paths.py (library level): here every CLI path that trains, attacks, defends, certifies
or runs RL is driven through the entry point on the GPU, in-process, and checked (a) to finish, (b) to have
allocated CUDA memory (so the work really ran there), and, where CPU and GPU should agree, (c) against the CPU.
``MODELWARD_GPU_TEST_DEVICE`` (default ``cuda``) lets a developer point them at another device, e.g. ``mps``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from modelward.cli.main import main

pytestmark = pytest.mark.gpu
EX = Path(__file__).resolve().parents[2] / "examples"
DEVICE = os.environ.get("MODELWARD_GPU_TEST_DEVICE", "cuda")


def _run(*argv: str) -> None:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--device", DEVICE])
    assert e.value.code in (0, None), f"{argv} exited with {e.value.code}"


def _on_gpu(*argv: str) -> None:
    """Run a command and check that it allocated CUDA memory (the work ran on the GPU)."""
    if DEVICE.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    _run(*argv)
    if DEVICE.startswith("cuda"):
        assert torch.cuda.max_memory_allocated() > 0


ROBUST_TINY = ["--set", "model.arch=c(4,4,2).d(16)", "--set", "train.epochs=3", "--set", "train.batch_size=128",
               "--set", "train.lr=0.01", "--set", "evaluate.max_points=120", "--set", "evaluate.epsilons=[0.1, 0.3]"]


def test_train_with_bf16_amp(tmp_path: Path) -> None:
    _on_gpu("train", str(EX / "completion_digits.toml"), "--out", str(tmp_path / "m.safetensors"),
            "--set", "train.steps=100", "--set", "train.eval_every=50", "--set", "train.amp=bf16")
    assert (tmp_path / "m.safetensors").stat().st_size > 0


def test_robust_gloro_train_certify_attack_and_cpu_agreement(tmp_path: Path) -> None:
    out = tmp_path / "gloro"
    _on_gpu("robust", "train", str(EX / "robust_gloro.toml"), "--out", str(out), *ROBUST_TINY)
    _on_gpu("robust", "certify", str(EX / "robust_gloro.toml"), "--model", str(out), "--out", str(out / "gpu"),
            *ROBUST_TINY, "--set", 'evaluate.attacks=[{name="pgd", params={norm="l2", steps=10}}]')
    # the same saved model certified on the CPU: the certificate is computed in float64 from the same weights
    with pytest.raises(SystemExit):
        main(["robust", "certify", str(EX / "robust_gloro.toml"), "--model", str(out), "--out", str(out / "cpu"),
              *ROBUST_TINY, "--no-attacks", "--device", "cpu"])
    gpu = json.loads((out / "gpu" / "certify.json").read_text())
    cpu = json.loads((out / "cpu" / "certify.json").read_text())
    rows = lambda t: t["rows"] if isinstance(t, dict) else t  # noqa: E731 - records' JSON layout
    for g, c in zip(rows(gpu), rows(cpu), strict=True):
        assert abs(g["vra"] - c["vra"]) <= 0.02 and abs(g["clean_accuracy"] - c["clean_accuracy"]) <= 0.02
    _on_gpu("robust", "attack", str(EX / "robust_gloro.toml"), "--model", str(out), "--out", str(out / "att"),
            *ROBUST_TINY, "--set", 'evaluate.attacks=[{name="pgd", params={norm="l2", steps=40}}, '
                                   '{name="cw", params={steps=20, binary_steps=2}}]')
    assert (out / "att" / "attack.csv").is_file()


@pytest.mark.parametrize("mode", ["pgd", "trades", "rtk"])
def test_robust_training_modes(tmp_path: Path, mode: str) -> None:
    _on_gpu("robust", "train", str(EX / "robust_gloro.toml"), "--out", str(tmp_path / mode), *ROBUST_TINY,
            "--set", f"train.mode={mode}", "--set", "train.adversarial.attack_steps=3", "--set", "train.amp=bf16")


def test_plasticity_study(tmp_path: Path) -> None:
    _on_gpu("study", "plasticity", str(EX / "plasticity.toml"), "--out", str(tmp_path / "p"),
            "--set", "clean_epochs=1", "--set", "adv_epochs=1", "--set", "data.max_samples=200",
            "--set", "eval_attack.steps=2", "--set", "adversarial.attack_steps=2", "--set", "eval_attack.train_subset=40")


def test_extraction_defenses_and_attacks(tmp_path: Path) -> None:
    _on_gpu("extract", "run", str(EX / "extraction_digits.toml"), "--out", str(tmp_path / "x"),
            "--set", "budget=200", "--set", "substitute.epochs=5", "--set", "victim.train.steps=80",
            "--set", 'victim.model={arch="mlp", hidden=[24]}', "--set", "centroid_epsilons=[]",
            "--set", 'defenses=[{name="none"}, {name="reverse_sigmoid", label="revsig"}, {name="modelguard_s"}]',
            "--set", 'attacks=[{strategy="naive"}, {query="jbda", strategy="naive"}, {strategy="s4l"}]',
            "--set", f'victim.cache_dir="{tmp_path / "cache"}"')
    assert (tmp_path / "x" / "results.csv").is_file()


@pytest.mark.parametrize("agent", ["a2c", "recurrent", "dqn", "rainbow", "impala"])
def test_rl_completion_agent_updates(tmp_path: Path, agent: str) -> None:
    _run("complete", "run", str(EX / "completion_cartpole.toml"), "--out", str(tmp_path / agent), "--workers", "1",
         "--set", f"rl.agent={agent}", "--set", 'parts=["linear"]', "--set", "seeds=[0]", "--set", "rl.steps=800",
         "--set", "rl.eval_every=400", "--set", "rl.filter_random=false",
         "--set", 'procedures=[{name="T1", kind="T1"}]')
    assert (tmp_path / agent / "hardness.csv").is_file()


def test_supervised_completion(tmp_path: Path) -> None:
    _run("complete", "run", str(EX / "completion_digits.toml"), "--out", str(tmp_path / "c"), "--workers", "1",
         "--set", "seeds=[0]", "--set", "train.steps=60", "--set", "train.eval_every=20", "--set", "parts=[\"fc1\"]")
    assert (tmp_path / "c" / "hardness.csv").is_file()


def test_privacy_audit_shadow_training(tmp_path: Path) -> None:
    cfg = tmp_path / "tiny.toml"
    cfg.write_text('name = "tiny"\n[data]\nsource = "breast_cancer"\n[model]\narch = "mlp"\nhidden = [16]\n'
                   '[train]\nlr = 0.1\nbatch_size = 32\nsteps = 60\n[shadows]\ncount = 4\n'
                   '[[attacks]]\nname = "naive"\n[[attacks]]\nname = "lira"\n')
    _on_gpu("privacy", "audit", str(cfg), "--out", str(tmp_path / "a"))
    assert (tmp_path / "a" / "results.json").is_file()


def test_explain_attributions(tmp_path: Path) -> None:
    _on_gpu("explain", str(EX / "explain_digits.toml"), "--out", str(tmp_path / "e"),
            "--set", "models.0.train.steps=40", "--set", "explain.n_inputs=3", "--set", "explain.classes=[0, 1]",
            "--set", "explain.top_k=2", "--set", "explain.steps=8", "--set", "explain.smoothgrad_samples=4",
            "--set", "explain.inversion_steps=5", "--set", "explain.per_class_points=4")
