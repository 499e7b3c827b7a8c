"""Training data for ``espresso train``: tokenizers, token sources and sequence packing.

Torch-free (numpy). A *source* yields documents as arrays of token ids, each ending with the
tokenizer's end-of-text id; :class:`Batches` packs the stream into sequences of ``seq_len + 1``
tokens, one after another with a stride of ``seq_len`` (the last token of one sequence is the
first of the next, so every token is a target once), and serves each step's global batch as
``(inputs, targets)``. When a source runs out it starts again (the next epoch). The position in
the data is the number of sequences served: a checkpoint stores it and a resumed run skips
that many (at once for token files; by reading them again for text and streamed datasets).

Sources (:func:`open_source`):

* ``synthetic``: counting sequences from random starts (the next token is the current one
  plus one), for smoke tests only;
* a local text file (``.txt``, ``.md``: one document), a JSON-lines file (``.jsonl``: one
  document per line, the text in ``text_field``), or a folder of them (sorted by name);
* pre-tokenized tokens: a ``.npy`` array, or a raw ``.bin`` file of ``token_dtype`` integers
  (nanoGPT's ``uint16`` layout), read through a memory map;
* ``hf:NAME[:CONFIG][@SPLIT]``: a Hugging Face dataset, streamed (the ``train`` extra).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .._optional import require
from ..errors import MissingExtraError, TrainError

TEXT_SUFFIXES = (".txt", ".md", ".text")
JSONL_SUFFIXES = (".jsonl", ".json")
TOKEN_SUFFIXES = (".npy", ".bin")
TOKEN_DTYPES = ("uint16", "uint32", "int32", "int64")
CHUNK_BYTES = 1 << 20
"""Text is read and tokenized in pieces of about this size (at line ends)."""
EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eot_id|>")


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eos_id: int

    def encode(self, text: str) -> np.ndarray: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens 0-255 and end-of-text 256: no files, no download; for small
    models (the model's vocabulary must hold 257 ids)."""

    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: Any) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", "replace")


class HFTokenizer:
    """A Hugging Face tokenizer: a ``tokenizer.json`` file, a folder holding one, or a model
    name on the Hub (``tokenizers``, else ``transformers``; the ``train`` extra)."""

    def __init__(self, ref: str, eos_id: int | None = None) -> None:
        self.name = ref
        self._tok: Any = None
        self._encode: Any = None
        path = Path(ref)
        if path.is_dir() and (path / "tokenizer.json").is_file():
            path = path / "tokenizer.json"
        try:
            tokenizers = require("tokenizers")
        except MissingExtraError:
            tokenizers = None
        if tokenizers is not None and (path.is_file() or not path.exists()):
            try:
                tok = (tokenizers.Tokenizer.from_file(str(path)) if path.is_file()
                       else tokenizers.Tokenizer.from_pretrained(ref))
            except Exception as exc:
                if path.is_file():
                    msg = f"--tokenizer: cannot read {ref!r} as a tokenizer.json ({exc})"
                    raise TrainError(msg) from None
                tok = None
            if tok is not None:
                self._tok = tok
                self.vocab_size = int(tok.get_vocab_size(with_added_tokens=True))
                self._encode = lambda text: tok.encode(text, add_special_tokens=False).ids
                self.eos_id = self._eos(eos_id, tok.token_to_id)
                return
        try:
            transformers = require("transformers")
        except MissingExtraError:
            msg = (f"--tokenizer {ref!r}: needs the `tokenizers` (or `transformers`) package and, "
                   "for a Hub name, network access; install the train extra "
                   "(`pip install -e '.[train]'`), or give a local tokenizer.json")
            raise TrainError(msg) from None
        try:
            hf = transformers.AutoTokenizer.from_pretrained(ref)
        except Exception as exc:
            msg = f"--tokenizer: cannot load {ref!r} ({exc})"
            raise TrainError(msg) from None
        self._tok = hf
        self.vocab_size = len(hf)
        self._encode = lambda text: hf(text, add_special_tokens=False)["input_ids"]
        self.eos_id = self._eos(eos_id if eos_id is not None else hf.eos_token_id,
                                hf.convert_tokens_to_ids)

    def _eos(self, given: int | None, lookup: Any) -> int:
        if given is not None:
            if not 0 <= int(given) < self.vocab_size:
                msg = (f"--eos-id: expected an id below the tokenizer's vocabulary "
                       f"{self.vocab_size}, got {given}")
                raise TrainError(msg)
            return int(given)
        for name in EOS_NAMES:
            i = lookup(name)
            if isinstance(i, int) and i >= 0:
                return i
        msg = (f"--tokenizer {self.name!r}: no end-of-text token among {EOS_NAMES}; "
               "give --eos-id")
        raise TrainError(msg)

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._encode(text), dtype=np.int64)


