"""
NGC container controls: the pinned image is there at its digest (and a built image
carries its recipe), spark-container is installed where nobody else can change it, a
command run through it leaves its files on the host, secrets stay out of
``docker inspect``, and Jupyter listens on loopback only with a private token.

What the host must look like is worked out here from the settings, independently of
the code that converges (operations/ngc/).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time

import pytest

from sparkrig.user_files import user_read

from .reads import need

LAUNCHER = "/usr/local/bin/spark-container"
TOKEN = "/var/lib/sparkrig/jupyter/token"
UNIT = "sparkrig-jupyter.service"
LISTENERS = "ss -ltnH 'sport = :%s'"  # the local addresses listening on a TCP port
TOKEN_LIMIT = 4096
JUPYTER_TRIES = 30  # seconds a starting JupyterLab is given to answer


@need
def state(r) -> dict | None:
    """What the read-only NGC controls read of the host (nothing where NGC is off)."""
    settings = r.settings
    if not settings["ngc_enabled"]:
        return None
    found = {
        "base": r.run(
            "docker image inspect --format '{{json .RepoDigests}}' %s", settings["ngc_base_image"], sudo=True
        ),
        "dockerfile": r.file("/etc/sparkrig/ngc/Dockerfile", sudo=True),
        "digest": r.run("sha256sum < /etc/sparkrig/ngc/Dockerfile", sudo=True),
        "label": r.run(
            "docker image inspect --format '{{index .Config.Labels \"sparkrig.recipe\"}}' %s",
            settings["ngc_image"],
            sudo=True,
        ),
        "launcher": r.path(LAUNCHER),
        "syntax": r.run("bash -n %s", LAUNCHER),
    }
    if settings["ngc_jupyter"]:
        port = settings["ngc_jupyter_port"]
        url = f"http://127.0.0.1:{port}/api/kernelspecs"
        # The token file is the Jupyter user's: read through the bounded reader, and handed to
        # curl on its standard input (printf is a shell builtin), never in argv.
        token = user_read(shlex.quote(TOKEN), TOKEN_LIMIT)
        found.update(
            service=r.service(UNIT),
            listeners=r.run(LISTENERS, str(port), sudo=True),
            connect=r.run("bash -c %s", f"exec 3<>/dev/tcp/127.0.0.1/{port}"),
            token=r.path(TOKEN, sudo=True),
        )
    if settings["ngc_jupyter"] and settings["ngc_jupyter_command"].startswith("jupyter "):
        found.update(
            status=r.run(
                f"for i in $(seq {JUPYTER_TRIES}); do s=$(curl -s -o /dev/null -w '%{{http_code}}' "
                f"{shlex.quote(url)}); case $s in ''|000) sleep 1;; *) break;; esac; done; echo \"$s\""
            ),
            kernelspecs=r.run(
                f't=$({token}) && printf \'header = "Authorization: token %s"\\n\' "$t" | '
                f"curl -sf -K - {shlex.quote(url)}",
                sudo=True,
            ),
        )
    return found


@pytest.fixture
def ngc(host, settings):
    """The host, where the NGC workflow is turned on."""
    if not settings["ngc_enabled"]:
        pytest.skip("ngc_enabled is False for this host: no NGC container workflow to check")
    return host


@pytest.fixture
def launcher_user(ngc, settings):
    """A user allowed to launch (the first of ngc_users)."""
    if not settings["ngc_users"]:
        pytest.skip("ngc_users is empty: only root may launch, and the controls run as a user")
    return settings["ngc_users"][0]


def _as(host, user: str, script: str):
    """Run ``script`` with bash as ``user`` in a login shell (their HOME and groups)."""
    with host.sudo(user):
        return host.run("cd && bash -c %s", script)


def _listeners(host, port: int, tries: int) -> list[str]:
    """The local addresses listening on TCP ``port``, once there is one (a second apart, at
    most ``tries`` times: a container may be starting); empty if none came."""
    listeners: list[str] = []
    for _ in range(tries):
        with host.sudo():
            out = host.check_output(LISTENERS, str(port))
        listeners = [line.split()[3] for line in out.splitlines() if line.strip()]
        if listeners:
            break
        time.sleep(1)
    return listeners


@pytest.fixture
def ngc_read(read, settings) -> dict:
    """What the host says of the NGC workflow, where it is turned on."""
    if not settings["ngc_enabled"]:
        pytest.skip("ngc_enabled is False for this host: no NGC container workflow to check")
    return read(state)


def test_base_image_is_present_at_the_pinned_digest(ngc_read, settings):
    """Protects against training on whatever a moving tag pointed to that day, and a first
    launch that waits for a 20 GB pull: the base image is there, at the pinned digest."""
    image = settings["ngc_base_image"]
    repository, digest = image.split("@")
    repository = repository.rsplit(":", 1)[0] if ":" in repository.split("/")[-1] else repository
    out = ngc_read["base"]
    assert out.rc == 0, f"{image} is not present: {out.stderr}"
    assert f"{repository}@{digest}" in json.loads(out.stdout), f"{image} is present under {out.stdout}"


def test_built_image_carries_its_recipe(ngc_read, settings):
    """Protects against an image built from an older Dockerfile (or by hand) posing as the
    configured one: the built image is labelled with the sha256 of the Dockerfile on the host."""
    if settings["ngc_build"] == "none":
        pytest.skip("ngc_build is 'none': the base image runs as it is, nothing is built")
    dockerfile = ngc_read["dockerfile"].check()
    digest = ngc_read["digest"].check().split()[0]
    label = ngc_read["label"].check()
    assert f"FROM {settings['ngc_base_image']}" in dockerfile, "the Dockerfile is not FROM the pinned base image"
    assert label == digest, "the image was not built from the Dockerfile on the host"


def test_launcher_is_root_owned_and_not_writable_by_others(ngc_read):
    """Protects against privilege escalation: every allowed user runs spark-container with
    Docker access, so whoever can change it runs code as them (and as root, through Docker)."""
    launcher = ngc_read["launcher"]
    assert launcher.exists, f"{LAUNCHER} is missing"
    assert (launcher.user, launcher.group) == ("root", "root")
    assert launcher.mode == 0o755, f"{LAUNCHER} has mode {oct(launcher.mode)}"
    assert ngc_read["syntax"].rc == 0, f"{LAUNCHER} does not parse: {ngc_read['syntax'].stderr.strip()}"


@pytest.mark.action
def test_launcher_round_trip_keeps_data_on_the_host(ngc, launcher_user, settings):
    """Protects against losing checkpoints with the container (a training run must survive
    its container's removal and resume from its checkpoints), and against files the user
    cannot delete: what a command writes under the project is on the host afterwards, owned
    by the caller."""
    project = "sparkrig-ngc-check"
    script = (
        f"rm -rf {project} && mkdir {project} && cd {project} && "
        "spark-container -- sh -c 'mkdir -p outputs && echo step-500 > outputs/checkpoint && pwd' && "
        "cat outputs/checkpoint && stat -c %U outputs/checkpoint"
    )
    result = _as(ngc, launcher_user, script)
    _as(ngc, launcher_user, f"rm -rf {project}")
    assert result.rc == 0, f"spark-container failed: {result.stderr}"
    lines = result.stdout.split()
    assert lines == [settings["ngc_project_mount"], "step-500", launcher_user], result.stdout


@pytest.mark.action
def test_secrets_reach_the_container_but_not_docker_inspect(ngc, launcher_user):
    """Protects against tokens visible to every docker group member through ``docker
    inspect`` (``-e TOKEN=value``): a secret from the caller's environment is there inside
    the container and nowhere in its configuration."""
    secret = "sparkrig-check-" + hashlib.sha256(str(time.time()).encode()).hexdigest()[:16]
    name = "sparkrig-secret-check"
    with ngc.sudo(launcher_user):
        # setsid -f: started in its own session, so the SSH command returns at once.
        ngc.run(
            "cd && HF_TOKEN=%s setsid -f spark-container --name %s -- sh -c %s </dev/null >/dev/null 2>&1",
            secret,
            name,
            'echo "$HF_TOKEN" > /tmp/seen; sleep 30',
        )
    try:
        seen = ""
        for _ in range(40):
            with ngc.sudo():
                seen = ngc.run("docker exec %s cat /tmp/seen", name).stdout.strip()
            if seen:
                break
            time.sleep(0.5)
        with ngc.sudo():
            inspect = ngc.check_output("docker inspect %s", name)
        assert seen == secret, "HF_TOKEN did not reach the container"
        assert secret not in inspect, "docker inspect shows the secret"
    finally:
        with ngc.sudo():
            ngc.run("docker rm --force %s", name)


@pytest.fixture
def jupyter(ngc_read, settings) -> dict:
    if not settings["ngc_jupyter"]:
        pytest.skip("ngc_jupyter is False for this host: no Jupyter service to check")
    return ngc_read


def test_jupyter_listens_on_loopback_only(jupyter, settings):
    """Protects against a notebook server (which runs any code it is sent) open to the
    network: the service is enabled and running, and every socket on its port is bound to
    127.0.0.1 or ::1."""
    service = jupyter["service"]
    assert service.is_enabled and service.is_running, f"{UNIT} is not enabled and running"
    port = settings["ngc_jupyter_port"]
    listeners = [line.split()[3] for line in jupyter["listeners"].check().splitlines() if line.strip()]
    assert listeners, f"nothing listens on port {port}"
    exposed = [a for a in listeners if not a.startswith(("127.0.0.1:", "[::1]:"))]
    assert not exposed, f"Jupyter's port {port} is bound beyond loopback: {exposed}"
    assert jupyter["connect"].rc == 0, "no answer on 127.0.0.1"


def test_jupyter_token_file_is_private(jupyter, settings):
    """Protects against a token anyone on the host can read (and so open the notebook
    server), or a missing one that leaves Jupyter to make up its own: the token file is the
    Jupyter user's, mode 0600, and not empty."""
    token = jupyter["token"]
    assert token.exists, f"{TOKEN} is missing"
    assert token.user == settings["ngc_jupyter_user"]
    assert token.mode == 0o600, f"{TOKEN} has mode {oct(token.mode)}"
    assert token.size >= 32, f"{TOKEN} holds a token of {token.size} bytes"


def test_jupyter_wants_its_token_and_offers_the_images_python(jupyter, settings):
    """Protects against a notebook server anyone on the host can use (no token, or another
    one than the file's), and against notebooks that run without the image's Python: the API
    refuses a request without the token, and with the file's token lists a python3 kernel."""
    if not settings["ngc_jupyter_command"].startswith("jupyter "):
        pytest.skip(
            f"ngc_jupyter_command runs {settings['ngc_jupyter_command'].split()[0]!r}, not "
            "Jupyter (the lab's stand-in HTTP server): there is no token nor kernel to check"
        )
    url = f"http://127.0.0.1:{settings['ngc_jupyter_port']}/api/kernelspecs"
    status = jupyter["status"].stdout.strip()
    assert status in ("401", "403"), f"{url} answered {status} without a token"
    specs = jupyter["kernelspecs"].check()
    assert "python3" in json.loads(specs)["kernelspecs"], specs


STAND_IN_IMAGE = "/sparkrig-lab/ngc-stand-in:"  # lab/registry.py's busybox image


@pytest.mark.action
def test_pytorch_imports_inside_the_image(ngc, launcher_user, settings):
    """Protects against an image whose PyTorch is broken or CPU-only (`import torch` and
    `torch.cuda.is_available()`, every GPU setup guide's first check): torch imports inside
    the container, and sees the GPU where the host has one."""
    if STAND_IN_IMAGE in settings["ngc_base_image"]:
        pytest.skip("the lab's STAND-IN image (lab/registry.py) is busybox: it has no Python or PyTorch")
    gpu = ngc.file("/dev/nvidiactl").exists
    result = _as(
        ngc,
        launcher_user,
        "spark-container -- python3 -c 'import torch; print(torch.__version__, torch.cuda.is_available())'",
    )
    assert result.rc == 0, f"import torch failed in the image: {result.stderr}"
    version, available = result.stdout.split()[-2:]
    assert version, result.stdout
    if gpu:
        assert available == "True", f"torch {version} does not see the host's GPU"


@pytest.mark.action
def test_a_detached_server_publishes_its_port_on_loopback_only(ngc, launcher_user):
    """Protects against a model server open to the whole network by default (`vllm serve`
    listens on every address, port 8000, unless told otherwise), and against detached
    containers spark-jobs cannot see or stop: a server started with --detach and --publish
    answers on 127.0.0.1 only, is listed as its caller's job, and spark-jobs stop ends it and
    its container."""
    port, name = 18765, f"sparkrig-serve-{int(time.time())}"
    started = _as(
        ngc,
        launcher_user,
        f"mkdir -p sparkrig-serve && cd sparkrig-serve && echo hello > index.html && "
        f"spark-container --detach {name} --publish {port} -- "
        f"sh -c 'exec busybox httpd -f -p {port} || exec python3 -m http.server {port}'",
    )
    try:
        assert started.rc == 0, started.stderr
        listeners = _listeners(ngc, port, tries=60)
        assert listeners, f"nothing listens on port {port}"
        assert all(a.startswith(("127.0.0.1:", "[::1]:")) for a in listeners), listeners
        jobs = _as(ngc, launcher_user, "spark-jobs list").stdout
        assert any(line.split()[:3] == [name, launcher_user, "active"] for line in jobs.splitlines()), jobs
        assert _as(ngc, launcher_user, f"spark-jobs stop {name}").rc == 0
        with ngc.sudo():
            gone = ngc.run("docker inspect spark-job-%s", name)
        assert gone.rc != 0, "the container outlived its stopped job"
    finally:
        with ngc.sudo():
            ngc.run(
                "systemctl stop spark-job-%s.service; spark-jobs forget %s; docker rm -f spark-job-%s", name, name, name
            )
        _as(ngc, launcher_user, "rm -rf sparkrig-serve")


@pytest.mark.action
def test_home_mounts_are_read_only_and_the_model_cache_is_shared(ngc, launcher_user, settings):
    """Protects against credentials a container could change or delete (~/.aws), and a
    model cache the container does not share: a configured home directory is readable and
    not writable inside, and with jobs_model_cache, HF_HOME inside is that cache."""
    if not settings["ngc_home_mounts"]:
        pytest.skip("ngc_home_mounts is empty for this host: no home directory is mounted")
    mount = settings["ngc_home_mounts"][0].removeprefix("~/")
    script = (
        f"mkdir -p {mount} && echo probe > {mount}/sparkrig-probe && spark-container -- sh -c "
        f"'cat /tmp/{mount}/sparkrig-probe; touch /tmp/{mount}/x 2>/dev/null && echo writable; "
        f"touch $HF_HOME/sparkrig-probe-$$ && echo cache-ok'; rm -f {mount}/sparkrig-probe"
    )
    lines = _as(ngc, launcher_user, script).stdout.split()
    assert lines[0] == "probe" and "writable" not in lines, lines
    if settings["jobs_model_cache"]:
        assert "cache-ok" in lines, lines
        with ngc.sudo():
            written = ngc.check_output(
                "find %s -maxdepth 1 -name 'sparkrig-probe-*' -printf '%%g\\n' -delete", settings["jobs_model_cache"]
            )
        assert written.split() and set(written.split()) == {settings["jobs_model_cache_group"]}, written
