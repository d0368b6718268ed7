"""The build backend of memcast-torch (PEP 517 and PEP 660), in pure Python.

The package is pure Python over a shared library, so building it is zipping its files:
this backend does that with the standard library alone. `pip install
allocator/torch/python` then needs no setuptools, no wheel and no network (the build
requires nothing, so pip's isolated build environment is empty). A
`libmemcast_torch.so` copied beside `memcast_torch/__init__.py` goes into the wheel.
"""

import base64
import hashlib
import io
import os
import sysconfig
import tarfile
import zipfile

NAME = "memcast-torch"
PACKAGE = "memcast_torch"
VERSION = "0.1.0"
HERE = os.path.dirname(os.path.abspath(__file__))
DIST_INFO = f"{PACKAGE}-{VERSION}.dist-info"
# Pure Python: any platform. A wheel that carries a `libmemcast_torch.so` is tagged
# with the building machine's platform instead (`_tag`).
TAG = "py3-none-any"

METADATA = f"""Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: memcast as PyTorch's CUDA allocator (CUDAPluggableAllocator / MemPool)
Requires-Python: >=3.9
"""



def _tag(files):
    """The wheel's tag and whether it is pure Python: a shared library in `files` makes
    it this platform's (`py3-none-linux_x86_64`, ...), not `py3-none-any`."""
    if any(path.endswith(".so") for path, _ in files):
        plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        return f"py3-none-{plat}", False
    return TAG, True


def _wheel_text(files):
    tag, pure = _tag(files)
    return f"""Wheel-Version: 1.0
Generator: memcast_build
Root-Is-Purelib: {"true" if pure else "false"}
Tag: {tag}
"""


def _package_files():
    """(path in the wheel, bytes) of the package: its .py files and a .so beside them."""
    src = os.path.join(HERE, PACKAGE)
    out = []
    for name in sorted(os.listdir(src)):
        if name.endswith(".py") or name.endswith(".so"):
            with open(os.path.join(src, name), "rb") as f:
                out.append((f"{PACKAGE}/{name}", f.read()))
    return out


def _write_dist_info(directory):
    d = os.path.join(directory, DIST_INFO)
    os.makedirs(d, exist_ok=True)
    for name, text in (("METADATA", METADATA), ("WHEEL", _wheel_text(_package_files()))):
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(text)
    return DIST_INFO


def _wheel(directory, files):
    """Writes a wheel of `files` ((path, bytes) pairs) plus its dist-info; returns its
    file name."""
    tag, _ = _tag(files)
    files = list(files) + [
        (f"{DIST_INFO}/METADATA", METADATA.encode()),
        (f"{DIST_INFO}/WHEEL", _wheel_text(files).encode()),
    ]
    record = []
    for path, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{DIST_INFO}/RECORD,,")
    name = f"{PACKAGE}-{VERSION}-{tag}.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            z.writestr(path, data)
        z.writestr(f"{DIST_INFO}/RECORD", "\n".join(record) + "\n")
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_dist_info(metadata_directory)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _write_dist_info(metadata_directory)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, _package_files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file that puts this directory on sys.path: edits take effect at once.
    return _wheel(wheel_directory, [(f"{PACKAGE}.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    base = f"{PACKAGE}-{VERSION}"
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        members = ["pyproject.toml", "memcast_build.py"] + [p for p, _ in _package_files()]
        for rel in members:
            t.add(os.path.join(HERE, rel), arcname=f"{base}/{rel}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = METADATA.encode()
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return name
