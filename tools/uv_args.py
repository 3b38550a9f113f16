"""pip's index settings (pip.conf and ``PIP_*`` variables, as ``pip config list`` shows them) as
``uv pip install`` options, printed on one line, so that both install the same versions.

    uv pip install $(python tools/uv_args.py) -e ".[dev,serve]"
"""

from __future__ import annotations

import shlex
import subprocess
import sys

# pip's setting -> uv's option; values holding several entries are split on white space
OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def uv_args(pip_config: str) -> list[str]:
    """``pip config list``'s lines (``global.find-links='/opt/wheels'``) as uv's options, and
    pip's choice among indexes: the best version wherever it is found."""
    args, seen = ["--index-strategy", "unsafe-best-match"], set()
    for line in pip_config.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name == "no-index" and value.strip("'\"").lower() in ("1", "true", "yes", "on"):
            args.append("--no-index")
        for entry in shlex.split(value)[0].split() if name in OPTIONS and value else []:
            if (name, entry) not in seen:
                seen.add((name, entry))
                args += [OPTIONS[name], entry]
    return args


if __name__ == "__main__":
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    print(shlex.join(uv_args(listed)))
