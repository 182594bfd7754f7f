"""An untested verl version: verl's own trainers keep working (with a WARNING); what needs our patches (the
Laminar trainer, the relay engine, the CPU platform) fails when it is used, naming both versions and the fix.

The subprocesses load the plugin by hand after faking ``verl.__version__`` (``VERL_USE_EXTERNAL_PLUGINS=none``
stops verl from loading it first), which is exactly what verl's entry-point loader does: import the module."""

from __future__ import annotations

import pytest

from laminar_testing import run_py

FAKE = "0.9.2"
_LOAD_ON_FAKE_VERL = f"""
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="LOG %(levelname)s %(name)s %(message)s")
import verl
verl.__version__ = {FAKE!r}
import verl_laminar.plugin
"""


def _run(code: str, **env: str):
    out = run_py(code, env={"VERL_USE_EXTERNAL_PLUGINS": "none", **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _line(stdout: str, tag: str) -> str:
    found = [line for line in stdout.splitlines() if line.startswith(tag + " ")]
    assert found, stdout[-3000:]
    return found[-1][len(tag) + 1:]


def test_message_names_both_versions_and_the_fix():
    from verl_laminar.patches import VERIFIED_VERL_VERSIONS, unverified_verl_message, verl_verified

    assert verl_verified() and verl_verified("0.9.1") and not verl_verified(FAKE)
    msg = unverified_verl_message("The Laminar trainer", FAKE)
    assert f"verl {FAKE} is installed" in msg and " or ".join(VERIFIED_VERL_VERSIONS) in msg
    assert "pip install 'verl==0.9.1'" in msg and "VERIFIED_VERL_VERSIONS" in msg


def test_untested_verl_keeps_verls_trainers_and_refuses_laminar():
    # LAMINAR_CPU_PLATFORM=0: a process on the CPU platform-free path, as on a GPU host
    out = _run(_LOAD_ON_FAKE_VERL + """
import verl.trainer.ppo.v1 as v1
print("SYNC", v1.get_trainer_cls("sync").__name__, v1.get_trainer_cls("separate_async").__name__)
print("LOADED", "verl_laminar.trainer.laminar_trainer" in sys.modules)
from verl_laminar.patches import applied_patches
print("PATCHES", applied_patches())
try:
    v1.get_trainer_cls("laminar")(config=None)
except Exception as e:
    print("ERR", type(e).__name__, str(e))
import verl.checkpoint_engine
from verl.checkpoint_engine.base import CheckpointEngineRegistry
try:
    CheckpointEngineRegistry.get("laminar")
except ValueError:
    print("RELAY not registered")
""", LAMINAR_CPU_PLATFORM="0")
    assert _line(out, "SYNC") == "PPOTrainerSync PPOTrainerSeparateAsync"
    assert _line(out, "LOADED") == "False"  # our trainer module (and its patches) never ran
    assert _line(out, "PATCHES") == "[]"
    err = _line(out, "ERR")
    assert err.startswith("PatchVersionError The Laminar trainer (trainer.v1.trainer_mode=laminar) needs verl 0.9.1")
    assert f"verl {FAKE} is installed" in err and "pip install 'verl==0.9.1'" in err
    assert _line(out, "RELAY") == "not registered"
    warnings = [line for line in out.splitlines() if line.startswith("LOG WARNING") and FAKE in line]
    assert len(warnings) == 1 and "verified on verl 0.9.1" in warnings[0], out[-3000:]


def test_untested_verl_cpu_platform_fails_at_first_use_not_at_import():
    out = _run(_LOAD_ON_FAKE_VERL + """
from verl_laminar.plugin import check_registered
from verl_laminar.patches import applied_patches
print("PLUGIN", check_registered()["platform:cpu"].split(" (")[0], applied_patches())
from verl.plugin.platform import get_platform
try:
    get_platform().device_name
except Exception as e:
    print("ERR", type(e).__name__, str(e))
""")
    assert _line(out, "PLUGIN") == "refused []"
    err = _line(out, "ERR")
    assert err.startswith("PatchVersionError The CPU platform (its patches) needs verl 0.9.1")
    assert f"verl {FAKE} is installed" in err


def test_a_laminar_trainer_that_fails_to_import_leaves_verls_trainers_working():
    out = _run("""
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="LOG %(levelname)s %(name)s %(message)s")
import verl, verl_laminar.plugin, verl_laminar.trainer as t
t.TRAINER_MODULE = "verl_laminar.trainer.no_such_module"
import verl.trainer.ppo.v1 as v1
print("SYNC", v1.get_trainer_cls("sync").__name__)
try:
    v1.get_trainer_cls("laminar")(config=None)
except Exception as e:
    print("ERR", type(e).__name__, str(e), type(e.__cause__).__name__)
""", LAMINAR_CPU_PLATFORM="0")
    assert _line(out, "SYNC") == "PPOTrainerSync"
    err = _line(out, "ERR")
    assert err.startswith("TrainerUnavailableError trainer 'laminar' is unavailable: importing "
                          "verl_laminar.trainer.no_such_module failed with ModuleNotFoundError")
    assert err.endswith("ModuleNotFoundError")
    assert any(line.startswith("LOG ERROR") and "no_such_module" in line for line in out.splitlines())


@pytest.mark.parametrize("installed,verified,expected", [("0.9.1", ("0.9.1",), True), ("0.9.1.post1", ("0.9.1",),
                                                         False), ("0.10.0", ("0.9.1", "0.10.0"), True)])
def test_version_match_is_exact(installed, verified, expected):
    from verl_laminar.patches import verl_verified

    assert verl_verified(installed, verified) is expected
