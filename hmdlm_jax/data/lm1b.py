"""LM1B through TensorFlow Datasets' array_record format, read without TensorFlow.

`tfds.data_source('lm1b', data_dir=config.data.tfds_data_dir, download=False)` gives a
random-access source of {'text': bytes} records; the Grain chain of data/text.py tokenises one
sentence per row with bert-base-uncased and labels levels with the frequency rule. Splits: TFDS
'train' and 'test' (MDLM's LM1B test split). Rows, MASK and why no detokeniser runs:
docs/method.md §6; the reference figures: §9.

Preparing the data_dir (once), with TensorFlow installed (the builder globs with tf.io.gfile):
    tfds build lm1b --file_format=array_record --data_dir=DIR
or without it, from the extracted `1-billion-word-language-modeling-benchmark-r13output` folder
(the tarball at www.statmt.org/lm-benchmark), with the same TFDS builder (`main`):
    python -m hmdlm_jax.data.lm1b --source_dir=EXTRACTED --data_dir=DIR
Either way DIR/lm1b/1.1.0/ holds dataset_info.json, features.json and the array_record files.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from typing import Any

import grain

from hmdlm_jax import storage
from hmdlm_jax.data import text as text_lib
from hmdlm_jax.data import tokenizers as tokenizers_lib

TFDS_NAME = 'lm1b'
TFDS_SPLITS = {'train': 'train', 'test': 'test'}
_TOP = '1-billion-word-language-modeling-benchmark-r13output'
TRAIN_GLOB = os.path.join(_TOP, 'training-monolingual.tokenized.shuffled', 'news.en-*')
TEST_GLOB = os.path.join(_TOP, 'heldout-monolingual.tokenized.shuffled', 'news.en.heldout-*')
PREPARE_HINT = (
    'Prepare it once with `tfds build lm1b --file_format=array_record --data_dir=DIR` on a machine '
    'with TensorFlow, or without TensorFlow from the extracted LM1B tarball with `python -m '
    'hmdlm_jax.data.lm1b --source_dir=EXTRACTED --data_dir=DIR`, then set '
    'config.data.tfds_data_dir.')


def _builder_with_files(files: dict[str, list[str]], data_dir: str) -> Any:
  """TFDS's own LM1B builder, reading the given text files instead of globbing with TensorFlow."""
  from tensorflow_datasets.core import registered  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from tensorflow_datasets.datasets.lm1b import lm1b_dataset_builder

  base = lm1b_dataset_builder.Builder
  with registered.skip_registration():

    class _FileListBuilder(base):  # pylint: disable=missing-class-docstring
      name = TFDS_NAME

      @classmethod
      def _get_pkg_dir_path(cls):  # metadata (citation, description) of the real builder
        return base._get_pkg_dir_path()  # pylint: disable=protected-access

      def _split_generators(self, dl_manager):
        del dl_manager
        return {split: self._generate_examples(paths) for split, paths in files.items()}

  return _FileListBuilder(data_dir=data_dir, file_format='array_record')


def prepare_lm1b(data_dir: str, *, train_files: Sequence[str], test_files: Sequence[str]) -> str:
  """Writes the TFDS lm1b dataset (array_record) into `data_dir` from LM1B text files.

  Each file holds one sentence per line (the layout of the official tarball). Uses TFDS's LM1B
  builder itself, so the result is what `tfds build lm1b --file_format=array_record` produces
  (same name, version 1.1.0, features and metadata). Returns the dataset version directory.
  """
  for split, paths in (('train', train_files), ('test', test_files)):
    if not paths:
      raise ValueError(f'prepare_lm1b: no {split} files given.')
    for p in paths:
      if not os.path.isfile(p):
        raise ValueError(f'prepare_lm1b: {split} file {p} does not exist.')
  builder = _builder_with_files({'train': list(train_files), 'test': list(test_files)}, data_dir)
  builder.download_and_prepare()
  return str(builder.data_dir)


def prepare_lm1b_from_source(source_dir: str, data_dir: str) -> str:
  """`prepare_lm1b` from the extracted official tarball (its train and held-out shards)."""
  train = sorted(glob.glob(os.path.join(source_dir, TRAIN_GLOB)))
  test = sorted(glob.glob(os.path.join(source_dir, TEST_GLOB)))
  if not train or not test:
    raise ValueError(f'{source_dir} does not hold the LM1B shards {TRAIN_GLOB} and {TEST_GLOB}.')
  return prepare_lm1b(data_dir, train_files=train, test_files=test)


