"""Packaging for workflows and HPC: the conda recipe, the container recipes, the Nextflow module.

What can run here runs: the conda recipe's test commands against the installed `evspark`, the
Nextflow workflow (stub and real) when a working `nextflow` is on PATH. What cannot (conda-build,
docker, apptainer: no engine on a test machine) is checked against the repository it builds
from: the same torch, the same test command as the README, every folder the tests need.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny import trained_tiny_dir  # noqa: E402

import evspark_cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NEXTFLOW_DIR = ROOT / "examples" / "nextflow"
MODULE = NEXTFLOW_DIR / "modules" / "evspark" / "generate"
README = (ROOT / "README.md").read_text()
TEST_COMMAND = "python -m pytest -q"


def _env() -> dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = str(Path(sys.executable).parent) + os.pathsep + e.get("PATH", "")
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return e


def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _meta_yaml() -> dict:
    yaml = pytest.importorskip("yaml")
    jinja2 = pytest.importorskip("jinja2")
    text = (ROOT / "conda" / "meta.yaml").read_text()
    return yaml.safe_load(jinja2.Template(text).render(PYTHON="python"))


def _dist_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[]", requirement.strip(), maxsplit=1)[0].lower()


# ------------------------------------------------------------------------------ conda recipe


def test_conda_recipe_matches_the_package():
    meta = _meta_yaml()
    project = _pyproject()["project"]
    assert meta["package"]["version"] == project["version"] == evspark_cli.__version__
    conda_names = {"torch": "pytorch"}  # conda-forge's name for torch
    run = {_dist_name(r) for r in meta["requirements"]["run"]}
    for dep in project["dependencies"]:
        assert conda_names.get(_dist_name(dep), _dist_name(dep)) in run, dep
    torch_pin = next(r for r in meta["requirements"]["run"] if r.startswith("pytorch"))
    want = next(d for d in project["dependencies"] if d.startswith("torch"))
    assert torch_pin.split(None, 1)[1] == want[len("torch"):]
    assert meta["build"]["entry_points"] == [
        f"evspark = {project['scripts']['evspark']}"]


@pytest.mark.slow
def test_conda_recipe_test_commands_pass(tmp_path):
    """The recipe's test section, run here against the installed package."""
    commands = _meta_yaml()["test"]["commands"]
    assert "evspark --help" in commands
    assert any(c.startswith("evspark generate ") for c in commands)
    for cmd in commands:
        p = subprocess.run(cmd, shell=True, cwd=tmp_path, env=_env(), capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, f"{cmd}: {p.stderr[-2000:]}"


# -------------------------------------------------------------------------- container recipes


def test_container_recipes_build_what_ci_tests():
    """Docker and Apptainer install the torch CI tests, from PyPI by default, then the package
    with its test extra, and run the README's test command; the image holds the bundled model."""
    torch = re.search(r"torch==([0-9.]+)", README).group(1)
    docker = (ROOT / "Dockerfile").read_text()
    apptainer = (ROOT / "apptainer" / "evspark.def").read_text()
    assert TEST_COMMAND in README
    for recipe in (docker, apptainer):
        assert f"TORCH={torch}" in recipe
        assert '-e ".[test]"' in recipe
        assert "ruff check . && " + TEST_COMMAND in recipe
        assert "shared" not in recipe.lower()  # the suite needs nothing outside the repository
    assert "ARG TORCH_INDEX=\n" in docker and "TORCH_INDEX=\n" in apptainer  # PyPI by default
    # the Docker image is the runtime stage: a plain install from the repository, no test extra,
    # built only after the test stage (editable, with the suite) has passed
    test, runtime = docker.split("FROM base AS test\n", 1)[1].split("FROM base AS runtime\n", 1)
    assert '-e ".[test]"' in test and "touch /opt/evspark/.tested" in test
    assert "COPY --from=test /opt/evspark/.tested" in runtime
    assert "pip install /tmp/evspark-src" in runtime and "-e " not in runtime
    assert "[test]" not in runtime and "COPY . ." not in docker.split("FROM base AS test", 1)[0]
    # the build commands are in the README
    assert "docker build -t evspark:0.1.0 ." in README
    # any uid runs the image (outputs on a mounted folder owned by the caller), and the
    # Apptainer image keeps the installed package only: no sources, test extra, training state
    assert "USER " not in runtime and "ENV HOME=/tmp" in runtime
    post = apptainer.split("%post", 1)[1].split("%test", 1)[0]
    assert post.rstrip().endswith("rm -rf /opt/evspark") and "pip install /opt/evspark\n" in post
    assert "apptainer build evspark.sif apptainer/evspark.def" in README


def test_apptainer_copies_every_tracked_top_level_entry_the_tests_need():
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True,
                             text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    top = {t.split("/")[0] for t in tracked} - {".gitignore", ".dockerignore", ".ci", "Dockerfile",
                                                 "apptainer", "conda"}
    files = (ROOT / "apptainer" / "evspark.def").read_text().split("\n%files", 1)[1]
    files = files.split("\n%", 1)[0]
    copied = {ln.split()[0] for ln in files.splitlines() if ln.strip()}
    assert top <= copied, top - copied
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git"} <= set(ignored) and "models" not in ignored


# ---------------------------------------------------------------------------------- Nextflow


def test_nextflow_module_meta_describes_its_process():
    yaml = pytest.importorskip("yaml")
    meta = yaml.safe_load((MODULE / "meta.yml").read_text())
    main = (MODULE / "main.nf").read_text()
    emits = re.findall(r"emit:\s*(\w+)", main)
    assert [next(iter(o)) for o in meta["output"]] == emits
    assert meta["name"] == "evspark_generate" and "process EVSPARK_GENERATE" in main
    assert "stub:" in main and (MODULE / "tests" / "main.nf.test").is_file()
    env = yaml.safe_load((MODULE / "environment.yml").read_text())
    assert f"evspark={evspark_cli.__version__}" in env["dependencies"]


def _working_nextflow(tmp_path: Path) -> str:
    """The nextflow command, or skip saying why it cannot run here. The PyPI `nextflow` package
    is a launcher that downloads Nextflow itself on first use: without internet it fails."""
    exe = shutil.which("nextflow", path=_env()["PATH"])
    if exe is None:
        pytest.skip("nextflow is not installed (pip install nextflow installs its launcher)")
    try:
        p = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=120,
                           env=_env(), cwd=tmp_path)  # it leaves nxf-tmp.* files behind
    except subprocess.TimeoutExpired:
        pytest.skip("nextflow -version did not answer in 120 s")
    if p.returncode != 0 or "version" not in p.stdout.lower():
        text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]|\x1b\(B", "", p.stdout + p.stderr)
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        why = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else
                   f"exit {p.returncode}")
        pytest.skip(f"nextflow cannot start here (its launcher downloads Nextflow at first use): "
                    f"{why}")
    return exe


