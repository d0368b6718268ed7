"""The package's build backend (memcast_build.py): a wheel built with the standard
library alone, and pip installing it offline. CPU only."""

import base64
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
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


def record_matches(path):
    """The wheel at `path`: its RECORD lists every other file with its hash and size.
    Returns {name: bytes}."""
    with zipfile.ZipFile(path) as z:
        files = {n: z.read(n) for n in z.namelist()}
    record = files[f"{memcast_build.DIST_INFO}/RECORD"].decode().splitlines()
    listed = dict((p, (d, n)) for p, d, n in (line.rsplit(",", 2) for line in record))
    assert set(listed) == set(files)
    for name, data in files.items():
        if name.endswith("/RECORD"):
            continue
        d = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert listed[name] == (f"sha256={d}", str(len(data))), name
    return files


def load_backend(directory):
    """memcast_build as loaded from `directory` (its HERE is that directory)."""
    spec = importlib.util.spec_from_file_location(
        f"memcast_build_{abs(hash(str(directory)))}", os.path.join(directory, "memcast_build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_name_and_version_are_pyprojects():
    text = open(os.path.join(PKG, "pyproject.toml"), encoding="utf-8").read()
    project = text.split("[project]", 1)[1]
    assert re.search(r'^name = "([^"]+)"', project, re.M).group(1) == memcast_build.NAME
    assert re.search(r'^version = "([^"]+)"', project, re.M).group(1) == memcast_build.VERSION


def test_a_library_beside_init_goes_into_the_wheel(tmp_path):
    src = tmp_path / "src with space"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("__pycache__", "tests"))
    (src / "memcast_torch" / "libmemcast_torch.so").write_bytes(b"\x7fELF not really")
    backend = load_backend(src)
    out = tmp_path / "out"
    out.mkdir()
    name = backend.build_wheel(str(out))
    files = record_matches(out / name)
    assert files["memcast_torch/libmemcast_torch.so"] == b"\x7fELF not really"
    # A wheel with a shared library is this platform's, not pure Python.
    assert not name.endswith("-py3-none-any.whl"), name
    wheel = files[f"{backend.DIST_INFO}/WHEEL"].decode()
    assert "Root-Is-Purelib: false" in wheel and "Tag: py3-none-any" not in wheel, wheel


def test_a_wheel_without_a_library_is_pure_python(tmp_path):
    name = memcast_build.build_wheel(str(tmp_path))
    assert name.endswith("-py3-none-any.whl"), name
    files = record_matches(tmp_path / name)
    assert "Root-Is-Purelib: true" in files[f"{memcast_build.DIST_INFO}/WHEEL"].decode()


def test_the_editable_wheel_puts_the_source_directory_on_the_path(tmp_path):
    files = record_matches(tmp_path / memcast_build.build_editable(str(tmp_path)))
    assert files["memcast_torch.pth"].decode() == PKG + "\n"
    assert not any(n.startswith("memcast_torch/") for n in files)


def test_the_sdist_builds_the_same_wheel(tmp_path):
    name = memcast_build.build_sdist(str(tmp_path))
    with tarfile.open(tmp_path / name) as t:
        t.extractall(tmp_path / "x")
    root = tmp_path / "x" / f"memcast_torch-{memcast_build.VERSION}"
    assert (root / "PKG-INFO").read_text().startswith("Metadata-Version:")
    out = tmp_path / "out"
    out.mkdir()
    ours = record_matches(tmp_path / memcast_build.build_wheel(str(tmp_path)))
    theirs = record_matches(out / load_backend(root).build_wheel(str(out)))
    assert ours == theirs
