"""Help that teaches: option panels, a worked example per command, defaults, `-t`, --version."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny import run_cli  # noqa: E402

import evspark_cli  # noqa: E402

COMMANDS = ["generate", "verify", "score", "convert", "info", "train", "distill", "bench"]


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    """Help as a 120-column terminal shows it (rich cuts long words on narrow ones)."""
    monkeypatch.setenv("COLUMNS", "120")


def help_text(*args: str) -> str:
    r = run_cli([*args, "--help"])
    assert r.code == 0, r.err
    return r.out


def test_version():
    for flag in ("--version", "-V"):
        r = run_cli([flag])
        assert (r.code, r.out) == (0, f"evspark {evspark_cli.__version__}\n")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_ends_its_help_with_a_worked_example(command):
    text = help_text(command)
    assert "Example:" in text and f"evspark {command}" in text.split("Example:", 1)[1]


def test_generate_groups_its_options_into_panels_with_defaults():
    text = help_text("generate")
    order = [text.index(f"─ {panel} ") for panel in ("Input", "Model and device", "Sampling",
                                                      "Speculation", "Output", "Performance")]
    assert order == sorted(order)
    panel = {name: text.split(f"─ {name} ", 1)[1].split("╰", 1)[0]
             for name in ("Input", "Sampling", "Performance")}
    assert "--regions" in panel["Input"] and "--strict" in panel["Input"]
    assert "--seed" in panel["Sampling"] and "[default: 1024]" in panel["Sampling"]
    assert "--threads" in panel["Performance"] and " -t " in panel["Performance"]
    assert "SLURM_CPUS_PER_TASK" in panel["Performance"]


@pytest.mark.parametrize("command", ["verify", "score", "distill", "bench"])
def test_threads_short_form(command):
    assert " -t " in help_text(command)


def test_bare_evspark_shows_the_help_and_exits_0():
    import subprocess

    r = subprocess.run([sys.executable, "-m", "evspark_cli.cli"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "Usage:" in r.stdout and "generate" in r.stdout, r.stderr
    assert "error" not in r.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_flags_are_rendered_as_flags(command):
    """A flag takes no value, so its help shows none (newer Typers would write `<bool>`); only
    Typer's own --help line is left as Typer renders it."""
    lines = [ln for ln in help_text(command).splitlines() if "<bool>" in ln]
    assert all("--help" in ln for ln in lines), lines
