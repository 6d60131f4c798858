"""The README stays the newcomer's map, short and current: its commands are CI's, it points to
docs/ for the reference."""

import ast
import re
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_the_readme_points_to_the_settings_reference():
    assert "[`docs/settings.md`](docs/settings.md)" in README


def test_the_readme_is_read_in_five_minutes_and_its_links_lead_somewhere():
    assert len(README.splitlines()) <= 200
    for page in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (REPO / page).is_file(), page
    for doc in (REPO / "docs").glob("*.md"):
        for page in re.findall(r"\]\(([a-z-]+\.md)", doc.read_text()):
            assert (REPO / "docs" / page).is_file(), f"{doc.name} links {page}"


def test_the_readme_test_command_is_the_one_ci_runs():
    assert re.search(r"^uv run pytest +# every test$", README, re.MULTILINE)
    assert (REPO / ".ci" / "run").read_text().rstrip().endswith("\nuv run pytest")


def _install_block() -> list[str]:
    """The README's install commands: the first lines of its lab block, comments cut."""
    block = re.search(r"Then:\n\n```sh\n(.*?)```", README, re.S).group(1)
    return [line.split("   #")[0].strip() for line in block.splitlines()[:3]]


def _apt_packages(text: str) -> set[str]:
    words = re.search(r"apt-get install ([^>\n]*)", text.replace("\\\n", " ")).group(1).split()
    return {word for word in words if not word.startswith("-")}


def test_the_readme_installs_without_a_prompt_what_the_lab_needs():
    from lab.system import REQUIRED_PROGRAMS
    apt, pipx, sync = _install_block()
    assert apt.startswith("apt-get update && apt-get install -y ")
    # On every Debian or Ubuntu machine already: Priority required, or what runs the machine.
    present = {"coreutils", "mount", "dpkg", "systemd"}
    assert set(REQUIRED_PROGRAMS.values()) - present <= _apt_packages(apt)
    assert "pipx" in _apt_packages(apt) and pipx.startswith("PIPX_BIN_DIR=/usr/local/bin pipx install uv==")
    assert sync == "uv sync --locked"


def test_ci_installs_as_the_readme_says():
    ci = (REPO / ".ci" / "run").read_text()
    apt, pipx, sync = _install_block()
    assert _apt_packages(apt) <= _apt_packages(ci)
    assert f"\n{pipx}\n" in ci and f"\n{sync}\n" in ci
