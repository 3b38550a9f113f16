"""tools/uv_args.py: pip's index settings become uv's options, so both install the same versions."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("uv_args", REPO / "tools" / "uv_args.py")
assert spec is not None and spec.loader is not None
uv_args_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uv_args_module)
uv_args = uv_args_module.uv_args


def test_pip_settings_become_uv_options_once_each_with_pips_choice_among_indexes():
    listed = "\n".join([
        "global.constraint='/etc/pip/constraints.txt'",
        "global.cert='/etc/ssl/certs/ca.crt'",
        "global.find-links='/opt/wheels'",
        "global.extra-index-url='file:///a/simple file:///b/simple'",
        ":env:.default-timeout='180'",
        ":env:.find-links='/opt/wheels'",
        "install.index-url='https://mirror/simple'",
    ])  # fmt: skip
    assert uv_args(listed) == [
        "--index-strategy", "unsafe-best-match",
        "--constraint", "/etc/pip/constraints.txt",
        "--find-links", "/opt/wheels",
        "--extra-index-url", "file:///a/simple", "--extra-index-url", "file:///b/simple",
        "--index-url", "https://mirror/simple",
    ]  # fmt: skip


def test_no_settings_leave_uv_on_its_defaults_and_no_index_carries_over():
    assert uv_args("") == ["--index-strategy", "unsafe-best-match"]
    assert uv_args("global.no-index='true'")[-1] == "--no-index"
