"""The demo model: a tiny random Qwen2 with a BPE tokenizer trained on the demo data.

It exercises the real loading code (`from_pretrained`, chat template, LoRA targets) with no
download. Built once per data file and builder version, cached under `cache_dir()/models/`.

This module also holds the guarded reader of a user's data file (`check_data_file`,
`read_head`): it sits at the bottom layer, so preflight, the agent and the trainer share it.

torch/transformers/tokenizers are imported inside functions: the CLI imports this module to
resolve `builtin:` model paths and must stay light.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import random
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tunedeck.core.paths import cache_dir

BUILTIN_TINY = "builtin:tiny-qwen2"
# Bump when anything below changes what gets built, so old caches are not reused.
BUILDER_VERSION = "1"
VOCAB_SIZE = 1024
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Sized so one optimizer step on 2 CPU ranks (batch 4, 128 tokens) takes a few tens of ms.
MODEL_SHAPE = dict(
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
)
MAX_POSITIONS = 4096  # its config's max_position_embeddings (the estimate reads it too)
# ~1/sqrt(hidden) instead of Qwen2's 0.02: LoRA on frozen random weights needs features large
# enough to steer the (tied, frozen) output head; at 0.02 the demo loss stalls near ln(vocab).
INIT_STD = 0.1
SEED = 1234
# The demo tokenizer is trained on at most this much of the data file (its first lines), and
# the cache is named by the same bytes: a dataset of any size (or /dev/zero's worth of bytes)
# costs the build and every lookup at most this much memory and reading.
DEMO_DATA_MAX_BYTES = 16 << 20
# A read of user data that has not finished by then is given up (a hung network mount).
DATA_READ_TIMEOUT_S = 60.0
_CHUNK = 1 << 20


# -- reading a user's data file safely --------------------------------------------------------
# data.path is anyone's string: a FIFO blocks whoever opens it for reading, /dev/zero and
# /dev/urandom never end, a directory or a socket cannot be read as rows. Every reader of the
# data in preflight and in the agent's preparation stats it first (opening a FIFO already
# blocks), opens it O_NONBLOCK as a second guard, and reads a bounded number of bytes within a
# deadline. The trainer (inside the ranks) refuses the same files by name before reading.


class DataFileError(OSError):
    """A data file that cannot be read safely: not a regular file, or too slow to read. An
    OSError with `filename` set, so whoever maps OSErrors about the data file (the agent's
    preparation finding) names it; `str()` is the sentence for people."""

    def __init__(self, path: str | Path, message: str, code: int = errno.EINVAL):
        super().__init__(code, message, str(path))
        self.message = message

    def __str__(self) -> str:
        return self.message


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words (the stat mode of a regular file gives "")."""
    if stat.S_ISREG(mode):
        return ""
    for test, words in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return words
    return "not a regular file"


def _not_regular(path: str | Path, kind: str, what: str) -> DataFileError:
    tail = "" if kind == "not a regular file" else ", not a regular file"
    return DataFileError(path, f"{what} {path} is {kind}{tail}")


def check_data_file(path: str | Path, what: str = "data.path") -> os.stat_result:
    """The file's stat when it is a regular file (symlinks followed); DataFileError naming
    what it is otherwise, without opening it. FileNotFoundError (etc.) as os.stat raises."""
    st = os.stat(path)
    kind = file_kind(st.st_mode)
    if kind:
        raise _not_regular(path, kind, what)
    return st


@dataclass
class Head:
    """The first bytes of a data file: `data` (whole lines only when cut), `size` (the
    file's), `cut` (the file holds more than was read)."""

    data: bytes
    size: int
    cut: bool


def read_head(
    path: str | Path,
    max_bytes: int,
    *,
    timeout_s: float = DATA_READ_TIMEOUT_S,
    what: str = "data.path",
) -> Head:
    """At most `max_bytes` of a regular file, within `timeout_s`. When the file is longer,
    the last partial line is left out (a line longer than `max_bytes` leaves nothing)."""
    check_data_file(path, what)
    deadline = time.monotonic() + timeout_s
    # O_NONBLOCK: should the path have become a FIFO since the stat, open does not wait for a
    # writer (it changes nothing for a regular file)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        kind = file_kind(st.st_mode)
        if kind:
            raise _not_regular(path, kind, what)
        parts, got = [], 0
        while got < max_bytes:
            if time.monotonic() > deadline:
                raise DataFileError(
                    path,
                    f"reading {what} {path} took longer than "
                    f"{timeout_s:g} s (read {got >> 20} MiB): a slow or hung "
                    f"file system?",
                    errno.ETIMEDOUT,
                )
            b = os.read(fd, min(_CHUNK, max_bytes - got))
            if not b:
                break
            parts.append(b)
            got += len(b)
        data = b"".join(parts)
        cut = got >= max_bytes and (st.st_size > got or bool(os.read(fd, 1)))
    finally:
        os.close(fd)
    if cut:
        data = data[: data.rfind(b"\n") + 1]
    return Head(data, max(st.st_size, got), cut)


