"""Pure parts of the sandbox: config validation, the bwrap command line, result classification, refusal."""

import json
import shutil

import pytest

from verl_laminar.sandbox import INSTALL_HINT, LocalSandbox, SandboxConfig, SandboxConfigError, SandboxUnavailable
from verl_laminar.sandbox.command import HostLayout, build_command
from verl_laminar.sandbox.result import SandboxResult, SandboxStatus, classify

LAYOUT = HostLayout(symlinks=(("/bin", "usr/bin"), ("/lib", "usr/lib")), directories=("/lib64",))


def _argv(uid, **config):
    return build_command(
        bwrap="/usr/bin/bwrap",
        config=SandboxConfig(**config),
        layout=LAYOUT,
        python="/opt/py/3.11/bin/python3.11",
        prefix="/opt/py/3.11",
        bootstrap_file="/pkg/_bootstrap.py",
        snippet_file="/tmp/x/main.py",
        run_as_uid=uid,
    )


def _pairs(argv, flag):
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("timeout_s", 0, "timeout_s=0"),
        ("memory_mb", 16, "memory_mb=16"),
        ("max_processes", 1, "max_processes=1"),
        ("max_concurrency", -1, "max_concurrency=-1"),
        ("python", "python3", "absolute path"),
        ("extra_ro_paths", ("relative/dir",), "extra_ro_paths"),
        ("uid_base", 0, "uid_base=0"),
    ],
)
def test_config_errors_name_the_value(field, value, fragment):
    with pytest.raises(SandboxConfigError, match=fragment.replace("(", r"\(")):
        SandboxConfig(**{field: value})


def test_config_rejects_unknown_keys():
    with pytest.raises(SandboxConfigError, match="timeout"):
        SandboxConfig.from_mapping({"timeout": 3})


def test_root_caller_keeps_only_setuid_caps_and_no_user_namespace():
    argv = _argv(61003)
    assert "--unshare-user" not in argv
    assert _pairs(argv, "--cap-drop") == ["ALL"]
    assert sorted(_pairs(argv, "--cap-add")) == ["CAP_SETGID", "CAP_SETUID"]
    spec = json.loads(argv[-1])
    assert spec["uid"] == 61003


def test_non_root_caller_gets_user_namespace_without_nesting():
    argv = _argv(None)
    assert "--unshare-user" in argv and "--disable-userns" in argv
    assert "--cap-add" not in argv
    assert json.loads(argv[-1])["uid"] is None


def test_namespaces_mounts_and_limits():
    argv = _argv(61000, tmpfs_mb=32, memory_mb=300, max_processes=9, cpu_time_s=4)
    for flag in ("--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in argv
    # only /usr, merged-/usr symlinks, real system dirs, the interpreter prefix and the two sandbox files are bound
    assert _pairs(argv, "--ro-bind") == ["/usr", "/lib64", "/opt/py/3.11", "/pkg/_bootstrap.py", "/tmp/x/main.py"]
    assert _pairs(argv, "--bind") == []
    assert _pairs(argv, "--symlink") == ["usr/bin", "usr/lib"]
    # the writable tmpfs is size-capped and world-writable (sticky) for the unprivileged uid
    tmpfs = argv.index("--tmpfs")
    assert argv[tmpfs - 4 : tmpfs + 2] == ["--perms", "1777", "--size", str(32 << 20), "--tmpfs", "/tmp"]
    # parents of the interpreter prefix are created traversable (bwrap would make them 0700 as root)
    assert argv[argv.index("/opt") - 3 : argv.index("/opt") + 1] == ["--perms", "0755", "--dir", "/opt"]
    spec = json.loads(argv[-1])
    assert spec["memory_bytes"] == 300 << 20 and spec["max_processes"] == 9 and spec["cpu_time_s"] == 4
    assert argv[argv.index("/opt/py/3.11/bin/python3.11") + 1 : argv.index("/opt/py/3.11/bin/python3.11") + 5] == [
        "-I",
        "-S",
        "-u",
        "-B",
    ]


@pytest.mark.parametrize(
    "exit_code, timed_out, output_over, expected",
    [
        (0, False, False, SandboxStatus.OK),
        (1, False, False, SandboxStatus.ERROR),
        (137, False, False, SandboxStatus.KILLED),
        (-9, False, False, SandboxStatus.KILLED),
        (0, True, False, SandboxStatus.TIMEOUT),
        (-9, True, True, SandboxStatus.TIMEOUT),
        (-9, False, True, SandboxStatus.OUTPUT_LIMIT),
    ],
)
def test_classify(exit_code, timed_out, output_over, expected):
    assert classify(exit_code, timed_out=timed_out, output_over=output_over) is expected


def test_describe_names_the_signal():
    result = SandboxResult(SandboxStatus.KILLED, 128 + 24, "", "", 1.0)
    assert "SIGXCPU" in result.describe()


def test_refuses_without_bubblewrap(tmp_path):
    with pytest.raises(SandboxUnavailable) as info:
        LocalSandbox(SandboxConfig(), bwrap=str(tmp_path / "no-bwrap"))
    assert "apt-get install -y bubblewrap" in str(info.value)
    assert "apt-get install -y bubblewrap" in INSTALL_HINT


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed: apt-get install -y bubblewrap")
def test_python_path_is_importable_and_site_is_off_by_default(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "helper_mod.py").write_text("VALUE = 41 + 1\n")
    box = LocalSandbox(SandboxConfig(python_path=(str(lib),)))
    try:
        result = box.run("import sys, helper_mod\nprint(helper_mod.VALUE, 'site' in sys.modules)")
        assert result.ok, result.stderr
        assert result.stdout.split() == ["42", "False"]
        # a traceback points at the snippet, not at the sandbox's own bootstrap
        failed = box.run("x = 1\nraise ValueError('boom')\n")
        assert failed.status is SandboxStatus.ERROR and failed.exit_code == 1
        assert 'File "/sandbox/main.py", line 2' in failed.stderr and "bootstrap" not in failed.stderr
        assert box.run("import sys\nsys.exit(3)").exit_code == 3
    finally:
        box.close()
