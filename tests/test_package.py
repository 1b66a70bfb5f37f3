"""The package as users install it: a wheel that carries the configs and the prompts, whose commands compose
their configuration from any directory."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the tracked files: the build leaves nothing in the checkout."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(source)], check=True, capture_output=True, timeout=300)
    [built] = out.glob("specdraft-*.whl")
    return built


def test_the_wheel_carries_every_config_and_the_shipped_prompts_and_no_build_script(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {str(path.relative_to(ROOT)) for path in (ROOT / "conf").rglob("*.yaml")}
    assert configs and configs <= names, sorted(configs - names)
    prompts = {str(path.relative_to(ROOT)) for path in (ROOT / "distill" / "prompts").glob("*.jsonl")}
    assert len(prompts) == 5 and prompts <= names
    assert not any(name.startswith(("scripts/", "tests/")) for name in names)
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    assert "specdraft-train = train.__main__:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_installed_commands_compose_their_configs_from_any_directory(wheel, tmp_path):
    """Installed (not editable) beside nothing of the clone: the train command runs a tiny job and the monitor
    prints its help, started from a directory that is not the clone."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site), "WANDB_MODE": "disabled",
           "SPECDRAFT_CACHE": str(tmp_path / "cache")}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def command(*args):
        return subprocess.run([sys.executable, *args], cwd=elsewhere, env=env, capture_output=True, text=True,
                              timeout=600)

    where = command("-c", "import train, conf; print(train.__file__); print(conf.__file__)")
    assert where.returncode == 0 and all(line.startswith(str(site)) for line in where.stdout.split()), where
    monitor = command("-m", "eval.monitor", "--help")
    assert monitor.returncode == 0, monitor.stderr
    assert "python -m eval.monitor" in monitor.stdout and "request_logs" in monitor.stdout
    run = command("-m", "train", "+domain=code", "+debug=tiny", "stages=[generate,train]", f"run_dir={tmp_path}/run",
                  f"hydra.run.dir={tmp_path}/hydra")
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "run" / "draft" / "config.json").is_file()