def test_nextflow_stub_run_wires_the_shards(tmp_path):
    exe = _working_nextflow(tmp_path)
    p = subprocess.run([exe, "run", str(NEXTFLOW_DIR / "main.nf"), "-stub-run", "--shards", "3",
                        "--outdir", str(tmp_path / "results")], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    logs = sorted((tmp_path / "results" / "logs").iterdir())
    assert [f.name for f in logs] == ["shard1.log", "shard2.log", "shard3.log"]
    assert (tmp_path / "results" / "generated.fa").exists()


def test_nextflow_run_equals_one_unsharded_run(tmp_path_factory, tmp_path):
    exe = _working_nextflow(tmp_path)
    model = trained_tiny_dir(tmp_path_factory.mktemp("nfmodel"), steps=10)
    src = tmp_path / "in.fa"
    src.write_text(">a\nACGTACGTTAGCATGCAAGT\n>b\nTTGACAGCTAGCTCAGTCCT\n>c\nGGATCCAAGCTTGCATGC\n")
    p = subprocess.run([exe, "run", str(NEXTFLOW_DIR / "main.nf"), "--input", str(src),
                        "--shards", "2", "--n_tokens", "5", "--seed", "4", "--model", str(model),
                        "--outdir", str(tmp_path / "results")], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    whole = subprocess.run([sys.executable, "-m", "evspark_cli.cli", "generate", str(src),
                            "--model", str(model), "-n", "5", "--seed", "4", "-t", "1", "-q"],
                           env=_env(), capture_output=True, text=True, timeout=300).stdout

    def by_id(text: str) -> dict[str, str]:
        return {c.split(None, 1)[0]: c for c in text.split(">") if c}

    got = by_id((tmp_path / "results" / "generated.fa").read_text())
    assert got == by_id(whole) and sorted(got) == ["a.cont", "b.cont", "c.cont"]
    for log in (tmp_path / "results" / "logs").iterdir():
        assert log.read_text().splitlines()[-1].startswith("evspark: generate: ")


def test_nextflow_profiles_select_the_image_they_name():
    """The module's own `container` directive outranks a plain `process.container` in the
    config; only a `withName` selector overrides it, so each profile must use one."""
    config = (ROOT / "examples" / "nextflow" / "nextflow.config").read_text()
    for profile, image in (("docker", "evspark:0.1.0"), ("apptainer", "evspark.sif")):
        body = config.split(f"    {profile} {{", 1)[1].split("\n    }", 1)[0]
        assert f"withName: 'EVSPARK_GENERATE' {{ container = '{image}' }}" in body, profile
        assert "process.container" not in body
    assert "-u $(id -u):$(id -g)" in config
