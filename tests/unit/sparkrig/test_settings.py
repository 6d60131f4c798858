"""Settings: declared once, the reference generated from them, and bad values stop the run early."""

from __future__ import annotations

import ast
import importlib
import os
import runpy
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import yaml

from sparkrig import profile, settings
from sparkrig.operations import CONCERNS, declaring, load
from sparkrig.settings import (
    REFERENCE,
    SettingsError,
    all_settings,
    allowed,
    defaults,
    problems,
    reference,
    resolve,
    validate_hosts,
)

REPO = Path(__file__).resolve().parents[3]
ALL_PY = REPO / "group_data" / "all.py"


def test_the_settings_reference_is_generated_from_the_declarations_and_current():
    assert (REPO / REFERENCE).read_text() == reference(declaring()), (
        f"{REFERENCE} is stale: run `uv run sparkrig reference`"
    )
    for setting in all_settings():
        assert f"### `{setting.key}`\n" in reference(declaring())


def test_every_setting_says_what_it_allows_from_its_own_check():
    data = defaults(all_settings())
    for setting in all_settings():
        said = allowed(setting, data)
        assert said != "any value", f"{setting.key}: its check accepts anything"
        # ... and that is what a bad value is told.
        told = [
            line for line in problems(all_settings(), {setting.key: object()}) if line.startswith(f"{setting.key} = ")
        ]
        assert told and told[0].endswith(f"allowed is {said}"), told


def test_group_data_all_sets_only_sparkrig_settings_with_valid_values():
    """The file users override defaults in holds no stale key and no bad value."""
    set_here = {key: value for key, value in runpy.run_path(str(ALL_PY)).items() if not key.startswith("_")}
    known = {s.key for s in all_settings()}
    assert set(set_here) <= known, set(set_here) - known
    assert problems(all_settings(), set_here) == []


def test_every_concern_setting_has_a_doc_and_a_unique_key():
    keys = [s.key for s in all_settings()]
    assert len(keys) == len(set(keys))
    assert all(s.doc for concern in declaring() for s in concern.SETTINGS)


def test_defaults_are_valid():
    assert problems(all_settings(), {}) == []


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"cuda_env_file": "etc/cuda.env"}, "cuda_env_file = 'etc/cuda.env': allowed is a normalised absolute path"),
        ({"cuda_env_default_home": "/usr/local/../cuda"}, "cuda_env_default_home = '/usr/local/../cuda'"),
        ({"cuda_env_file": "/etc/it's.env"}, "without quotes"),
        (
            {"hardware_profile": "gb20"},
            "allowed is 'auto' or one of the profiles in hardware_profiles: gb10, hopper, rtx50",
        ),
        ({"hardware_profiles": {"gb10": {"arch": "arm"}}}, "bad profile: 'gb10'"),
        ({"cuda_env_extra": {"HF HOME": "/x"}}, "bad entry: 'HF HOME'"),
        ({"cuda_env_extra": {"HF_HOME": "it's"}}, "bad entry: 'HF_HOME'"),
        ({"cuda_env_extra": {"N": 3}}, "bad entry: 'N'"),
        ({"cuda_env_extra": {"CUDA_HOME": "/opt/cuda"}}, "CUDA_HOME is managed"),
        ({"cuda_env_fiel": "/x"}, "cuda_env_fiel: not a sparkrig setting (did you mean cuda_env_file?)"),
    ],
)
def test_bad_values_say_key_and_what_is_allowed(data, expected):
    found = problems(all_settings(), data)
    assert len(found) == 1 and expected in found[0], found


def test_other_keys_are_not_ours_to_judge():
    assert problems(all_settings(), {"ssh_user": "spark", "_sudo": True, "my_thing": 1}) == []


def test_a_custom_profile_is_accepted_and_selectable():
    profiles = {
        **profile.DEFAULT_PROFILES,
        "b200": {"arch": "x86_64", "compute_capability": "10.0", "torch_cuda_arch_list": "10.0;12.0+PTX"},
    }
    data = {"hardware_profiles": profiles, "hardware_profile": "b200"}
    assert problems(all_settings(), data) == []
    assert resolve(all_settings(), data)["hardware_profile"] == "b200"


