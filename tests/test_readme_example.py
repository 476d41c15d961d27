"""The README's Python example runs as written: its training command creates the run its three
lines load (with a short step count and a temporary workdir), and the lines complete the prompt."""

from __future__ import annotations

import contextlib
import io
import re
import sys

from tests.conftest import REPO, run_cmd

README = REPO + '/README.md'
RUN = '/tmp/hmdlm_text'


def _blocks() -> tuple[str, str]:
  """The bash command just before the Python block that loads RUN, and that block."""
  text = open(README, encoding='utf-8').read()
  found = re.search(r'```bash\n(python -m hmdlm_jax\.main [^\n]*)\n```\n```python\n(.*?)```', text,
                    re.S)
  assert found, 'README.md: no training command directly before the Python example'
  return found.group(1), found.group(2)


def test_the_readme_example_runs(tmp_path, jax_cache):
  command, code = _blocks()
  assert f'--workdir={RUN}' in command and f"hmdlm_jax.load('{RUN}')" in code
  workdir = str(tmp_path / 'hmdlm_text')
  argv = command.replace(RUN, workdir).split()[1:]  # as written, but in a temporary folder
  proc = run_cmd([sys.executable, *argv, '--config.train.num_steps=2',
                  '--config.train.ckpt_every=2', '--config.train.final_eval=False'],
                 jax_cache, timeout=240)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(code.replace(RUN, workdir), {})  # pylint: disable=exec-used
  printed = out.getvalue().strip()
  assert printed.startswith('the king') and len(printed) > len('the king'), printed

