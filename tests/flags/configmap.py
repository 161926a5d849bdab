"""Write a directory the way the kubelet updates a mounted ConfigMap.

Each version goes into a new hidden `..<timestamp>` directory, the `..data`
symlink is swapped to it atomically (rename of a temporary symlink), and each
visible file is a symlink `name -> ..data/name` created once. The old version
directory is then removed. A watcher of `flags.json` therefore sees the file
behind the same path change all at once, never half-written.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any


def write_configmap(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    version = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.time_ns()}"
    version.mkdir()
    for name, text in files.items():
        (version / name).write_text(text, encoding="utf-8")
    data = directory / "..data"
    old = data.resolve() if data.is_symlink() else None
    tmp = directory / "..data_tmp"
    os.symlink(version.name, tmp)
    os.replace(tmp, data)
    for name in files:
        link = directory / name
        if not link.is_symlink():
            os.symlink(f"..data/{name}", link)
    if old is not None and old != version.resolve():
        shutil.rmtree(old)


def flagd_document(flags: dict[str, Any]) -> str:
    return json.dumps({"$schema": "https://flagd.dev/schema/v0/flags.json", "flags": flags})


def static_flag(value: Any) -> dict[str, Any]:
    return {"state": "ENABLED", "variants": {"v": value}, "defaultVariant": "v"}
