"""Mutation check of sparkrig's safety mechanisms: each mutant below is a one-line change that
removes or weakens one mechanism (a trust check, a cap, a hash check, a rollback condition);
the tests named beside it must fail once it is applied. Each is applied alone to a scratch
copy of the checkout and those tests are run there; a mutant they do not notice SURVIVES and
the mechanism has no test.

    uv run python -m tests.mutants            # every mutant; prints killed/survived, exit 1 if any survived
    uv run python -m tests.mutants NAME...    # these alone (names as --list prints them)
    uv run python -m tests.mutants --list     # the mutants, not run

Not run by CI (6 minutes on two cores, 25 when others load them); tests/repo/test_mutants.py checks that each
mutant still applies to the tree (its line is there exactly once). A mechanism added later adds
its mutant here. docs/security.md says what it covers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository
    old: str  # text found exactly once in the file
    new: str
    tests: tuple[str, ...]  # the unit and repo tests that must notice (files or node ids)


MUTANTS = (
    # How a boot ended: only journal fields no user can set decide, dumps belong to one boot.
    Mutant(
        "boots-target-from-anyone",
        "templates/updates/boots.sh",
        "_PID=1 _UID=0 \\",
        "\\",
        ("tests/unit/operations/test_boots.py",),
    ),
    Mutant(
        "boots-mark-from-anyone",
        "templates/updates/boots.sh",
        '_UID=0 SYSLOG_IDENTIFIER="$mark"',
        'SYSLOG_IDENTIFIER="$mark"',
        ("tests/unit/operations/test_boots.py",),
    ),
    Mutant(
        "boots-collector-target-from-anyone",
        "templates/metrics/sparkrig-metrics.sh.j2",
        "-n 1 _PID=1 _UID=0 \\",
        "-n 1 \\",
        ("tests/unit/operations/test_boots.py",),
    ),
    Mutant(
        "boots-dump-after-a-clean-end",
        "operations/updates/boots.py",
        "and not _targets(found_of[previous])",
        "and True",
        ("tests/unit/operations/test_boots.py",),
    ),
    # The suite's answers: a command under host.sudo() is another user's view, never the
    # login user's cached answer.
    Mutant(
        "reads-sudo-uncached",
        "tests/compliance/reads.py",
        "if backend.sudo or sent != plain:",
        "if sent is None:",
        ("tests/unit/tools/test_compliance_reads_sudo.py", "tests/unit/tools/test_compliance_reads.py"),
    ),
    # The metrics collector: label values escaped, nvidia-smi run only when root's alone.
    Mutant(
        "metrics-name-label-unescaped",
        "templates/metrics/sparkrig-metrics.sh.j2",
        'name=\\"$(label "${name# }")\\"',
        'name=\\"${name# }\\"',
        ("tests/unit/operations/test_gpu_trust.py", "tests/unit/operations/test_metrics.py"),
    ),
    Mutant(
        "metrics-smi-group-writable",
        "templates/metrics/sparkrig-metrics.sh.j2",
        '-maxdepth 0 -type f -user root ! -perm /022 2>/dev/null)" ]; then',
        '-maxdepth 0 -type f -user root ! -perm /002 2>/dev/null)" ]; then',
        ("tests/unit/operations/test_gpu_trust.py", "tests/unit/operations/test_metrics.py"),
    ),
    Mutant(
        "metrics-smi-any-owner",
        "templates/metrics/sparkrig-metrics.sh.j2",
        "-type f -user root ! -perm /022",
        "-type f ! -perm /022",
        ("tests/unit/operations/test_gpu_trust.py", "tests/unit/operations/test_metrics.py"),
    ),
    Mutant(
        "gpu-state-smi-group-writable",
        "templates/sparkrig/gpu-state.sh.j2",
        "-user root ! -perm /022)",
        "-user root ! -perm /002)",
        ("tests/unit/operations/test_gpu_trust.py", "tests/unit/operations/test_gpu_policy.py"),
    ),
    Mutant(
        "gpu-state-smi-any-owner",
        "templates/sparkrig/gpu-state.sh.j2",
        '-maxdepth 0 -user root ! -perm /022)"',
        '-maxdepth 0 ! -perm /022)"',
        ("tests/unit/operations/test_gpu_trust.py", "tests/unit/operations/test_gpu_policy.py"),
    ),
    Mutant(
        "gpu-policy-smi-any-owner",
        "templates/gpu_policy/sparkrig-gpu-policy.sh",
        "-maxdepth 0 -user root ! -perm /022",
        "-maxdepth 0 ! -perm /022",
        ("tests/unit/operations/test_gpu_trust.py", "tests/unit/operations/test_gpu_policy.py"),
    ),
    Mutant(
        "gpu-policy-smi-group-writable",
        "templates/gpu_policy/sparkrig-gpu-policy.sh",
        "-user root ! -perm /022",
        "-user root ! -perm /002",
        ("tests/unit/operations/test_gpu_trust.py", "tests/unit/operations/test_gpu_policy.py"),
    ),
    # The GPU policy: values within what each GPU allows, and a GPU to apply them to.
    Mutant(
        "gpu-power-minimum-unchecked",
        "sparkrig/gpu.py",
        'low = gpu[field[0]] if key == "gpu_power_limit_w" else CLOCK_MIN_MHZ',
        "low = CLOCK_MIN_MHZ",
        ("tests/unit/operations/test_gpu_trust.py", "tests/unit/operations/test_gpu_policy.py"),
    ),
    Mutant(
        "gpu-policy-no-gpu-accepted",
        "operations/gpu_policy/deploy.py",
        'if gpu["problem"] or not gpu["gpus"]:',
        'if gpu["problem"]:',
        ("tests/unit/operations/test_gpu_trust.py", "tests/unit/operations/test_gpu_policy.py"),
    ),
    # Firmware: an applied update marks the reboot it needs.
    Mutant(
        "firmware-no-reboot-mark",
        "templates/updates/firmware-apply.sh",
        "touch /run/reboot-required",
        ":",
        ("tests/unit/operations/test_scripts_run.py", "tests/unit/operations/test_updates_firmware.py"),
    ),
    # The rollout: --resume's failure budget counts the hosts run now.
    Mutant(
        "rollout-resume-budget-whole-batch",
        "tools/rollout.py",
        "if over_budget(failed, len(todo), budget):",
        "if over_budget(failed, len(batch), budget):",
        ("tests/unit/tools/test_rollout_resume.py", "tests/unit/tools/test_rollout.py"),
    ),
    # The cluster link: the ports alone, the MTU proven, kept only when it works.
    Mutant(
        "link-apply-nm-prefix-match",
        "templates/cluster/link-apply.sh.j2",
        'interface-name:$1(,|\\$)"',
        'interface-name:$1"',
        (
            "tests/unit/operations/test_scripts_run.py",
            "tests/unit/operations/test_cluster.py",
            "tests/unit/operations/test_cluster_link_rollback.py",
        ),
    ),
    Mutant(
        "confirm-link-mtu-unproven",
        "templates/cluster/confirm-link.sh.j2",
        '-M "do" -s {{ port.mtu - 28 }} -I',
        "-I",
        (
            "tests/unit/operations/test_scripts_run.py",
            "tests/unit/operations/test_cluster.py",
            "tests/unit/operations/test_cluster_link_rollback.py",
        ),
    ),
    Mutant(
        "confirm-link-failed-apply-kept",
        "templates/cluster/confirm-link.sh.j2",
        'elif [ "$(cat "$d/applied")" != 0 ]; then',
        'elif [ "$(cat "$d/applied")" = 1 ]; then',
        (
            "tests/unit/operations/test_scripts_run.py",
            "tests/unit/operations/test_cluster.py",
            "tests/unit/operations/test_cluster_link_rollback.py",
        ),
    ),
    Mutant(
        "confirm-link-faulty-link-kept",
        "templates/cluster/confirm-link.sh.j2",
        'elif fault=$(link_fault) && [ -n "$fault" ]; then',
        "elif false; then",
        (
            "tests/unit/operations/test_scripts_run.py",
            "tests/unit/operations/test_cluster.py",
            "tests/unit/operations/test_cluster_link_rollback.py",
        ),
    ),
    Mutant(
        "link-rollback-keeps-new-files",
        "templates/cluster/link-rollback.sh.j2",
        'if [ -f "$d/old"{{ path }} ]; then cp -a "$d/old"{{ path }} {{ path }}; fi',
        ":",
        ("tests/unit/operations/test_cluster.py", "tests/unit/operations/test_cluster_link_rollback.py"),
    ),
    # Every Python root starts runs isolated (-I): nothing from its working directory or
    # environment is imported.
    Mutant(
        "python-I-venv",
        "operations/python_stack/operations.py",
        '"&& python3 -I -m venv",',
        '"&& python3 -m venv",',
        ("tests/repo/test_architecture.py", "tests/unit/operations/test_python_stack.py"),
    ),
    Mutant(
        "python-I-suite-venv",
        "tests/compliance/venv.py",
        '"$2/bin/python" -I -c "$3"',
        '"$2/bin/python" -c "$3"',
        ("tests/repo/test_architecture.py", "tests/unit/tools/test_compliance_venv.py"),
    ),
    Mutant(
        "python-I-daemon-json",
        "templates/containers/daemon-json-check.sh",
        'python3 -I -c "import json',
        'python3 -c "import json',
        ("tests/repo/test_architecture.py", "tests/unit/operations/test_containers.py"),
    ),
    Mutant(
        "python-I-prefix-unpack",
        "operations/source_builds/prefixes.py",
        '"python3 -I -c",',
        '"python3 -c",',
        ("tests/repo/test_architecture.py", "tests/unit/operations/test_prefix_builds.py"),
    ),
    # Every command starts in / (connection.py).
    Mutant(
        "connection-cd-slash-unset",
        "sparkrig/connection.py",
        'inventory.get_override_data()["_chdir"] = WORKING_DIRECTORY',
        "inventory.get_override_data()",
        ("tests/repo/test_values.py", "tests/repo/test_architecture.py", "tests/unit/sparkrig/test_lock.py"),
    ),
    Mutant(
        "connection-cd-slash-not-hooked",
        "sparkrig/connection.py",
        "state.init = init_then_from_slash",
        "state.init = init",
        ("tests/repo/test_values.py", "tests/repo/test_architecture.py", "tests/unit/sparkrig/test_lock.py"),
    ),
    # The one bounded reader of user-controlled paths.
    Mutant(
        "user-read-follows-links",
        "templates/sparkrig/user-read.sh",
        "iflag=nofollow,nonblock,count_bytes",
        "iflag=nonblock,count_bytes",
        ("tests/unit/sparkrig/test_user_read_races.py", "tests/unit/sparkrig/test_user_files.py"),
    ),
    Mutant(
        "user-read-blocks",
        "templates/sparkrig/user-read.sh",
        "iflag=nofollow,nonblock,count_bytes",
        "iflag=nofollow,count_bytes",
        ("tests/unit/sparkrig/test_user_read_races.py", "tests/unit/sparkrig/test_user_files.py"),
    ),
    Mutant(
        "user-read-no-size-cap",
        "templates/sparkrig/user-read.sh",
        '[ "${s##* }" -le "$2" ] ||',
        "true ||",
        ("tests/unit/sparkrig/test_user_read_races.py", "tests/unit/sparkrig/test_user_files.py"),
    ),
    Mutant(
        "user-read-link-on-the-way",
        "templates/sparkrig/user-read.sh",
        '[ "$(pwd -P)" = "${d:-/}" ] ||',
        "true ||",
        ("tests/unit/sparkrig/test_user_read_races.py", "tests/unit/sparkrig/test_user_files.py"),
    ),
    Mutant(
        "user-read-any-file-type",
        "templates/sparkrig/user-read.sh",
        '"regular file "*|"regular empty file "*) ;;',
        "*) ;;",
        ("tests/unit/sparkrig/test_user_read_races.py", "tests/unit/sparkrig/test_user_files.py"),
    ),
    Mutant(
        "user-read-no-time-cap",
        "sparkrig/user_files.py",
        'f"{prefix}timeout -k 1 {int(timeout_s or READ_TIMEOUT_S)} "',
        'f"{prefix}"',
        ("tests/unit/sparkrig/test_user_read_races.py", "tests/unit/sparkrig/test_user_files.py"),
    ),
    # Settings: a value matches its whole pattern, not a prefix of it.
    Mutant(
        "settings-env-name-prefix",
        "sparkrig/settings.py",
        "not ENV_NAME.fullmatch(name)",
        "not ENV_NAME.match(name)",
        (
            "tests/unit/sparkrig/test_settings.py",
            "tests/unit/operations/test_cuda_env.py",
            "tests/unit/operations/test_jobs.py",
        ),
    ),
    Mutant(
        "settings-memory-max-prefix",
        "sparkrig/settings.py",
        "_MEMORY_MAX.fullmatch(value)",
        "_MEMORY_MAX.match(value)",
        (
            "tests/unit/sparkrig/test_settings.py",
            "tests/unit/operations/test_jobs.py",
            "tests/unit/operations/test_watchdog.py",
        ),
    ),
    Mutant(
        "settings-cluster-interface-prefix",
        "operations/cluster/settings.py",
        "not _INTERFACE.fullmatch(name)",
        "not _INTERFACE.match(name)",
        ("tests/unit/operations/test_cluster.py", "tests/unit/operations/test_cluster_rails.py"),
    ),
    Mutant(
        "settings-image-reference-prefix",
        "operations/containers/settings.py",
        "IMAGE_REFERENCE.fullmatch(value)",
        "IMAGE_REFERENCE.match(value)",
        ("tests/unit/operations/test_containers.py",),
    ),
    Mutant(
        "settings-jobs-user-prefix",
        "operations/jobs/settings.py",
        "if isinstance(value, str) and USER_NAME.fullmatch(value)",
        "if isinstance(value, str) and USER_NAME.match(value)",
        ("tests/unit/operations/test_jobs.py", "tests/unit/sparkrig/test_settings.py"),
    ),
    # Atomic writes: the new file is validated before it replaces the old one.
    Mutant(
        "atomic-no-validate",
        "sparkrig/atomic.py",
        '["&& {", *[QuoteString(part) for part in validate], temp, "|| { rm -f", temp, "; false; }; }"]',
        "[]",
        ("tests/unit/sparkrig/test_atomic_state.py", "tests/unit/operations/test_sshd_guard.py"),
    ),
    # Downloads and wheels: pinned and hash-checked.
    Mutant(
        "receive-no-hash-check",
        "templates/source_builds/receive.sh",
        'echo "$4  $3" | sha256sum --check --quiet',
        "true",
        ("tests/unit/operations/test_source_builds.py", "tests/unit/operations/test_prefix_builds.py"),
    ),
    Mutant(
        "unpack-prefix-no-hash-check",
        "sparkrig/unpack_prefix.py",
        "if digest.hexdigest() != sha256:",
        "if False:",
        ("tests/unit/operations/test_prefix_builds.py",),
    ),
    Mutant(
        "stack-sync-no-require-hashes",
        "operations/python_stack/operations.py",
        '"pip sync --no-config --quiet --require-hashes",',
        '"pip sync --no-config --quiet",',
        ("tests/unit/operations/test_python_stack.py",),
    ),
    Mutant(
        "stack-lock-pin-unchecked",
        "sparkrig/stack_locks.py",
        'if not (isinstance(wheel["sha256"], str) and _SHA256.fullmatch(wheel["sha256"])):',
        'if not isinstance(wheel["sha256"], str):',
        ("tests/unit/operations/test_python_stack.py", "tests/unit/tools/test_python_lock.py"),
    ),
    # A draining host refuses new work with 75 (EX_TEMPFAIL), which callers retry on.
    Mutant(
        "spark-run-drain-exit",
        "templates/jobs/spark-run.sh.j2",
        'it starts no new job until root runs spark-jobs undrain" 75',
        'it starts no new job until root runs spark-jobs undrain" 1',
        ("tests/unit/operations/test_jobs.py",),
    ),
    Mutant(
        "spark-container-drain-exit",
        "templates/ngc/spark-container.sh.j2",
        'fail 75 "this host is draining',
        'fail 1 "this host is draining',
        ("tests/unit/operations/test_ngc.py",),
    ),
    Mutant(
        "apt-locks-busy-exit",
        "templates/sparkrig/wait-for-apt-locks.sh",
        "    exit 75",
        "    exit 1",
        ("tests/unit/sparkrig/test_packages.py",),
    ),
    # What steers the controller's next step (a rollout's state, SSH control sockets, the
    # suite's results) lives in a directory of the caller's alone.
    Mutant(
        "private-dir-group-writable",
        "tools/private.py",
        "found.st_mode & (0o077 if closed else 0o022)",
        "found.st_mode & (0o077 if closed else 0o002)",
        ("tests/unit/tools/test_private.py", "tests/unit/tools/test_rollout.py", "tests/unit/tools/test_fleet.py"),
    ),
    Mutant(
        "private-dir-another-owner",
        "tools/private.py",
        "or found.st_uid != os.geteuid() or",
        "or",
        ("tests/unit/tools/test_private.py", "tests/unit/tools/test_rollout.py", "tests/unit/tools/test_fleet.py"),
    ),
    Mutant(
        "private-dir-any-file-type",
        "tools/private.py",
        "if not stat.S_ISDIR(found.st_mode) or found.st_uid",
        "if found.st_uid",
        ("tests/unit/tools/test_private.py", "tests/unit/tools/test_rollout.py", "tests/unit/tools/test_fleet.py"),
    ),
    # A host's strings reach the operator's terminal escaped.
    Mutant(
        "report-control-characters-raw",
        "sparkrig/host_output.py",
        'if unicodedata.category(ch)[0] == "C" or unicodedata.category(ch) in ("Zl", "Zp"):',
        'if unicodedata.category(ch) == "Cs" or unicodedata.category(ch) in ("Zl", "Zp"):',
        ("tests/unit/operations/test_updates.py", "tests/unit/tools/test_fleet_page.py"),
    ),
    # The controller's wheel cache: a download whose sha256 is not the lock's is refused.
    Mutant(
        "wheel-download-no-hash-check",
        "sparkrig/python_wheels.py",
        "if atomic.file_sha256(temp) != sha256:",
        "if False:",
        ("tests/unit/sparkrig/test_python_wheels.py",),
    ),
    # No credentials in a URL of any setting.
    Mutant(
        "settings-credentials-allowed",
        "sparkrig/settings.py",
        "return bool(_CREDENTIALS.search(value))",
        "return False",
        ("tests/unit/sparkrig/test_settings.py",),
    ),
    # Root's unpacker: a bounded count of members.
    Mutant(
        "unpack-prefix-no-member-cap",
        "sparkrig/unpack_prefix.py",
        "if count > max_members:",
        "if False:",
        ("tests/unit/operations/test_prefix_builds.py",),
    ),
    # The lab's llama.cpp sdist: used only with its pinned sha256.
    Mutant(
        "lab-llamacpp-sdist-unchecked",
        "lab/llamacpp.py",
        "    return verified_sdist(path)",
        "    return path",
        ("tests/lab/test_lab_llamacpp.py",),
    ),
    # llama-server is run only where root alone may change it.
    Mutant(
        "serving-llama-server-any-owner",
        "operations/serving/engines.py",
        'if now["uid"] != 0:',
        "if False:",
        ("tests/unit/operations/test_serving.py",),
    ),
    # The probe reads each engine's own metrics.
    Mutant(
        "serving-metrics-vllm-for-every-engine",
        "operations/serving/deploy.py",
        '"metrics": list(ENGINE_METRICS[engine(model)]),',
        '"metrics": list(ENGINE_METRICS["vllm"]),',
        ("tests/unit/operations/test_serving.py",),
    ),
    # llama.cpp's key through the helper, in its environment, never on the command line.
    Mutant(
        "serving-llama-key-variable",
        "operations/serving/engines.py",
        'KEY_VARIABLES = {"vllm": "VLLM_API_KEY", "llama.cpp": "LLAMA_API_KEY"}',
        'KEY_VARIABLES = {"vllm": "VLLM_API_KEY", "llama.cpp": "VLLM_API_KEY"}',
        ("tests/unit/operations/test_serving.py",),
    ),
)


def applies(mutant: Mutant, root: Path = REPO) -> str | None:
    """Why ``mutant`` does not apply to the tree at ``root`` (None when it does)."""
    path = root / mutant.path
    if not path.is_file():
        return f"{mutant.path} is missing"
    count = path.read_text().count(mutant.old)
    if count != 1:
        return f"{mutant.path} holds {mutant.old!r} {count} times, not once"
    missing = [t for t in mutant.tests if not (root / t.split("::")[0]).is_file()]
    return f"its tests {missing} are missing" if missing else None


def _scratch(into: Path) -> Path:
    """A copy of the checkout's files (what git tracks, and what it does not ignore) with a
    virtual environment that imports sparkrig from the copy: the checkout's packages through
    links, its editable path entry pointing at the copy (a test's ``sys.executable -I`` runs
    the copy's code too)."""
    tree = into / "tree"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source, dest = REPO / name, tree / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted, not yet committed
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            dest.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, dest)
    venv = REPO / ".venv"
    own = tree / ".venv"
    (own / "bin").mkdir(parents=True)
    shutil.copy2(venv / "pyvenv.cfg", own / "pyvenv.cfg")
    (own / "bin" / "python").symlink_to((venv / "bin" / "python").resolve())
    for entry in (venv / "bin").iterdir():
        if not (own / "bin" / entry.name).exists():
            (own / "bin" / entry.name).symlink_to(entry)
    for site in venv.glob("lib/python*/site-packages"):
        mine = own / site.relative_to(venv)
        mine.mkdir(parents=True)
        for entry in site.iterdir():
            if entry.suffix == ".pth" and entry.read_text().strip() == str(REPO):
                (mine / entry.name).write_text(f"{tree}\n")
            else:
                (mine / entry.name).symlink_to(entry)
    return tree


