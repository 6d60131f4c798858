"""
NGC containers in the lab (lab-deb13): the pinned STAND-IN image was pulled by digest
from the lab's registry, a removed image is pulled again by the next converge (and the
one after changes nothing), a checkpoint written by one container is read by the next
(a training run resumed from its checkpoint in a new container), and Jupyter's STAND-IN
server answers on 127.0.0.1 but not on the host's address.

Each test restores what it changed, so the fleet stays converged for the compliance suite.
"""

import shlex

import pytest

import lab
from tests.conftest import LAB_INVENTORY
from tests.support import inventory_host_data, run_deploy

pytestmark = pytest.mark.lab
HOST = "lab-deb13"


@pytest.fixture(scope="module")
def data(first_converge):
    assert first_converge.returncode == 0, first_converge.log
    found = inventory_host_data(LAB_INVENTORY)[HOST]
    if not found.get("ngc_enabled"):
        pytest.skip("the lab inventory turns ngc_enabled on for lab-deb13 only when the lab serves its registry")
    return found


def _docker(command: str, check: bool = True):
    return lab.run_ssh(HOST, f"sudo docker {command}", check=check)


def test_the_base_image_came_from_the_registry_by_digest(data):
    image = data["ngc_base_image"]
    assert "@sha256:" in image and "stand-in" in image
    digests = _docker(f"image inspect --format '{{{{json .RepoDigests}}}}' {image}").stdout
    repository = image.split("@")[0].rsplit(":", 1)[0]
    assert f"{repository}@{image.split('@')[1]}" in digests


def test_a_removed_image_is_pulled_again_and_then_left_alone(data):
    image = data["ngc_base_image"]
    lab.run_ssh(HOST, "sudo systemctl stop sparkrig-jupyter")
    _docker(f"rmi {image}")
    again = run_deploy(LAB_INVENTORY, "--limit", HOST)
    assert again.returncode == 0, again.log
    changed = again.changed().get(HOST, [])
    assert any("Pull the pinned base image" in op for op in changed), changed
    assert _docker(f"image inspect {image}", check=False).returncode == 0
    lab.run_ssh(HOST, "sudo systemctl start sparkrig-jupyter")
    settled = run_deploy(LAB_INVENTORY, "--limit", HOST)
    assert settled.returncode == 0, settled.log
    assert settled.changed() == {}, settled.log


def test_an_image_not_built_from_the_recipe_is_rebuilt_and_used(data):
    """A sparkrig/ngc:local made by hand (here: the bare base, tagged) has no recipe label:
    the next converge builds it again from the Dockerfile, and spark-container runs it."""
    image = data["ngc_image"]
    assert data["ngc_build"] == "packages"
    _docker(f"tag {data['ngc_base_image']} {image}")
    again = run_deploy(LAB_INVENTORY, "--limit", HOST)
    assert again.returncode == 0, again.log
    assert any(
        op.endswith("| Build ngc_image (ngc_build) on the pinned base") for op in again.changed().get(HOST, [])
    ), again.changed()
    label = _docker(f"image inspect --format '{{{{index .Config.Labels \"sparkrig.recipe\"}}}}' {image}").stdout
    recipe = lab.run_ssh(HOST, "sha256sum < /etc/sparkrig/ngc/Dockerfile").stdout.split()[0]
    assert label.strip() == recipe
    settled = run_deploy(LAB_INVENTORY, "--limit", HOST)
    assert settled.returncode == 0, settled.log
    assert settled.changed() == {}, settled.log


def test_a_checkpoint_survives_the_container_and_training_resumes(data):
    """Unsloth's workflow on a Spark: train, stop, resume from the checkpoint on the host."""
    script = (
        "rm -rf g2p && mkdir g2p && cd g2p && "
        "spark-container -- sh -c 'mkdir -p outputs/checkpoint-500 && echo 500 > outputs/checkpoint-500/step' && "
        "spark-container -- sh -c 'echo resumed-from-$(cat outputs/checkpoint-500/step)' && "
        "stat -c '%U %a' outputs/checkpoint-500/step; cd && rm -rf g2p"
    )
    out = lab.run_ssh(HOST, f"bash -c {shlex.quote(script)}").stdout.split()
    assert out == ["resumed-from-500", "spark", "644"], out


def test_a_user_not_allowed_cannot_launch(data):
    lab.run_ssh(HOST, "id nobody2 >/dev/null 2>&1 || sudo useradd -M nobody2")
    result = lab.run_ssh(HOST, "sudo -u nobody2 spark-container -- true", check=False)
    assert result.returncode == 77, result.stderr
    assert "may not launch" in result.stderr


def test_jupyter_stand_in_answers_on_loopback_but_not_on_the_network(data):
    port = data["ngc_jupyter_port"]
    inside = lab.run_ssh(
        HOST,
        f"bash -c 'for i in $(seq 30); do exec 3<>/dev/tcp/127.0.0.1/{port} && exit 0; sleep 1; done; exit 1'",
        check=False,
    )
    assert inside.returncode == 0, "the stand-in Jupyter does not answer on 127.0.0.1"
    address = data["ssh_hostname"]
    outside = lab.run_ssh(HOST, f"bash -c 'exec 3<>/dev/tcp/{address}/{port}'", check=False)
    assert outside.returncode != 0, f"port {port} answers on {address}"
