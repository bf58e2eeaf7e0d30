"""The README's commands and domain example stay true."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_opens_with_the_two_commands():
    first_block = re.search(r"```sh\n(.*?)```", README, re.S).group(1).splitlines()
    commands = [line.split("#")[0].strip() for line in first_block if line.strip()]
    assert commands == ["make serve", "make test"]
    assert README.index("```sh") < README.index("\n## ")


def test_domain_example_runs_and_prints_what_it_says(capsys):
    section = README.split("## Using the domain without a server", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    comments = [line.split("# ", 1)[1] for line in code.splitlines() if line.startswith("print(")]
    assert printed == comments
