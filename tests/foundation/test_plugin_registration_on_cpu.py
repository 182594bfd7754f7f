"""The verl.plugins entry point registers our components in every process and fails loudly when it cannot."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

import pytest

from laminar_testing import run_py


def test_entry_point_is_declared_for_verl():
    eps = [ep for ep in entry_points(group="verl.plugins") if ep.name == "laminar"]
    assert len(eps) == 1
    assert eps[0].value == "verl_laminar.plugin"


def test_import_verl_registers_cpu_platform_in_a_fresh_process():
    code = (
        "import verl\n"
        "from verl.plugin.platform import get_platform\n"
        "from verl_laminar.plugin import check_registered\n"
        "print(sorted(check_registered()))\n"
        "p = get_platform(); print(type(p).__name__, p.device_name, p.communication_backend_name())\n"
        "import sys; print('verl.checkpoint_engine' in sys.modules)\n"
        "from verl.checkpoint_engine.base import CheckpointEngineRegistry\n"
        "print(CheckpointEngineRegistry.get('laminar').__name__)\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "print(get_trainer_cls('laminar').__name__)\n"
    )
    out = run_py(code)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-5] == "['checkpoint_engine:laminar', 'config:laminar_split', 'platform:cpu', 'trainer:laminar']"
    assert lines[-4] == "PlatformCPU cpu gloo"
    assert lines[-3] == "False"  # deferred: plain `import verl` does not pull in the checkpoint engines
    assert lines[-2] == "RelayCheckpointEngine"
    assert lines[-1] == "LaminarTrainer"


def test_cpu_platform_switch_off_keeps_verl_untouched():
    code = (
        "import verl\n"
        "from verl_laminar.plugin import registered\n"
        "from verl_laminar.patches import applied_patches\n"
        "print(registered()['platform:cpu'].split()[0], applied_patches())\n"
    )
    out = run_py(code, env={"LAMINAR_CPU_PLATFORM": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    # the one patch left acts only on +laminar=enabled configs (patches.laminar_split), on every platform
    assert out.stdout.strip().splitlines()[-1] == "registered ['laminar_split_before_validate']"


def test_registration_is_idempotent():
    from verl_laminar import plugin
    from verl_laminar.patches import apply_patch
    from verl_laminar.patches.cpu_config import CPU_CONFIG_DEFAULTS

    first = plugin.register()
    second = plugin.register()
    assert first == second
    assert apply_patch(CPU_CONFIG_DEFAULTS) is False  # already applied once in this process


def test_failing_component_raises_and_logs_error(monkeypatch, caplog):
    from verl_laminar import plugin

    def broken() -> str:
        raise ImportError("no module named 'imaginary_backend'")

    monkeypatch.setattr(plugin, "_COMPONENTS", plugin._COMPONENTS + [("relay:imaginary", broken)])
    with caplog.at_level(logging.ERROR, logger="verl_laminar.plugin"):
        with pytest.raises(plugin.PluginRegistrationError, match="relay:imaginary"):
            plugin.register()
    assert any("imaginary_backend" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


def test_check_registered_names_what_is_missing():
    from verl_laminar import plugin

    plugin.register()
    with pytest.raises(plugin.PluginRegistrationError, match="trainer:laminar-not-yet"):
        plugin.check_registered(required=("platform:cpu", "trainer:laminar-not-yet"))
    assert "platform:cpu" in plugin.check_registered(required=("platform:cpu",))


def test_plugin_check_cli_reports_components():
    out = run_py("import runpy; runpy.run_module('verl_laminar.plugin', run_name='__main__')")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "platform:cpu" in out.stderr and "active" in out.stderr


def test_importing_the_cpu_platform_before_verl_still_registers_it():
    """``from verl_laminar.platform.cpu import ...`` as a process's first import: verl loads the plugin while that
    module is half-built; the platform is deferred, then registered when the module completes, with no ERROR."""
    out = run_py("import verl_laminar.platform.cpu as c\n"
                 "from verl_laminar.plugin import check_registered\n"
                 "print(check_registered()['platform:cpu'].split(':')[0], c.this_process_decision().source)\n")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "registering platform:cpu failed" not in out.stderr
    assert out.stdout.strip().splitlines()[-1] == "active host"


def test_a_failing_relay_registration_does_not_break_verls_checkpoint_engines():
    code = (
        "import importlib.abc, sys\n"
        "class Broken(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'verl_laminar.relay.verl_backend':\n"
        "            raise ImportError('simulated breakage in the relay backend')\n"
        "sys.meta_path.insert(0, Broken())\n"
        "import verl, verl.checkpoint_engine\n"
        "from verl.checkpoint_engine.base import CheckpointEngineRegistry\n"
        "try:\n"
        "    CheckpointEngineRegistry.get('laminar')\n"
        "except ValueError:\n"
        "    print('laminar engine unavailable')\n"
    )
    out = run_py(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "laminar engine unavailable"
    assert "simulated breakage in the relay backend" in out.stderr  # logged at ERROR, with the traceback
