"""First program run inside the bubblewrap sandbox (stdlib only, run with `python -I -S -u -B`).

It applies the resource limits, drops to the unprivileged uid when it was started as root, and then runs the
snippet in this same interpreter as `__main__` (one interpreter start per snippet instead of two). Limits set
here cannot be raised again by the snippet: hard limits are lowered too, and the snippet holds no capabilities.

argv[1] is a JSON object written by `verl_laminar.sandbox.command.bootstrap_spec`.
"""

import json
import os
import resource
import sys
import traceback


def _limit(which: int, value: int) -> None:
    resource.setrlimit(which, (value, value))


def _apply_limits(spec: dict) -> None:
    # CPU: soft limit sends SIGXCPU, hard limit one second later SIGKILLs a snippet that ignores it.
    resource.setrlimit(resource.RLIMIT_CPU, (spec["cpu_time_s"], spec["cpu_time_s"] + 1))
    _limit(resource.RLIMIT_AS, spec["memory_bytes"])
    _limit(resource.RLIMIT_FSIZE, spec["file_bytes"])
    _limit(resource.RLIMIT_NOFILE, spec["max_open_files"])
    _limit(resource.RLIMIT_CORE, 0)
    uid = spec.get("uid")
    if uid is not None:
        # Started as real root (no user namespace): become a plain host uid so RLIMIT_NPROC holds.
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if os.getuid() == 0 or os.geteuid() == 0:
            sys.exit("sandbox bootstrap: failed to drop root")
    _limit(resource.RLIMIT_NPROC, spec["max_processes"])


def _run_snippet(spec: dict) -> None:
    script = spec["script"]
    with open(script, encoding="utf-8") as f:
        source = f.read()
    sys.argv = [script]
    sys.path.extend(spec["python_path"])
    if spec["import_site"]:
        import site

        site.main()
    namespace = {"__name__": "__main__", "__file__": script, "__builtins__": __builtins__}
    try:
        exec(compile(source, script, "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: B036 - the interpreter's own top-level handler, minus this file's frame
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        sys.exit(1)


def main() -> None:
    spec = json.loads(sys.argv[1])
    _apply_limits(spec)
    _run_snippet(spec)


if __name__ == "__main__":
    main()
