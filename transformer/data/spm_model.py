"""A serialized SentencePiece model's canonical form and digest: what it does, apart from where and
how it was trained, so that two trainings of one tokenizer on the same data compare equal."""

from __future__ import annotations

import hashlib

from google.protobuf.message import DecodeError
from sentencepiece import sentencepiece_model_pb2

from transformer.errors import DataError

# The TrainerSpec fields that record where and on how many threads a model was trained (its
# input files, its output path, which held a temporary name with a process id), not what it does.
RUN_RECORD = ("input", "input_format", "model_prefix", "num_threads")


def canonical_model(model: bytes) -> bytes:
    """A serialized SentencePiece model without :data:`RUN_RECORD`: its pieces, scores, types,
    normalizer and the trainer options that tokenizing reads (model type, special ids, byte
    fallback, ...). Two models that tokenize alike have the same canonical bytes."""
    try:
        proto = sentencepiece_model_pb2.ModelProto.FromString(model)
    except DecodeError as err:
        raise DataError(f"not a SentencePiece model ({err})") from err
    for name in RUN_RECORD:
        proto.trainer_spec.ClearField(name)
    return proto.SerializeToString(deterministic=True)


def model_digest(model: bytes) -> str:
    """A short hex digest of what a serialized SentencePiece model does (its
    :func:`canonical_model`): equal for two trainings of one tokenizer on the same data."""
    return hashlib.sha1(canonical_model(model)).hexdigest()[:16]