def test_validate_hosts_names_every_bad_host_in_one_error():
    with pytest.raises(SettingsError) as raised:
        validate_hosts(
            [
                ("good", {}),
                ("spark-1", {"hardware_profile": "nope"}),
                ("spark-2", {"cuda_env_file": "relative"}),
            ]
        )
    message = str(raised.value)
    assert "nothing was changed on any host" in message
    assert "host 'spark-1': hardware_profile = 'nope'" in message
    assert "host 'spark-2': cuda_env_file = 'relative'" in message
    assert "good" not in message


def _deploys():
    """Each concern of the registry with its @deploy."""
    load()
    for module in declaring():
        name = module.__name__.rsplit(".", 1)[1]
        if name in CONCERNS:
            yield module, getattr(module, name)


def _defaults_of(module) -> dict:
    """What a concern's deploy is declared to take: its deploy module's DEFAULTS where it adds
    to its settings module's (python_stack: source_builds'), else its settings module's."""
    deploy = importlib.import_module(f"{module.__name__}.deploy")
    return getattr(deploy, "DEFAULTS", None) or importlib.import_module(f"{module.__name__}.settings").DEFAULTS


def test_every_deploy_takes_the_defaults_of_the_settings_it_reads_derived_not_listed():
    """Each concern's deploy takes its own settings' defaults and those of the concerns whose
    settings it reads, each a declared setting with its declared default; never every one."""
    everything = {s.key: s.default for s in all_settings()}
    deploys = list(_deploys())
    assert len(deploys) == len(CONCERNS)
    for module, function in deploys:
        taken = dict(function._inner.deploy_data)
        assert taken == _defaults_of(module), module.__name__
        assert defaults(module.SETTINGS).items() <= taken.items(), module.__name__
        assert taken.items() <= everything.items(), module.__name__
        assert set(taken) < set(everything), f"{module.__name__} takes every setting's default"