def demo_data(data_path: str | Path) -> bytes:
    """The bytes the demo model is built from (and named by): the data file's first
    DEMO_DATA_MAX_BYTES, whole lines."""
    return read_head(data_path, DEMO_DATA_MAX_BYTES).data


def _model_dir(data: bytes, cache: Path | None) -> Path:
    digest = hashlib.sha256(data + b"\0builder=" + BUILDER_VERSION.encode()).hexdigest()[:16]
    return (cache or cache_dir()) / "models" / f"tiny-qwen2-{digest}"


def tiny_model_dir(data_path: str | Path, cache: Path | None = None) -> Path:
    """Where the demo model built from this data file lives: named by the hash of the bytes
    it is built from (`demo_data`), so new data means a new model (raises OSError when the
    file cannot be read, DataFileError when it is not a regular file)."""
    return _model_dir(demo_data(data_path), cache)


def ensure_tiny_model(data_path: str | Path, cache: Path | None = None) -> Path:
    """Folder with the tiny model and tokenizer for `data_path`; builds it on first use.

    Safe for concurrent callers (ranks of one run, several runs): one builds under an
    exclusive lock into a temp folder and renames it into place; the others wait on the lock
    and find the finished folder.

    Call it BEFORE torch.distributed.init_process_group: transformers 5's save_pretrained
    silently writes no weights on ranks != 0 once a process group exists.

    Reads at most DEMO_DATA_MAX_BYTES of the data, once, within DATA_READ_TIMEOUT_S; a path
    that is not a regular file (a FIFO, a device, a socket, a folder) raises DataFileError
    naming it before anything is opened.
    """
    data = demo_data(data_path)
    final = _model_dir(data, cache)
    models, digest = final.parent, final.name.removeprefix("tiny-qwen2-")
    if (final / "config.json").exists():
        return final
    models.mkdir(parents=True, exist_ok=True)
    with open(models / f".tiny-qwen2-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "config.json").exists():  # someone else built it while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".tiny-qwen2-{digest}.", dir=models))
        try:
            _build(data, tmp)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def load_tokenizer(path: str | Path):
    """Load the demo (or any) tokenizer.

    PreTrainedTokenizerFast reads tokenizer.json as saved. AutoTokenizer would map
    model_type qwen2 to Qwen2Tokenizer, which in transformers 5 may rebuild the tokenizer with
    Qwen's own pre-tokenizer from vocab/merges; that can split text differently from how our
    BPE was trained. For real models use AutoTokenizer (see tunedeck.core.train.model).
    """
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path))


def _texts(data: bytes) -> list[str]:
    out = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            obj = json.loads(line)
            out.extend(str(m.get("content", "")) for m in obj.get("messages", []))
        except (ValueError, AttributeError, TypeError):
            continue  # the trainer reports bad lines with file:line; the tokenizer just skips
    return out


def _filler_words(n: int) -> list[str]:
    """Made-up words, always the same, so a small corpus still fills the vocabulary."""
    rng = random.Random(SEED)
    cons, vows = "bcdfghjklmnprstvwz", "aeiou"
    return [
        "".join(rng.choice(cons) + rng.choice(vows) for _ in range(rng.randint(2, 4)))
        for _ in range(n)
    ]


def _train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def train(corpus: list[str]) -> Tokenizer:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=SPECIALS,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train_from_iterator(corpus, trainer=trainer)
        return tok

    tok = train(texts)
    if tok.get_vocab_size() < VOCAB_SIZE:
        # Filler words occur once each, so real-data merges (more frequent) still come first.
        tok = train(texts + [" ".join(_filler_words(20000))])
    return tok


def _build(data: bytes, out: Path) -> None:
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar in rank logs
    try:
        _build_into(data, out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _build_into(data: bytes, out: Path) -> None:
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    raw = _train_tokenizer(_texts(data))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=SPECIALS[1:2],
        model_max_length=4096,
        chat_template=CHAT_TEMPLATE,
    )
    tokenizer.save_pretrained(out)

    vocab = len(tokenizer)
    config = Qwen2Config(
        vocab_size=vocab,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=INIT_STD,
        **MODEL_SHAPE,
    )
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    missing = [f for f in ("config.json", "model.safetensors") if not (out / f).exists()]
    if missing:
        raise RuntimeError(
            f"building the demo model wrote no {', '.join(missing)}; if "
            "torch.distributed is initialized, build it before (transformers "
            "saves only on rank 0)"
        )