def lm1b_source(data_dir: str, split: str) -> Sequence[dict[str, Any]]:
  """Random-access TFDS source of {'text': bytes} for `split` ('train' | 'test')."""
  if split not in TFDS_SPLITS:
    raise ValueError(f'split={split!r}; allowed: {tuple(TFDS_SPLITS)}.')
  if not data_dir:
    raise ValueError(f'config.data.tfds_data_dir is empty: LM1B is read from a prepared TFDS '
                     f'data_dir. {PREPARE_HINT}')
  root = storage.as_path(data_dir) / TFDS_NAME
  infos = sorted(root.glob('*/dataset_info.json'))
  if not infos:
    raise ValueError(f'config.data.tfds_data_dir={data_dir!r} holds no prepared lm1b dataset '
                     f'({root}/<version>/dataset_info.json). {PREPARE_HINT}')
  fmt = json.loads(infos[-1].read_text()).get('fileFormat', 'tfrecord')
  if fmt != 'array_record':
    raise ValueError(f'{infos[-1]}: lm1b was prepared as {fmt!r}; random access without '
                     'TensorFlow needs array_record. Rebuild with '
                     '`tfds build lm1b --file_format=array_record`.')
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return tfds.data_source(TFDS_NAME, split=TFDS_SPLITS[split], data_dir=str(data_dir),
                          download=False)


def lm1b_pieces(record: dict[str, Any]) -> list[tuple[str, int]]:
  """A TFDS record {'text': bytes} -> the single body piece of its row."""
  raw = record['text']
  return [(raw.decode('utf-8') if isinstance(raw, bytes) else str(raw), text_lib.SEG_BODY)]


def check_lm1b_config(config: Any) -> tokenizers_lib.TextTokenizer:
  """What LM1B checks before reading data (fields, tokenizer, the TFDS folder); the tokenizer."""
  tok = text_lib.text_tokenizer(config, allowed_rules=('frequency', 'none'))
  data_dir = config.data.tfds_data_dir
  if not data_dir:
    raise ValueError(f'config.data.tfds_data_dir is empty: LM1B is read from a prepared TFDS '
                     f'data_dir. {PREPARE_HINT}')
  if not storage.as_path(data_dir).is_dir():
    raise ValueError(f'config.data.tfds_data_dir={data_dir!r} is not a folder: LM1B is read from '
                     f'a prepared TFDS data_dir. {PREPARE_HINT}')
  return tok


def make_lm1b_dataset(config: Any, split: str, *, seed: int, process_index: int,
                      process_count: int) -> grain.IterDataset:
  """LM1B batches {tokens, levels, given, loss_mask} [B, L] (docs/method.md §6).

  One sentence per row `[CLS] ... [SEP] [PAD]...` (bert-base-uncased, L = 128, no packing), long
  sentences truncated with [SEP] kept, as MDLM; levels by the frequency rule (τ = data.tau,
  default 1).
  """
  tok = check_lm1b_config(config)
  source = lm1b_source(config.data.tfds_data_dir, split)
  encode = text_lib.EncodeRows(tok, lm1b_pieces, text_lib.data_seq_len(config),
                               config.data.overlong)
  return text_lib.batched_dataset(source, encode, config, split, seed=seed,
                                  process_index=process_index, process_count=process_count)


def main(argv: Sequence[str] | None = None) -> None:
  """Prepares DIR from the extracted tarball (`prepare_lm1b_from_source`); prints the directory.

  DIR/lm1b/1.1.0/ then holds dataset_info.json, features.json and
  lm1b-{train,test}.array_record-*, which tensorflow-datasets (4.9.10) reads without TensorFlow.
  Building with TFDS's builder needs the package importlib_resources, which tensorflow-datasets
  4.9.10 imports but does not declare.
  """
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description='Prepare TFDS lm1b (array_record) without TF.')
  parser.add_argument('--source_dir', required=True,
                      help=f'folder holding the extracted {_TOP} directory')
  parser.add_argument('--data_dir', required=True, help='TFDS data_dir to write')
  args = parser.parse_args(argv)
  print(prepare_lm1b_from_source(args.source_dir, args.data_dir))


if __name__ == '__main__':
  main()
