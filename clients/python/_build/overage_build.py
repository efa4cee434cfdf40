"""A PEP 517 build backend with no dependencies, for this package only.

setuptools is a build dependency pip would have to download; this backend
needs nothing but the standard library, so ``pip install ./clients/python``
works offline, with or without build isolation. It builds a pure-Python
wheel (py3-none-any) of ``src/overage``, an editable wheel (PEP 660) and an
sdist, reading the name, version, summary and Python requirement from
pyproject.toml.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = "overage"


def _project():
    with open(os.path.join(_ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("[project]", 1)[1].split("\n[", 1)[0]

    def field(name):
        m = re.search(r'^%s\s*=\s*"([^"]*)"' % re.escape(name), section, re.M)
        if not m:
            raise RuntimeError("pyproject.toml: [project] has no %s" % name)
        return m.group(1)

    return {
        "name": field("name"),
        "version": field("version"),
        "summary": field("description"),
        "requires_python": field("requires-python"),
    }


def _metadata(p):
    with open(os.path.join(_ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return (
        "Metadata-Version: 2.1\n"
        "Name: {name}\n"
        "Version: {version}\n"
        "Summary: {summary}\n"
        "Requires-Python: {requires_python}\n"
        "License: Apache-2.0\n"
        "Classifier: Programming Language :: Python :: 3\n"
        "Classifier: Typing :: Typed\n"
        "Description-Content-Type: text/markdown\n"
        "\n{readme}"
    ).format(readme=readme, **p)


def _dist_info(p):
    return "%s-%s.dist-info" % (p["name"], p["version"])


def _wheel_name(p):
    return "%s-%s-py3-none-any.whl" % (p["name"], p["version"])


_WHEEL = "Wheel-Version: 1.0\nGenerator: overage_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _write_wheel(directory, files):
    """files: (archive name, bytes) pairs, dist-info last but RECORD."""
    p = _project()
    info = _dist_info(p)
    files = list(files) + [
        (info + "/METADATA", _metadata(p).encode("utf-8")),
        (info + "/WHEEL", _WHEEL.encode("ascii")),
        (info + "/top_level.txt", (_PACKAGE + "\n").encode("ascii")),
    ]
    record = []
    path = os.path.join(directory, _wheel_name(p))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
            record.append("%s,sha256=%s,%d" % (name, digest, len(data)))
        record.append(info + "/RECORD,,")
        z.writestr(zipfile.ZipInfo(info + "/RECORD", date_time=(2020, 1, 1, 0, 0, 0)), ("\n".join(record) + "\n").encode("utf-8"))
    return os.path.basename(path)


def _package_files():
    src = os.path.join(_ROOT, "src", _PACKAGE)
    for name in sorted(os.listdir(src)):
        full = os.path.join(src, name)
        if os.path.isfile(full) and (name.endswith(".py") or name == "py.typed"):
            with open(full, "rb") as f:
                yield _PACKAGE + "/" + name, f.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    p = _project()
    info = os.path.join(metadata_directory, _dist_info(p))
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata(p))
    with open(os.path.join(info, "WHEEL"), "w", encoding="ascii") as f:
        f.write(_WHEEL)
    return _dist_info(p)


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    pth = (os.path.join(_ROOT, "src") + "\n").encode("utf-8")
    return _write_wheel(wheel_directory, [("_overage_editable.pth", pth)])


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    base = "%s-%s" % (p["name"], p["version"])
    path = os.path.join(sdist_directory, base + ".tar.gz")
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in ("pyproject.toml", "README.md", os.path.join("_build", "overage_build.py")):
            tar.add(os.path.join(_ROOT, rel), arcname=base + "/" + rel)
        for name, data in _package_files():
            ti = tarfile.TarInfo(base + "/src/" + name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
        meta = _metadata(p).encode("utf-8")
        ti = tarfile.TarInfo(base + "/PKG-INFO")
        ti.size = len(meta)
        tar.addfile(ti, io.BytesIO(meta))
    return os.path.basename(path)
