"""gcp-storage-emulator as a test's GCS: `python -m tests.gcs_emulator PORT BUCKET`, and
`running(log_dir)`, which starts it for a test and yields an `Emulator` (its URL, the variables
that point a process at it, its bucket's objects listed and read over HTTP).

Serves in memory on localhost:PORT with BUCKET created, until killed. One fix makes it answer like
GCS: a media download carries the object's generation in `x-goog-generation` (real GCS sends it;
the emulator does not). TensorStore (Orbax's array store) reads it to make conditional reads, and
without it fails with "Malformed StorageGeneration" at the second array of a checkpoint. A second
makes an upload honour GCS's precondition `ifGenerationMatch` (0: only if no such object exists,
else 412), which the emulator ignores: hmdlm_jax/lease.py creates its lease with it.
"""

from __future__ import annotations

import contextlib
import http
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, Iterator

from gcp_storage_emulator import server
from gcp_storage_emulator.handlers import objects

_download = objects.download


def _download_with_generation(request: Any, response: Any, storage: Any, *args: Any,
                              **kwargs: Any) -> None:
  _download(request, response, storage, *args, **kwargs)
  try:
    obj = storage.get_file_obj(request.params['bucket_name'], request.params['object_id'])
  except Exception:  # pylint: disable=broad-except  # not found: the 404 stands
    return
  response['x-goog-generation'] = obj['generation']
  response['x-goog-metageneration'] = obj['metageneration']


_insert = objects.insert
_insert_lock = threading.Lock()  # the check and the create as one step, as GCS makes them


def _object_name(request: Any) -> str | None:
  """The name an upload request creates: ?name=, else its JSON metadata's (multipart: 'meta')."""
  if 'name' in request.query:
    return request.query['name'][0]
  data = request.data if isinstance(request.data, dict) else {}
  return data.get('meta', data).get('name')


def _insert_if_generation_matches(request: Any, response: Any, storage: Any, *args: Any,
                                  **kwargs: Any) -> None:
  """objects.insert under `ifGenerationMatch` (a simple or multipart upload's single request; a
  resumable upload is checked when it starts, not when it completes as on GCS)."""
  wanted = request.query.get('ifGenerationMatch')
  with _insert_lock:
    if wanted:
      try:
        obj = storage.get_file_obj(request.params['bucket_name'], _object_name(request))
        live = str(obj['generation'])
      except Exception:  # pylint: disable=broad-except  # no such object
        live = '0'
      if live != wanted[0]:
        response.status = http.HTTPStatus.PRECONDITION_FAILED
        response.json({'error': {'code': 412, 'message': 'At least one of the pre-conditions you '
                                 'specified did not hold.', 'errors': [
                                     {'reason': 'conditionNotMet', 'domain': 'global'}]}})
        return
    _insert(request, response, storage, *args, **kwargs)


BUCKET = 'test-bucket'
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The variables `Emulator.env` sets (the stand-in TPU workers are given them by name).
ENV_NAMES = ('STORAGE_EMULATOR_HOST', 'TENSORSTORE_GCS_HTTP_URL', 'GOOGLE_AUTH_TOKEN_FOR_TESTING',
             'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT')


class Emulator:
  """The running emulator: its URL, and its bucket's objects read over HTTP (not through the code
  under test)."""

  def __init__(self, url: str) -> None:
    self.url = url

  def env(self) -> dict[str, str]:
    """What a user sets to point gcsfs (epath) and TensorStore (Orbax's arrays) at it."""
    return {'STORAGE_EMULATOR_HOST': self.url,
            'TENSORSTORE_GCS_HTTP_URL': self.url,
            'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'test',  # TensorStore: no real credentials
            # gcsfs asks a real GCS whether the bucket is hierarchical, warns, falls back: skip it.
            'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false'}

  def objects(self, prefix: str = '') -> dict[str, int]:
    """name -> size of every object of the bucket under `prefix`."""
    out, token = {}, ''
    while True:
      query = urllib.parse.urlencode({'prefix': prefix, **({'pageToken': token} if token else {})})
      with urllib.request.urlopen(f'{self.url}/storage/v1/b/{BUCKET}/o?{query}') as r:
        page = json.load(r)
      out.update({o['name']: int(o['size']) for o in page.get('items', [])})
      token = page.get('nextPageToken', '')
      if not token:
        return out

  def read(self, name: str) -> bytes:
    quoted = urllib.parse.quote(name, safe='')
    with urllib.request.urlopen(f'{self.url}/download/storage/v1/b/{BUCKET}/o/{quoted}?alt=media'
                                ) as r:
      return r.read()

  def jsonl(self, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in self.read(name).decode().splitlines() if line.strip()]


def _free_port() -> int:
  import portpicker  # pylint: disable=g-import-not-at-top  # test dependency
  return portpicker.pick_unused_port()


@contextlib.contextmanager
def running(log_dir: str | os.PathLike[str]) -> Iterator[Emulator]:
  """The emulator in a child process (its log in LOG_DIR/log.txt) for the `with` block."""
  port = _free_port()
  # Its log goes to a file: a pipe nobody reads fills up and blocks the emulator mid-request.
  log = pathlib.Path(log_dir) / 'log.txt'
  with open(log, 'w', encoding='utf-8') as out:
    proc = subprocess.Popen([sys.executable, '-m', 'tests.gcs_emulator', str(port), BUCKET],
                            cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
  emulator = Emulator(f'http://localhost:{port}')
  try:
    deadline = time.monotonic() + 30
    while True:
      try:
        emulator.objects()
        break
      except OSError:
        if proc.poll() is not None or time.monotonic() > deadline:
          raise RuntimeError(f'the GCS emulator did not start:\n{log.read_text()[-2000:]}'
                             ) from None
        time.sleep(0.1)
    yield emulator
  finally:
    proc.terminate()
    proc.wait(timeout=30)


def main(port: int, bucket: str) -> None:
  objects.download = _download_with_generation  # objects.get(alt=media) calls it by name
  objects.insert = _insert_if_generation_matches  # the batch handler looks it up by name
  fixes = {_download: _download_with_generation, _insert: _insert_if_generation_matches}
  for _, handlers in server.HANDLERS:
    for method, handler in handlers.items():
      if handler in fixes:
        handlers[method] = fixes[handler]
  server.create_server('localhost', port, in_memory=True, default_bucket=bucket).run()


if __name__ == '__main__':
  main(int(sys.argv[1]), sys.argv[2])
