"""`make`'s first set-up says that llama.cpp compiles, about how long it takes and how far it got,
instead of minutes of silence (issue 33, item 1): scripts/pip_progress.py, run on a pip that prints
what a verbose pip prints while it builds the wheel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO

SCRIPT = REPO / "scripts" / "pip_progress.py"
BUILD_STEPS = 20


def fake_pip(tmp_path: Path, status: int) -> list[str]:
    """A command printing a verbose pip's lines around a ninja build of BUILD_STEPS steps."""
    lines = ["Collecting annotated-types==0.7.0", "  Running command Building wheel for llama-cpp-python",
             "Building wheel for llama-cpp-python (pyproject.toml): started",
             *[f"  [{n}/{BUILD_STEPS}] Building C object vendor/llama.cpp/ggml/src/part{n}.c.o"
               for n in range(1, BUILD_STEPS + 1)],
             "Building wheel for llama-cpp-python (pyproject.toml): finished with status 'done'",
             "Created wheel for llama-cpp-python: filename=llama_cpp_python-0.3.36-cp311-linux_x86_64.whl",
             "Successfully installed annotated-types-0.7.0 llama-cpp-python-0.3.36"]
    if status:
        lines.append("ERROR: could not install")
    script = tmp_path / "pip.py"
    script.write_text(f"import sys\nprint('\\n'.join({lines!r}))\nsys.exit({status})\n")
    return [sys.executable, str(script)]


def test_the_compile_is_announced_with_its_length_and_said_at_each_tenth(tmp_path: Path) -> None:
    """Issue 33, item 1: before the install, what compiles and about how long; then one line per
    tenth of the build, and its end; pip's own lines stay in the log."""
    log = tmp_path / "install.log"

    done = subprocess.run([sys.executable, str(SCRIPT), str(log), "--", *fake_pip(tmp_path, 0)],
                          capture_output=True, text=True, timeout=60, check=False)

    assert done.returncode == 0, done.stderr
    said = done.stdout.splitlines()
    assert said[0].startswith("Installing the dependencies into .venv. The first time, pip compiles llama.cpp")
    assert "10 to 20 minutes on two cores" in said[0]
    assert str(log) in said[0]
    assert said[1].startswith("Compiling llama.cpp for the embedded model (10 to 20 minutes")
    assert said[2:-1] == [f"  llama.cpp: {tenth * 10}% compiled (under a minute)" for tenth in range(1, 11)]
    assert said[-1] == "llama.cpp compiled in under a minute."
    assert "Collecting annotated-types==0.7.0" in log.read_text()


def test_a_failed_install_shows_the_end_of_its_log_and_where_the_rest_is(tmp_path: Path) -> None:
    """Issue 33, item 1: pip's output is hidden only while it succeeds."""
    log = tmp_path / "install.log"

    done = subprocess.run([sys.executable, str(SCRIPT), str(log), "--", *fake_pip(tmp_path, 3)],
                          capture_output=True, text=True, timeout=60, check=False)

    assert done.returncode == 3
    said = done.stdout.splitlines()
    assert said[-2] == "ERROR: could not install"
    assert said[-1] == f"The install failed (exit status 3); its full output is in {log}."


def test_make_runs_the_lock_install_through_it() -> None:
    """Issue 33, item 1: the set-up's dependency install goes through the script, verbose."""
    planned = subprocess.run(["make", "-n", "--always-make", ".venv/.installed"], cwd=REPO,
                             capture_output=True, text=True, timeout=60, check=True).stdout

    install = next(line for line in planned.splitlines() if "requirements.lock" in line and "model" not in line)
    assert install.split(" -- ")[0].endswith("scripts/pip_progress.py .venv/install.log")
    assert "--verbose" in install.split(" -- ")[1]
