"""The documentation points at what exists: links resolve, commands name real modules and configs, and the README
stays short enough to read (issue 41). Reads files only: nothing is imported from the repository or compiled."""

import glob
import importlib.util
import os
import re
import shlex

import pytest

from vit_jax_lab import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, 'README.md')
DOCS = sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))
EXPERIMENTS = sorted(glob.glob(os.path.join(ROOT, 'experiments', '*', '*.md')))  # README.md, NOTES.md
MAX_README_WORDS = 2500

FENCE = re.compile(r'^```(\w*)[^\n]*\n(.*?)^```', re.M | re.S)
INLINE_CODE = re.compile(r'`[^`\n]*`')
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')
HEADING = re.compile(r'^#{1,6}\s+(.*?)\s*#*\s*$', re.M)


def _read(path: str) -> str:
  with open(path, encoding='utf-8') as f:
    return f.read()


def _prose(text: str) -> str:
  """The text outside code, where a markdown link is a link."""
  return INLINE_CODE.sub('', FENCE.sub('', text))


def slug(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
  return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


def anchors(path: str) -> set[str]:
  """Every heading anchor of a markdown file; repeated headings get -1, -2, … as on GitHub."""
  seen: dict[str, int] = {}
  out = set()
  for heading in HEADING.findall(FENCE.sub('', _read(path))):
    base = slug(heading)
    n = seen.get(base, 0)
    seen[base] = n + 1
    out.add(base if n == 0 else f'{base}-{n}')
  return out


def broken_links(path: str) -> list[str]:
  """The relative links of a markdown file whose file, or heading in a markdown file, does not exist."""
  broken = []
  for link in LINK.findall(_prose(_read(path))):
    if re.match(r'^[a-z][a-z0-9+.-]*:', link):  # http:, https:, mailto:
      continue
    target, _, anchor = link.partition('#')
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
    if not os.path.exists(resolved):
      broken.append(f'{link}: no file {os.path.relpath(resolved, ROOT)}')
    elif anchor and resolved.endswith('.md') and anchor not in anchors(resolved):
      broken.append(f'{link}: no heading #{anchor} in {os.path.relpath(resolved, ROOT)}')
  return broken


def bash_commands(text: str) -> list[str]:
  """The commands of a markdown text's ```bash blocks: continued lines joined, split at &&, || and ;."""
  commands = []
  for language, body in FENCE.findall(text):
    if language != 'bash':
      continue
    for line in body.replace('\\\n', ' ').splitlines():
      commands += [c.strip() for c in re.split(r'&&|\|\||;', line) if c.strip()]
  return commands


def module_exists(name: str) -> bool:
  """Whether `python -m name` finds a module: a file or package of this repository, or an installed one when the
  name's first part is not the repository's (pytest)."""
  path = os.path.join(ROOT, *name.split('.'))
  if os.path.isfile(path + '.py') or os.path.isfile(os.path.join(path, '__init__.py')):
    return True
  top = name.split('.')[0]
  if os.path.exists(os.path.join(ROOT, top)) or os.path.exists(os.path.join(ROOT, top + '.py')):
    return False
  return importlib.util.find_spec(top) is not None


def command_problems(command: str) -> list[str]:
  """What a `python …` command names that does not exist: its module or script, and its --config files."""
  words = shlex.split(command, comments=True)
  while words and re.match(r'^\w+=', words[0]):  # VAR=value before the command.
    words = words[1:]
  if len(words) < 2 or words[0] not in ('python', 'python3'):
    return []
  problems = []
  if words[1] == '-m':
    if len(words) < 3 or not module_exists(words[2]):
      problems.append(f'python -m {words[2] if len(words) > 2 else ""}: no such module')
  elif words[1].endswith('.py') and not os.path.isfile(os.path.join(ROOT, words[1])):
    problems.append(f'python {words[1]}: no such file')
  for i, word in enumerate(words):
    spec = words[i + 1] if word == '--config' and i + 1 < len(words) else word.partition('=')[2]
    if (word == '--config' or word.startswith('--config=')) and spec:
      config = spec.partition(':')[0]
      if config_lib.resolve(config) is None:  # A path from the clone, or one of configs/ as vit/digits.
        problems.append(f'--config {spec}: no file {config}')
  return problems


def _name(path: str) -> str:
  return os.path.relpath(path, ROOT)


@pytest.mark.parametrize('path', [README, *DOCS, *EXPERIMENTS], ids=_name)
def test_every_relative_link_resolves(path):
  assert broken_links(path) == []


@pytest.mark.parametrize('path', [README, *DOCS, *EXPERIMENTS], ids=_name)
def test_every_command_names_an_existing_module_and_config(path):
  problems = [p for c in bash_commands(_read(path)) for p in command_problems(c)]
  assert problems == []


def test_the_docs_pages_exist_and_the_readme_links_each():
  assert len(DOCS) >= 6
  linked = {os.path.normpath(os.path.join(ROOT, link.partition('#')[0])) for link in LINK.findall(_read(README))}
  assert [_name(p) for p in DOCS if p not in linked] == []


def test_readme_is_at_most_2500_words():
  assert len(_read(README).split()) <= MAX_README_WORDS  # What `wc -w README.md` counts.


def test_readme_runs_the_whole_suite_as_ci_does():
  commands = bash_commands(_read(README))
  assert 'python -m pytest -q -n 2' in commands
  assert 'python -m pytest -q -n 2 -m "not slow"' in commands


def test_the_checks_catch_a_broken_link_a_missing_heading_module_and_config(tmp_path):
  page = tmp_path / 'page.md'
  page.write_text(
    '# Title\n\n## Two words\n\n[ok](#two-words) [gone](missing.md) [no heading](#three-words) '
    '`[code](not_a_link.md)` [web](https://example.com)\n'
  )
  assert broken_links(str(page)) == [
    f'missing.md: no file {os.path.relpath(tmp_path / "missing.md", ROOT)}',
    f'#three-words: no heading #three-words in {os.path.relpath(page, ROOT)}',
  ]
  assert command_problems('python -m vit_jax_lab.tools.nonexistent --workdir x') == [
    'python -m vit_jax_lab.tools.nonexistent: no such module'
  ]
  assert command_problems('python -m main --config configs/vit/nope.py:smoke --workdir x') == [
    '--config configs/vit/nope.py:smoke: no file configs/vit/nope.py'
  ]
  assert command_problems('python experiments/nope/run.py') == ['python experiments/nope/run.py: no such file']
  assert command_problems('python -m main --config configs/vit/digits.py:smoke --workdir x  # fine') == []
  assert command_problems('JAX_NUM_CPU_DEVICES=2 python -m pytest -q') == []
  assert bash_commands('```bash\npython -m main \\\n    --config a.py && ruff check .\n```\n') == [
    'python -m main      --config a.py',
    'ruff check .',
  ]


def test_slugs_follow_github():
  assert slug('Tasks (`task.name`)') == 'tasks-taskname'
  assert slug('Writing weights out: `tools.export`') == 'writing-weights-out-toolsexport'
  assert slug('evaluate, track and results') == 'evaluate-track-and-results'
