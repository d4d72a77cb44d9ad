"""The demo model: a tiny random Qwen2 with a BPE tokenizer trained on the demo data.

It exercises the real loading code (`from_pretrained`, chat template, LoRA targets) with no
download. Built once per data file and builder version, cached under `cache_dir()/models/`.

torch/transformers/tokenizers are imported inside functions: the CLI imports this module to
resolve `builtin:` model paths and must stay light.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import tempfile
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
MODEL_SHAPE = dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2)
MAX_POSITIONS = 4096     # its config's max_position_embeddings (the estimate reads it too)
# ~1/sqrt(hidden) instead of Qwen2's 0.02: LoRA on frozen random weights needs features large
# enough to steer the (tied, frozen) output head; at 0.02 the demo loss stalls near ln(vocab).
INIT_STD = 0.1
SEED = 1234


def tiny_model_dir(data_path: str | Path, cache: Path | None = None) -> Path:
    """Where the demo model built from this data file lives: named by the file's hash, so
    new data means a new model (raises OSError when the file cannot be read)."""
    data = Path(data_path).read_bytes()
    digest = hashlib.sha256(data + b"\0builder=" + BUILDER_VERSION.encode()).hexdigest()[:16]
    return (cache or cache_dir()) / "models" / f"tiny-qwen2-{digest}"


def ensure_tiny_model(data_path: str | Path, cache: Path | None = None) -> Path:
    """Folder with the tiny model and tokenizer for `data_path`; builds it on first use.

    Safe for concurrent callers (ranks of one run, several runs): one builds under an
    exclusive lock into a temp folder and renames it into place; the others wait on the lock
    and find the finished folder.

    Call it BEFORE torch.distributed.init_process_group: transformers 5's save_pretrained
    silently writes no weights on ranks != 0 once a process group exists.
    """
    final = tiny_model_dir(data_path, cache)
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
            _build(Path(data_path).read_bytes(), tmp)
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
    return ["".join(rng.choice(cons) + rng.choice(vows) for _ in range(rng.randint(2, 4)))
            for _ in range(n)]


def _train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def train(corpus: list[str]) -> Tokenizer:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
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
        tokenizer_object=raw, bos_token=None, eos_token="<|im_end|>",
        pad_token="<|endoftext|>", unk_token=None, additional_special_tokens=SPECIALS[1:2],
        model_max_length=4096, chat_template=CHAT_TEMPLATE)
    tokenizer.save_pretrained(out)

    vocab = len(tokenizer)
    config = Qwen2Config(
        vocab_size=vocab, max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, initializer_range=INIT_STD, **MODEL_SHAPE)
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    missing = [f for f in ("config.json", "model.safetensors") if not (out / f).exists()]
    if missing:
        raise RuntimeError(f"building the demo model wrote no {', '.join(missing)}; if "
                           "torch.distributed is initialized, build it before (transformers "
                           "saves only on rank 0)")