def _setting_keys_named(package: Path, keys: set[str]) -> dict[str, set[str]]:
    """The setting keys each module of ``package`` names as a whole string or an attribute
    (``data.X``, ``host.data.X``, ``settings["X"]``, ``data.get("X")``)."""
    found = {}
    for path in sorted(package.glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
        found[path.name] = names & keys
    return found


def test_a_split_concern_defaults_every_setting_its_code_reads():
    """A concern's deploy must run on its own (a user's deploy calling only it): every setting
    its code names, its own or another concern's, has a default in its DEFAULTS."""
    everything = {s.key for s in all_settings()}
    split = 0
    for module, _function in _deploys():
        own = _defaults_of(module)
        split += 1
        for name, keys in _setting_keys_named(Path(module.__file__).parent, everything).items():
            assert keys <= set(own), f"{module.__name__}: {name} reads {sorted(keys - set(own))} without a default"
    assert split == len(CONCERNS)


def test_the_setting_key_finder_sees_attributes_and_strings(tmp_path):
    (tmp_path / "deploy.py").write_text(
        'x = host.data.jobs_env\ny = settings["cuda_env_file"]\nz = data.get("ngc_users")\n'
        'w = "jobs_env is not read here"\n'
    )
    keys = {"jobs_env", "cuda_env_file", "ngc_users", "swap_remove_files"}
    assert _setting_keys_named(tmp_path, keys) == {"deploy.py": {"jobs_env", "cuda_env_file", "ngc_users"}}


def test_pyinfra_stops_on_a_bad_setting_before_contacting_any_host(tmp_path):
    """The real CLI, a host that would answer on a local port, a bad setting: no connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        textwrap.dedent(f"""
        sparks = [
            ("spark-ok", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port}}}),
            ("spark-bad", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port},
                            "hardware_profile": "gb11"}}),
        ]
    """)
    )
    try:
        result = subprocess.run(
            [str(Path(sys.executable).parent / "pyinfra"), "-y", str(inventory), "deploy.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        stop.set()
        thread.join()
        listener.close()
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "host 'spark-bad': hardware_profile = 'gb11': allowed is 'auto' or one of the profiles" in output
    assert "spark-ok'" not in output
    assert accepted == [], "a host was contacted although the settings were invalid"


# A trailing newline: Python's `$` matches before a final "\n", so a pattern checked with
# `match` and `$` lets "id\n" through, and cuda.env, which every login shell sources, then
# holds a bare command line. Every string of every default, with "\n" appended, is refused.
def _with_newline(value):
    if isinstance(value, str) and value:
        yield value + "\n"
    elif isinstance(value, dict):
        for key, item in value.items():
            for bad in _with_newline(item):
                yield {**value, key: bad}
            if isinstance(key, str) and key:
                yield {**{k: v for k, v in value.items() if k != key}, key + "\n": item}
    elif isinstance(value, list):
        for index, item in enumerate(value):
            for bad in _with_newline(item):
                yield [*value[:index], bad, *value[index + 1 :]]


def _valid() -> dict:
    """Every setting, each string in use: NGC on, an extra env entry, a source build on."""
    data = {s.key: s.default for s in all_settings()}
    data.update(
        ngc_enabled=True,
        ngc_base_image="nvcr.io/nvidia/pytorch:25.09-py3@sha256:" + "a" * 64,
        ngc_pip_packages=["peft==0.17.1"],
        ngc_users=["spark"],
        containers_docker_users=["spark"],
        cuda_env_extra={"HF_HOME": "/data/hf"},
        source_builds_enabled=["lab", "xformers"],
        python_stack_profiles=["unsloth"],
        source_builds={**data["source_builds"], "lab": {**data["source_builds"]["triton"], "url": "/srv/lab.git"}},
    )
    return data


def _newline_cases():
    for key, value in _valid().items():
        for bad in _with_newline(value):
            yield pytest.param(key, bad, id=f"{key}:{str(bad)[:60]!r}")


def test_the_newline_cases_start_from_valid_settings():
    assert problems(all_settings(), _valid()) == []


@pytest.mark.parametrize(("key", "bad"), list(_newline_cases()))
def test_a_trailing_newline_is_refused_everywhere(key, bad):
    assert problems(all_settings(), {**_valid(), key: bad}), f"{key} = {bad!r} was accepted"


def test_operations_match_whole_values():
    """No pattern in operations/ is anchored with `$` (fullmatch, or \\Z, instead)."""
    for path in (REPO / "operations").rglob("*.py"):
        text = path.read_text()
        assert ".match(" not in text, f"{path.name}: use fullmatch"
        for line in text.splitlines():
            if "re.compile(" in line:
                assert not line.rstrip().rstrip(")").endswith('$"'), f"{path.name}: {line.strip()}"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("python_index_url", "https://alice:s3cret-token@pypi.example.com/simple"),
        ("python_index_url", "https://s3cret-token@pypi.example.com/simple"),
        ("containers_docker_repo_url", "https://bob:s3cret-token@mirror.example.com/docker/linux/{os}"),
    ],
)
def test_a_url_holding_credentials_is_refused_for_every_setting(key, value):
    """A URL's user:token@ would reach files and command lines other local users can read
    (build.sh, uv's arguments): every setting refuses it, naming the host and the key,
    without repeating the secret."""
    with pytest.raises(SettingsError) as error:
        validate_hosts([("spark-01", {key: value})])
    message = str(error.value)
    assert "spark-01" in message and key in message and "credentials" in message, message
    assert "s3cret-token" not in message, message


def test_a_yaml_file_is_parsed_once_each_caller_gets_its_own_copy_and_a_change_is_read(tmp_path, monkeypatch):
    path = tmp_path / "manifest.yml"
    path.write_text("python: '3.12'\npins: {torch: '2.9.0'}\n")
    parses = []
    real = yaml.load
    monkeypatch.setattr(yaml, "load", lambda stream, Loader: parses.append(Loader) or real(stream, Loader=Loader))
    first = settings.yaml_file(path)
    first["pins"]["torch"] = "changed by a caller"
    assert settings.yaml_file(path) == {"python": "3.12", "pins": {"torch": "2.9.0"}}
    assert parses == [yaml.CSafeLoader]  # libyaml's, once
    path.write_text("python: '3.13'\n")
    os.utime(path, ns=(1, 1))  # a change the clock cannot hide
    assert settings.yaml_file(path) == {"python": "3.13"} and len(parses) == 2
