"""The README stays the newcomer's map, short and current: its commands are CI's, it points to
docs/ for the reference."""

import re
from pathlib import Path

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


def test_the_readme_starts_with_its_two_commands_and_ci_runs_the_second():
    block = re.search(r"## Try it: two commands\n\n.*?```sh\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert commands == ["./try", "./test"]
    assert (REPO / ".ci" / "run").read_text().rstrip().endswith("\n./test")
    for name in ("try", "test"):
        script = (REPO / name).read_text()
        assert "\n.ci/install\n" in script and (REPO / name).stat().st_mode & 0o111, name
    assert '\n    exec uv run pytest "$@"\n' in (REPO / "test").read_text()  # options: pytest's alone


def _install_packages() -> set[str]:
    text = (REPO / ".ci" / "install").read_text()
    return set(re.search(r'PACKAGES="([^"]*)"', text).group(1).split())


def test_the_install_script_brings_what_the_lab_needs():
    from lab.system import REQUIRED_PROGRAMS  # noqa: PLC0415 (the lab's own list)

    # On every Debian or Ubuntu machine already: Priority required, or what runs the machine.
    present = {"coreutils", "mount", "dpkg", "systemd"}
    assert set(REQUIRED_PROGRAMS.values()) - present <= _install_packages()
    text = (REPO / ".ci" / "install").read_text()
    assert 'pipx install --force "uv==$UV_VERSION"' in text and re.search(r"^UV_VERSION=[0-9.]+$", text, re.M)
    assert "uv sync --locked" in text


def test_each_python_block_of_the_readme_is_a_file_one_can_copy():
    """Each ```python block is valid Python as it stands (two files in one block were not)."""
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) >= 3
    for block in blocks:
        compile(block, "README.md", "exec")
