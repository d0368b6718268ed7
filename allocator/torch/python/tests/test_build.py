"""The package's build backend (memcast_build.py): a wheel built with the standard
library alone, and pip installing it offline. CPU only."""

import base64
import hashlib
import os
import subprocess
import sys
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
sys.path.insert(0, PKG)
import memcast_build  # noqa: E402


def test_the_wheel_holds_the_package_and_a_record_that_matches_it(tmp_path):
    name = memcast_build.build_wheel(str(tmp_path))
    with zipfile.ZipFile(tmp_path / name) as z:
        names = set(z.namelist())
        record = z.read(f"{memcast_build.DIST_INFO}/RECORD").decode().splitlines()
        files = {n: z.read(n) for n in names}
    py = {f"memcast_torch/{n}" for n in os.listdir(os.path.join(PKG, "memcast_torch"))
          if n.endswith(".py")}
    assert py <= names and "memcast_torch/__init__.py" in names
    assert f"{memcast_build.DIST_INFO}/METADATA" in names
    # Every file but RECORD is listed with its hash and size.
    listed = {}
    for line in record:
        path, digest, size = line.rsplit(",", 2)
        listed[path] = (digest, size)
    assert set(listed) == names
    for path, data in files.items():
        if path.endswith("/RECORD"):
            continue
        d = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert listed[path] == (f"sha256={d}", str(len(data))), path


def test_pip_installs_it_offline_without_setuptools(tmp_path):
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode:
        pytest.skip("no pip")
    target = tmp_path / "site"
    p = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--target", str(target), PKG],
        capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    env = dict(os.environ, PYTHONPATH=str(target))
    q = subprocess.run(
        [sys.executable, "-c", "import memcast_torch, sys; print(memcast_torch.__file__)"],
        capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert q.returncode == 0, q.stderr
    assert q.stdout.strip().startswith(str(target))
