"""Every number the README quotes has its file: each result JSON in docs/results/ records where it came from
(``bench.provenance``), every ``docs/results/...json`` the README names exists, and docs/results/README.md lists
every result file. Also ``provenance.py`` itself."""

from __future__ import annotations

import datetime
import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from verl_laminar.bench import provenance

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"

# Result files allowed to lack provenance: none (the end-to-end benchmark and the demo were rerun with it). A file
# without provenance goes to docs/results/unprovenanced/, and the README quotes no number from it.
EXEMPT_UNTIL_RERUN: tuple[str, ...] = ()

CITED = re.compile(r"docs/results/[\w./-]+?\.json")


def _results() -> list[Path]:
    return sorted(RESULTS.glob("*.json"))


def _exempt(path: Path) -> bool:
    return any(fnmatch.fnmatch(path.name, pattern) for pattern in EXEMPT_UNTIL_RERUN)


def test_every_result_file_records_date_machine_command_commit_and_load():
    lacking = {}
    for path in _results():
        record = json.loads(path.read_text())
        assert isinstance(record, dict), f"{path.name}: a result file is one JSON object"
        if _exempt(path):
            continue
        if provenance.missing(record):
            lacking[path.name] = provenance.missing(record)
            continue
        assert set(record["machine"]) >= {"cpu_model", "cpus", "mem_gib"}, path.name
        assert record["date"][:10] in path.name, f"{path.name}: the name carries the run's date {record['date'][:10]}"
    assert not lacking, f"result files without provenance (rerun them, or move them to unprovenanced/): {lacking}"


def test_the_readme_cites_only_result_files_that_exist():
    cited = sorted(set(CITED.findall((REPO / "README.md").read_text())))
    assert cited, "the README cites its result files as docs/results/<name>_<date>.json"
    absent = [c for c in cited if not (REPO / c).is_file()]
    assert not absent, f"the README cites result files that are not in the repository: {absent}"


def test_the_results_index_lists_every_result_file():
    index = (RESULTS / "README.md").read_text()
    files = sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*.json"))
    assert files
    assert not [f for f in files if f not in index], "docs/results/README.md has a row for every result file"
    named = sorted(set(re.findall(r"[\w/-]*_\d{4}-\d{2}-\d{2}[\w-]*\.json", index)))
    assert not [n for n in named if not (RESULTS / n).is_file()], "every file the index names exists"


# provenance.py


def test_provenance_has_every_key_and_missing_names_the_absent_ones():
    record = provenance.provenance(["--json"], "verl_laminar.sim")
    assert tuple(record) == provenance.KEYS and provenance.missing(record) == []
    assert provenance.missing({}) == list(provenance.KEYS)
    assert provenance.missing({**record, "load_avg_at_start": None, "commit": ""}) == ["commit", "load_avg_at_start"]
    date = datetime.datetime.fromisoformat(record["date"])
    assert date.tzinfo is not None  # UTC, so two machines' dates compare
    assert len(record["load_avg_at_start"]) == 3 and all(x >= 0 for x in record["load_avg_at_start"])
    json.dumps(record)  # it goes into a JSON file as is


def test_machine_names_the_cpu_cores_and_memory():
    m = provenance.machine()
    assert set(m) == {"cpu_model", "cpus", "cpu_flags", "mem_gib", "python"}
    assert m["cpus"] >= 1 and m["mem_gib"] > 0 and isinstance(m["cpu_flags"], list)
    assert m["python"] == ".".join(map(str, sys.version_info[:3]))


def test_command_line_is_what_a_user_would_type():
    assert provenance.command_line(["--paper", "--out", "runs/a b"], "verl_laminar.sim") == \
        "python -m verl_laminar.sim --paper --out 'runs/a b'"
    assert provenance.command_line([], "verl_laminar.chaos") == "python -m verl_laminar.chaos"
    assert provenance.command_line(["--json"]) == f"{Path(sys.argv[0]).name} --json"
    # no path of the machine it ran on: run folders become <path>, repository paths relative
    assert provenance.command_line(["--out", "/tmp/x4/out", f"--results={REPO}/docs/results"], "m") == \
        "python -m m --out '<path>' --results=docs/results"


# an absolute path of a machine's file system (a result file records none: commands, logs, run folders)
MACHINE_PATH = re.compile(r"(?<![\w.<])/(?:tmp|work|root|home|Users|private|var|mnt|scratch)/")


def test_no_result_file_names_a_path_of_the_machine_it_ran_on():
    found = {p.name: MACHINE_PATH.findall(p.read_text()) for p in _results()}
    assert not {k: v for k, v in found.items() if v}, found


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def test_commit_is_head_and_says_dirty_when_tracked_files_changed(tmp_path):
    assert provenance.git_commit(tmp_path) == "unknown"  # not a repository
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "a")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "untracked.txt").write_text("not code the number came from\n")
    assert provenance.git_commit(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert provenance.git_commit(tmp_path) == f"{head}-dirty"
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", provenance.git_commit())  # this checkout


@pytest.mark.parametrize("argv, stem", [
    (["--model", "7b", "--gpus", "16", "--system", "sync", "--seed", "1"], "sim_7b_16gpus_sync"),
    (["--model", "7b", "--gpus", "16", "--system", "sync", "--results-name", "cell"], "cell"),
])
def test_the_simulator_writes_its_result_with_provenance(tmp_path, argv, stem):
    from verl_laminar.sim.__main__ import main

    assert main([*argv, "--results", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert path.name == f"{stem}_{record['date'][:10]}.json"
    assert provenance.missing(record) == [] and record["label"] == "SIMULATED"
    assert record["command"].startswith("python -m verl_laminar.sim --model 7b")
    assert record["params"]["device"]["name"] and record["throughput"] > 0
    with pytest.raises(SystemExit):  # a second run the same day does not overwrite the first
        main([*argv, "--results", str(tmp_path)])


@pytest.mark.parametrize("module, argv, stem", [
    ("verl_laminar.bench.repack", [], "bench_repack"),
    ("verl_laminar.bench.repack", ["--pool-overhead"], "bench_pool_overhead"),
    ("verl_laminar.bench.relay", ["--sweep"], "bench_relay_sweep"),
    ("verl_laminar.bench.relay", ["--relays", "16"], "bench_relay_p16"),
    ("verl_laminar.chaos.product", [], "chaos_product"),
])
def test_a_benchmark_refuses_to_overwrite_a_result_before_it_starts(tmp_path, module, argv, stem):
    """The name is fixed at the start (the provenance date); a clash stops the run there, not after an hour."""
    import importlib

    existing = tmp_path / f"{stem}_{provenance.provenance()['date'][:10]}.json"
    existing.write_text("{}\n")
    assert importlib.import_module(module).main([*argv, "--results", str(tmp_path)]) == 2  # before Ray or netns
    assert existing.read_text() == "{}\n"
