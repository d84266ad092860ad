"""Every Python snippet in README.md runs as written, top to bottom in one namespace (as a reader would paste
them into one session), and the README opens with the two commands."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_python_snippets_run_as_written(capsys):
    blocks = _python_blocks(README.read_text())
    assert len(blocks) >= 3
    namespace: dict = {"__name__": "readme"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"README.md python block {i}", "exec"), namespace)
        except Exception as error:  # the failing snippet in the message, not just its traceback
            raise AssertionError(f"README python block {i} fails:\n{block}") from error
    assert capsys.readouterr().out  # the snippets print what they show


def test_readme_opens_with_the_two_commands():
    first_block = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in first_block] == [["make", "demo"], ["make", "test"]]
