"""gcp-storage-emulator as a test's GCS: `python -m tests.gcs_emulator PORT BUCKET`.

Serves in memory on localhost:PORT with BUCKET created, until killed. One fix makes it answer like
GCS: a media download carries the object's generation in `x-goog-generation` (real GCS sends it;
the emulator does not). TensorStore (Orbax's array store) reads it to make conditional reads, and
without it fails with "Malformed StorageGeneration" at the second array of a checkpoint.
"""

from __future__ import annotations

import sys
from typing import Any

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


def main(port: int, bucket: str) -> None:
  objects.download = _download_with_generation  # objects.get(alt=media) calls it by name
  for _, handlers in server.HANDLERS:
    for method, handler in handlers.items():
      if handler is _download:
        handlers[method] = _download_with_generation
  server.create_server('localhost', port, in_memory=True, default_bucket=bucket).run()


if __name__ == '__main__':
  main(int(sys.argv[1]), sys.argv[2])