def open_tokenizer(ref: str | None, eos_id: int | None = None) -> Tokenizer:
    """``byte`` (or None) for :class:`ByteTokenizer`, else a Hugging Face tokenizer."""
    if ref in (None, "", "byte"):
        if eos_id is not None:
            msg = "--eos-id goes with --tokenizer (the byte tokenizer's end-of-text is 256)"
            raise TrainError(msg)
        return ByteTokenizer()
    return HFTokenizer(str(ref), eos_id)


class Source(Protocol):
    name: str

    def documents(self) -> Iterator[np.ndarray]:
        """One pass over the data: each document's tokens, ending with end-of-text."""
        ...


class TextSource:
    """Local text and JSON-lines files (a file, or a folder of them), tokenized on the fly."""

    def __init__(self, path: Path, tokenizer: Tokenizer, text_field: str = "text") -> None:
        self.name, self.tokenizer, self.text_field = str(path), tokenizer, text_field
        if path.is_dir():
            files = sorted(p for p in path.iterdir()
                           if p.is_file() and p.suffix in TEXT_SUFFIXES + JSONL_SUFFIXES)
            if not files:
                msg = (f"--data: folder {str(path)!r} holds no text files "
                       f"({', '.join(TEXT_SUFFIXES + JSONL_SUFFIXES)})")
                raise TrainError(msg)
        else:
            files = [path]
        self.files = files

    def documents(self) -> Iterator[np.ndarray]:
        eos = np.array([self.tokenizer.eos_id], dtype=np.int64)
        for f in self.files:
            if f.suffix in JSONL_SUFFIXES:
                yield from self._jsonl(f, eos)
                continue
            pieces = []
            with open(f, encoding="utf-8", errors="replace") as fh:
                while True:
                    text = fh.read(CHUNK_BYTES)
                    if not text:
                        break
                    text += fh.readline()  # end the piece at a line end
                    pieces.append(self.tokenizer.encode(text))
                    if sum(p.size for p in pieces) > CHUNK_BYTES:
                        yield np.concatenate(pieces)
                        pieces = []
            pieces.append(eos)
            yield np.concatenate(pieces)

    def _jsonl(self, f: Path, eos: np.ndarray) -> Iterator[np.ndarray]:
        with open(f, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    msg = f"--data: {f}:{n}: not a JSON object ({exc})"
                    raise TrainError(msg) from None
                text = row.get(self.text_field) if isinstance(row, dict) else None
                if not isinstance(text, str):
                    msg = (f"--data: {f}:{n}: expected a string field {self.text_field!r} "
                           "(--text-field)")
                    raise TrainError(msg)
                yield np.concatenate([self.tokenizer.encode(text), eos])


class TokenFileSource:
    """Pre-tokenized tokens on disk: one stream, documents already separated by the
    tokenizer's end-of-text (as nanoGPT's and Megatron's preprocessing write them)."""

    def __init__(self, path: Path, dtype: str = "uint16") -> None:
        self.name = str(path)
        if path.suffix == ".npy":
            try:
                arr = np.load(path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError) as exc:
                msg = f"--data: cannot read {str(path)!r} as a .npy array ({exc})"
                raise TrainError(msg) from None
            if arr.ndim != 1 or arr.dtype.kind not in "iu":
                msg = (f"--data: {str(path)!r}: expected a 1-D integer array of tokens, got "
                       f"{arr.ndim}-D {arr.dtype}")
                raise TrainError(msg)
        else:
            if dtype not in TOKEN_DTYPES:
                msg = f"--token-dtype: expected one of {', '.join(TOKEN_DTYPES)}, got {dtype!r}"
                raise TrainError(msg)
            size = np.dtype(dtype).itemsize
            nbytes = path.stat().st_size
            if nbytes == 0 or nbytes % size:
                msg = (f"--data: {str(path)!r} has {nbytes} bytes, not a whole number of "
                       f"{dtype} tokens (--token-dtype)")
                raise TrainError(msg)
            arr = np.memmap(path, dtype=dtype, mode="r")
        self.tokens = arr

    def documents(self) -> Iterator[np.ndarray]:
        step = 1 << 22
        for i in range(0, self.tokens.size, step):
            yield np.asarray(self.tokens[i:i + step], dtype=np.int64)


class HFDatasetSource:
    """A Hugging Face dataset, streamed (``datasets``; the ``train`` extra)."""

    def __init__(self, ref: str, tokenizer: Tokenizer, text_field: str = "text") -> None:
        body = ref.removeprefix("hf:")
        body, _, split = body.partition("@")
        name, _, config = body.partition(":")
        if not name:
            msg = f"--data: expected hf:NAME[:CONFIG][@SPLIT], got {ref!r}"
            raise TrainError(msg)
        if isinstance(tokenizer, ByteTokenizer):
            msg = ("--data hf:...: give the model's tokenizer with --tokenizer (a Hub name or "
                   "a tokenizer.json); the byte tokenizer is for small local experiments")
            raise TrainError(msg)
        self.name, self.tokenizer, self.text_field = ref, tokenizer, text_field
        self._args = (name, config or None, split or "train")

    def documents(self) -> Iterator[np.ndarray]:
        datasets = require("datasets")
        name, config, split = self._args
        try:
            ds = datasets.load_dataset(name, config, split=split, streaming=True)
        except Exception as exc:
            msg = f"--data {self.name!r}: cannot stream the dataset ({exc})"
            raise TrainError(msg) from None
        eos = np.array([self.tokenizer.eos_id], dtype=np.int64)
        for row in ds:
            text = row.get(self.text_field)
            if not isinstance(text, str):
                msg = (f"--data {self.name!r}: rows have no string field {self.text_field!r} "
                       f"(--text-field); fields: {', '.join(map(str, row))}")
                raise TrainError(msg)
            yield np.concatenate([self.tokenizer.encode(text), eos])


class SyntheticSource:
    """Counting sequences (token t is followed by t + 1) from random starts: a model learns
    them in a few steps. For smoke tests only (``--data synthetic``)."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        self.name, self.vocab_size, self.seed = "synthetic", vocab_size, seed


def open_source(ref: str, *, tokenizer: Tokenizer, vocab_size: int, seed: int,
                text_field: str = "text", token_dtype: str = "uint16") -> Any:
    """The source ``--data`` names (see the module's docstring)."""
    if ref == "synthetic":
        return SyntheticSource(vocab_size, seed)
    if ref.startswith("hf:"):
        return HFDatasetSource(ref, tokenizer, text_field)
    path = Path(ref)
    if not path.exists():
        msg = (f"--data: {ref!r} is not a file or folder; expected a text/jsonl file or folder, "
               "a .npy/.bin token file, hf:NAME[:CONFIG][@SPLIT], or synthetic")
        raise TrainError(msg)
    if path.is_file() and path.suffix in TOKEN_SUFFIXES:
        return TokenFileSource(path, token_dtype)
    if path.is_dir() or path.suffix in TEXT_SUFFIXES + JSONL_SUFFIXES:
        return TextSource(path, tokenizer, text_field)
    msg = (f"--data: {ref!r}: unknown kind of file (by its suffix); expected "
           f"{', '.join(TEXT_SUFFIXES + JSONL_SUFFIXES + TOKEN_SUFFIXES)}")
    raise TrainError(msg)


class Batches:
    """The global batch of each step from a source, packed into sequences.

    ``position`` is the number of sequences served so far; a run resumed from a checkpoint
    starts at the position the checkpoint stored (``skip``)."""

    def __init__(self, source: Any, *, seq_len: int, global_batch: int, vocab_size: int,
                 skip: int = 0) -> None:
        self.source, self.seq_len, self.global_batch = source, seq_len, global_batch
        self.vocab_size = vocab_size
        self.position = 0
        self.epoch = 0
        self._buf = np.zeros(0, dtype=np.int64)
        self._docs: Iterator[np.ndarray] | None = None
        self._got = 0
        if isinstance(source, TokenFileSource):
            n = source.tokens.size
            if n < seq_len + 1:
                msg = (f"--data: {source.name!r} holds {n} tokens, fewer than one sequence "
                       f"of {seq_len} + 1")
                raise TrainError(msg)
            self._per_epoch = (n - 1) // seq_len
        if skip:
            self.skip(skip)

    def skip(self, sequences: int) -> None:
        """Move past ``sequences`` sequences (a resumed run's data position)."""
        if isinstance(self.source, (TokenFileSource, SyntheticSource)):
            self.position += sequences
            return
        for _ in range(sequences):
            self._next_sequence()

    def _next_sequence(self) -> np.ndarray:
        k = self.position
        self.position += 1
        s = self.seq_len
        if isinstance(self.source, SyntheticSource):
            rng = np.random.default_rng([self.source.seed, k])
            start = int(rng.integers(0, self.vocab_size))
            return (start + np.arange(s + 1, dtype=np.int64)) % self.vocab_size
        if isinstance(self.source, TokenFileSource):
            self.epoch, i = divmod(k, self._per_epoch)
            seq = np.asarray(self.source.tokens[i * s:i * s + s + 1], dtype=np.int64)
            return self._checked(seq)
        while self._buf.size < s + 1:
            self._buf = np.concatenate([self._buf, self._next_document()])
        seq, self._buf = self._buf[:s + 1], self._buf[s:]
        return self._checked(seq)

    def _next_document(self) -> np.ndarray:
        empty_passes = 0
        while True:
            if self._docs is None:
                self._docs = iter(self.source.documents())
                self._got = 0
            doc: np.ndarray | None = next(self._docs, None)
            if doc is not None:
                self._got += doc.size
                return doc
            if self._got == 0:
                empty_passes += 1
                if empty_passes > 1:
                    msg = f"--data: {self.source.name!r} holds no text"
                    raise TrainError(msg)
            self._docs = None
            self.epoch += 1

    def _checked(self, seq: np.ndarray) -> np.ndarray:
        top = int(seq.max()) if seq.size else 0
        low = int(seq.min()) if seq.size else 0
        if top >= self.vocab_size or low < 0:
            bad = top if top >= self.vocab_size else low
            msg = (f"--data: {self.source.name!r} has token id {bad}, outside the model's "
                   f"vocabulary of {self.vocab_size} (wrong tokenizer or --token-dtype?)")
            raise TrainError(msg)
        return seq

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        """The next global batch: ``(inputs, targets)``, each ``[global_batch, seq_len]``."""
        seqs = np.stack([self._next_sequence() for _ in range(self.global_batch)])
        return seqs[:, :-1], seqs[:, 1:]


def check_tokenizer(tokenizer: Tokenizer, vocab_size: int, model: str) -> None:
    """Refuse a tokenizer whose ids do not fit the model's embedding."""
    if tokenizer.vocab_size > vocab_size:
        msg = (f"--tokenizer {tokenizer.name!r} has {tokenizer.vocab_size} ids but the model "
               f"{model!r} has a vocabulary of {vocab_size}: use the model's own tokenizer "
               "(or a model whose vocab_size holds it)")
        raise TrainError(msg)


def describe(source: Any) -> str:
    kind = type(source).__name__.removesuffix("Source").lower()
    return f"{kind} {source.name}" if kind != "synthetic" else "synthetic tokens (smoke test)"