def _pytest(tree: Path, tests: tuple[str, ...], timeout_s: int) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    command = [str(tree / ".venv" / "bin" / "python"), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout_s} s"
    return done.returncode, done.stdout + done.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    parser.add_argument("--timeout", type=int, default=300, help="seconds one mutant's tests may take")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the tests' output of each survivor")
    parser.add_argument(
        "--drop",
        action="append",
        default=[],
        metavar="TEST",
        help="leave this test file out of every mutant's tests (to see what it alone kills)",
    )
    options = parser.parse_args(argv)
    unknown = set(options.names) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"no such mutant: {', '.join(sorted(unknown))}")
    chosen = [
        replace(m, tests=tuple(t for t in m.tests if t.split("::")[0] not in options.drop))
        for m in MUTANTS
        if not options.names or m.name in options.names
    ]
    if options.list:
        for m in chosen:
            print(f"{m.name}: {m.path}: {m.old!r} -> {m.new!r}\n    {' '.join(m.tests)}")
        return 0
    stale = {m.name: why for m in chosen if (why := applies(m))}
    stale.update({m.name: "no test left to run" for m in chosen if not m.tests})
    for name, why in stale.items():
        print(f"STALE {name}: {why}")
    if stale:
        return 2
    with tempfile.TemporaryDirectory(prefix="sparkrig-mutants-") as scratch:
        tree = _scratch(Path(scratch))
        baseline = sorted({t for m in chosen for t in m.tests})
        rc, out = _pytest(tree, tuple(baseline), options.timeout * 4)
        if rc != 0:
            print(f"the tests fail without any mutant (exit {rc}):\n{out[-4000:]}")
            return 2
        survived = []
        for m in chosen:
            path = tree / m.path
            original = path.read_text()
            path.write_text(original.replace(m.old, m.new))
            started = time.monotonic()
            try:
                rc, out = _pytest(tree, m.tests, options.timeout)
            finally:
                path.write_text(original)
            took = time.monotonic() - started
            verdict = "killed" if rc != 0 else "SURVIVED"
            by = next((line.split(" - ")[0] for line in out.splitlines() if line.startswith(("FAILED ", "ERROR "))), "")
            print(f"{verdict:8} {m.name} ({took:.0f} s{f', exit {rc}' if rc not in (0, 1) else ''}) {by}", flush=True)
            if rc == 0:
                survived.append(m.name)
                if options.verbose:
                    print(out[-2000:])
        print(f"{len(chosen) - len(survived)} of {len(chosen)} mutants killed, {len(survived)} survived")
        for name in survived:
            print(f"  survived: {name}")
        return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
