"""The package works wherever it is installed: the wheel carries the bundled model, its drafters
and the example prompts (not the training state), and an installed copy finds them from any
folder, through importlib.resources, or in $EVSPARK_MODELS."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = "evspark-sh2-192"


def _source_copy(dest: Path) -> Path:
    """The files a build reads, plus training leftovers that must stay out of the wheel."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "evspark_cli", dest / "evspark_cli",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "examples", dest / "examples")
    shutil.copytree(ROOT / "models", dest / "models",
                    ignore=shutil.ignore_patterns("train_state", "teacher_cache", "__pycache__"))
    for leftover in ("train_state/ckpt.pt", "teacher_cache/index.json",
                     "drafters/seed0.run/ckpt.pt"):
        path = dest / "models" / MODEL / leftover
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("training state")
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = _source_copy(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("wheel")
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--no-index", "-q", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    wheels = list(out.glob("evspark-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_holds_the_model_drafters_and_prompts_not_the_training_state(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    m = f"evspark_cli/models/{MODEL}"
    want = {"evspark_cli/models/DEFAULT", f"{m}/config.json", f"{m}/model.safetensors",
            f"{m}/MODEL_CARD.md", "evspark_cli/examples/prompts.fa"}
    want |= {f"{m}/drafters/seed{s}/{f}" for s in range(3)
             for f in ("config.json", "model.safetensors")}
    assert want <= names, sorted(want - names)
    leaks = [n for n in names if "train_state" in n or "teacher_cache" in n or ".run/" in n]
    assert not leaks, leaks
    assert sum(zipfile.ZipFile(wheel).getinfo(n).file_size for n in names) < 40 * 2**20


def test_wheel_holds_every_module_of_the_tree(wheel):
    """The package list in pyproject.toml is explicit: a new subpackage must be added there."""
    names = set(zipfile.ZipFile(wheel).namelist())
    tree = {p.relative_to(ROOT).as_posix() for p in (ROOT / "evspark_cli").rglob("*.py")}
    assert tree - names == set()
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "evspark = evspark_cli.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


@pytest.mark.slow
def test_an_installed_copy_finds_its_model_and_prompts_from_any_folder(wheel, tmp_path):
    """Installed (not editable) into a folder of its own, run from another folder: the bundled
    target, its drafter and the example prompts are found in the installed package."""
    site = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                        "--target", str(site), str(wheel)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("EVSPARK_MODELS", "EVSPARK_DEBUG")}
    env["PYTHONPATH"] = str(site)  # the installed copy first, whatever else is on the path

    def evspark(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "evspark_cli.cli", *args], cwd=elsewhere,
                              env=env, capture_output=True, text=True, timeout=300)

    r = evspark("info")
    assert r.returncode == 0, r.stderr
    assert str(site / "evspark_cli" / "models" / MODEL) in r.stdout
    r = evspark("verify", "-n", "8", "--threads", "1", "-q")
    assert r.returncode == 0, r.stderr
    assert "drafter=dspark" in r.stdout and "non_tie_divergences=0" in r.stdout


def test_evspark_models_names_another_model_store(tmp_path, monkeypatch):
    from evspark_cli.bundled import default_model_dir, example_prompts, models_dir

    store = tmp_path / "store"
    (store / "b-model").mkdir(parents=True)
    (store / "a-model").mkdir()
    for d in ("a-model", "b-model"):
        (store / d / "config.json").write_text("{}")
    monkeypatch.setenv("EVSPARK_MODELS", str(store))
    assert models_dir() == store
    assert default_model_dir() == store / "a-model"  # no DEFAULT: the first model folder
    (store / "DEFAULT").write_text("b-model\n")
    assert default_model_dir() == store / "b-model"
    assert example_prompts().is_file()  # the prompts stay the package's own
    monkeypatch.delenv("EVSPARK_MODELS")
    assert (models_dir() / "DEFAULT").is_file()
