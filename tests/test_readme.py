"""README.md and the docs it points to: every Python snippet runs as written (README.md top to bottom in one
namespace, as a reader would paste them into one session; each docs file in its own), every relative link and
anchor resolves, the README opens with the two commands and stays a ten-minute read, its headline results are the
figures of docs/results.md, and its changelog's breaks hold in the code."""

import collections
import dataclasses
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [ROOT / "docs" / "guide.md", ROOT / "docs" / "results.md"]  # the files the README's details moved to
README_SECTIONS = ["What lpjax is", "Install", "Three ways to use it", "API", "Results", "Layout", "Changelog"]


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def _run_blocks(path: Path) -> int:
    """Runs the python blocks of ``path`` top to bottom in one fresh namespace; returns how many ran."""
    blocks = _python_blocks(path.read_text())
    namespace: dict = {"__name__": path.stem}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{path.name} python block {i}", "exec"), namespace)
        except Exception as error:  # the failing snippet in the message, not just its traceback
            raise AssertionError(f"{path.relative_to(ROOT)} python block {i} fails:\n{block}") from error
    return len(blocks)


@pytest.mark.parametrize(
    "path, at_least", [(README, 1), (DOCS[0], 3)], ids=lambda p: p.name if isinstance(p, Path) else str(p)
)
def test_python_snippets_run_as_written(path, at_least, capsys):
    assert _run_blocks(path) >= at_least
    assert capsys.readouterr().out  # the snippets print what they show


def test_readme_opens_with_the_two_commands():
    first_block = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in first_block] == [["make", "demo"], ["make", "test"]]


def test_readme_is_a_ten_minute_read_in_the_issues_order():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    assert re.findall(r"^## (.+)$", text, flags=re.M) == README_SECTIONS
    assert text.index("```bash") < text.index("## What lpjax is")  # the two commands come first
    ways = re.findall(r"^### (\(.\) .+)$", text, flags=re.M)
    assert ways == ["(a) In your own code", "(b) The experiment CLIs", "(c) The notebooks"]


# ---- links ----------------------------------------------------------------------------------------------------


def _without_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _without_code(text: str) -> str:
    """``text`` without fenced blocks and inline code spans, whose brackets are not links (a link's text may hold
    a code span: it becomes empty, the link stays)."""
    return re.sub(r"`[^`\n]*`", "", _without_fences(text))


def _links(text: str) -> list[str]:
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", _without_code(text))


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings: lower case, punctuation dropped, spaces to hyphens, a
    repeated heading suffixed -1, -2, ..."""
    seen: collections.Counter = collections.Counter()
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", _without_fences(path.read_text()), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return anchors


def _broken_links(path: Path) -> list[str]:
    broken = []
    for link in _links(path.read_text()):
        if re.match(r"[a-z]+:", link):  # https:, mailto: -- not relative
            continue
        target, _, anchor = link.partition("#")
        resolved = (path.parent / target).resolve() if target else path
        if not resolved.exists():
            broken.append(f"{link}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{link}: no heading #{anchor} in {resolved.name}")
    return broken


def test_anchors_follow_githubs_rule():
    assert _anchors(README) >= {"a-in-your-own-code", "results", "changelog"}


def test_a_missing_file_or_heading_is_a_broken_link(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## Some heading, with `code`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#some-heading-with-code) [self](#top) [gone](missing.md) [bad](other.md#nope)\n\n# Top\n"
        "`[not](a-link.md)`\n```\n[not](a-link-either.md)\n```\n[web](https://example.com)\n"
    )
    assert _broken_links(page) == ["missing.md: no such file", "other.md#nope: no heading #nope in other.md"]


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_every_relative_link_points_to_an_existing_file_and_heading(path):
    assert _links(path.read_text()), f"{path.name} links nowhere"
    assert _broken_links(path) == []


def test_readme_links_every_new_docs_file_and_the_design_docs():
    linked = {(README.parent / link.partition("#")[0]).resolve() for link in _links(README.read_text())}
    for doc in [*DOCS, ROOT / "docs" / "design.md", ROOT / "docs" / "multi_device.md", ROOT / "WORKSPACE.md"]:
        assert doc in linked, doc.name


# ---- the README's headline results ------------------------------------------------------------------------------


def _section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_every_headline_figure_is_one_of_docs_results_and_links_its_json():
    """The README's results summary quotes docs/results.md, which is kept current from the benchmarks' json: a
    figure in the summary but not there was invented or went stale."""
    summary = _section(README.read_text(), "Results")
    rows = [line for line in summary.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    results = (ROOT / "docs" / "results.md").read_text()
    figures = set(re.findall(r"\d+(?:\.\d+)?(?:e-?\d+)?", results))
    assert len(rows) >= 10
    for row in rows:
        what, headline, details = (cell.strip() for cell in row.strip("|").split(" | "))
        quoted = re.findall(r"\d+(?:\.\d+)?(?:e-?\d+)?", headline)
        assert quoted, row
        assert [figure for figure in quoted if figure not in figures] == [], what
        assert re.search(r"\(docs/results\.md#[\w-]+\)", details), what
        assert re.search(r"\(benchmarks/results/\w+\.json\)", details), what


# ---- the changelog ------------------------------------------------------------------------------------------------


def test_the_changelogs_breaks_hold_in_the_code():
    import lpjax.kernels
    import lpjax.methods
    import lpjax.nn
    import lpjax.numerics
    import lpjax.optim
    from lpjax.agents.grpo import GRPOConfig, RolloutConfig
    from lpjax.agents.sac import SACConfig

    changelog = _section(README.read_text(), "Changelog")
    for name in ("softplus", "SOFTPLUS_LIMIT", "tanh_normal_log_prob"):
        assert f"`{name}`" in changelog or f"`lpjax.numerics.{name}`" in changelog
        assert not hasattr(lpjax.numerics, name), name
    assert callable(lpjax.methods.method_optimizer) and not hasattr(lpjax.optim, "method_optimizer")
    assert callable(lpjax.kernels.lower_for_cuda)
    dense_fields = {field.name for field in dataclasses.fields(lpjax.nn.Dense)}
    assert "matmul_impl" in dense_fields and "impl" not in dense_fields
    assert "kv_dtype" not in {field.name for field in dataclasses.fields(RolloutConfig)}
    for key in ("tis", "rollout_precision", "kv_cache_dtype", "seed"):
        with pytest.raises(ValueError, match="Unknown GRPO config keys"):
            GRPOConfig.from_mapping({key: 1})
    with pytest.raises(ValueError, match="Unknown SAC config keys"):
        SACConfig.from_mapping({"policy": "fp16", "hadam": True})
