"""The run's inputs: dataset rows and the model folder (or hub id)."""

from __future__ import annotations

import functools
import io
import json
import os
import re
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

from tunedeck.core.backend_traits import traits_of
from tunedeck.core.preflight.base import CheckResult, Context, result

ROLES = ("system", "user", "assistant", "tool")
MAX_BAD_SHOWN = 5
TOKENIZE_ROWS = 10_000  # the token-length report's sample (core/estimate/lengths.py)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "tiktoken.model",
    "qwen.tiktoken",
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
# How much of a dataset preflight reads: the checklist runs on login nodes and in the form,
# so a 100 GB dataset (or /dev/zero behind a symlink) costs it at most this much memory and
# time. The trainer still reads and validates every row at launch.
SCAN_MAX_BYTES = 64 << 20
SCAN_MAX_LINES = 200_000
SCAN_TIMEOUT_S = 20.0


def _row_problem(obj, fmt: str) -> str | None:
    if not isinstance(obj, dict):
        return "expected a JSON object"
    if fmt == "messages":
        msgs = obj.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return '"messages" must be a non-empty list'
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ROLES:
                return f"messages[{i}].role must be one of {', '.join(ROLES)}"
            if not isinstance(m.get("content"), str):
                return f"messages[{i}].content must be a string"
        if not any(m["role"] == "assistant" for m in msgs):
            return "no assistant message, nothing to learn from"
    elif fmt in ("query_response", "self_cognition"):
        for k in ("query", "response"):
            if not isinstance(obj.get(k), str):
                return f'"{k}" must be a string'
    elif fmt == "alpaca":
        for k in ("instruction", "output"):
            if not isinstance(obj.get(k), str):
                return f'"{k}" must be a string'
    return None


def _detect(obj) -> str:
    if isinstance(obj, dict):
        if "messages" in obj:
            return "messages"
        if "instruction" in obj:
            return "alpaca"
        if "query" in obj:
            return "query_response"
    return "messages"


def _texts(obj, fmt: str) -> list[str]:
    if fmt == "messages":
        return [m["content"] for m in obj["messages"]]
    if fmt == "alpaca":
        return [obj["instruction"], obj.get("input") or "", obj["output"]]
    return [obj.get("system") or "", obj["query"], obj["response"]]


class NotUtf8(ValueError):
    def __init__(self, line: int, byte: int):
        super().__init__(f"not UTF-8 text on line {line} (byte {byte})")
        self.line, self.byte = line, byte


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def scan_dataset(path: Path, fmt: str, what: str = "data.path") -> dict:
    """Rows, bad rows (file:line: why) and the first good rows' texts, of the file's first
    SCAN_MAX_BYTES / SCAN_MAX_LINES lines, read and parsed within SCAN_TIMEOUT_S; `partial`
    says how much that was when the file holds more ("" when all of it was read).

    A path that is not a regular file raises DataFileError naming what it is, before
    anything is opened (a FIFO would block the open, a device never ends); a line that is not
    UTF-8 raises NotUtf8."""
    from tunedeck.core.demo import read_head

    deadline = time.monotonic() + SCAN_TIMEOUT_S
    head = read_head(path, SCAN_MAX_BYTES, timeout_s=SCAN_TIMEOUT_S, what=what)
    rows, bad, samples, detected = 0, [], [], fmt if fmt != "auto" else ""
    partial = f"the first {_size(SCAN_MAX_BYTES)} of {_size(head.size)}" if head.cut else ""
    if head.cut and not head.data:
        bad.append(
            f"{path}:1: no line break in the first {_size(SCAN_MAX_BYTES)} of "
            f"{_size(head.size)}: not a JSONL file (one JSON object per line)"
        )
    offset = 0
    for no, raw in enumerate(io.BytesIO(head.data), start=1):
        if no > SCAN_MAX_LINES:
            partial = f"the first {SCAN_MAX_LINES} lines of {_size(head.size)}"
            break
        if no % 1024 == 0 and time.monotonic() > deadline:
            partial = f"the first {no - 1} lines ({SCAN_TIMEOUT_S:g} s)"
            break
        try:
            line = raw.decode("utf-8", errors="strict")
        except UnicodeDecodeError as e:
            raise NotUtf8(no, offset + e.start) from None
        offset += len(raw)
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            bad.append(f"{path}:{no}: not valid JSON: {e.msg} (column {e.colno})")
            continue
        detected = detected or _detect(obj)
        why = _row_problem(obj, detected)
        if why:
            bad.append(f"{path}:{no}: {why}")
            continue
        rows += 1
        if len(samples) < TOKENIZE_ROWS:
            samples.append(_texts(obj, detected))
    return {
        "rows": rows,
        "bad": bad,
        "samples": samples,
        "format": detected or "messages",
        "partial": partial,
    }


def _tokenizer_file(spec) -> Path | None:
    """A tokenizer.json we can load with `tokenizers` alone (no torch, no transformers)."""
    from tunedeck.core.demo import BUILTIN_TINY, tiny_model_dir
    from tunedeck.core.estimate import hub_cache_dir

    mp = spec.model.path
    if mp == BUILTIN_TINY:
        try:
            folder = tiny_model_dir(spec.data.path)
        except OSError:
            return None
    else:
        folder = Path(mp).expanduser()
        if not folder.is_dir():
            folder = hub_cache_dir(mp) or folder
    f = folder / "tokenizer.json"
    return f if f.exists() else None


def _token_stats(ctx: Context, samples: list[list[str]]) -> str:
    """The first row's tokens and the token-length report of the sample
    (core/estimate/lengths.py), with its advice."""
    tf = _tokenizer_file(ctx.spec)
    if tf is None:
        return "tokenizer not available yet (built or downloaded at launch): no token sample"
    from tunedeck.core.estimate.lengths import report, token_lengths

    try:
        lens, exact = token_lengths(str(tf), ["\n".join(t) for t in samples])
        from tokenizers import Tokenizer

        first = Tokenizer.from_file(str(tf)).encode("\n".join(samples[0]))
    except Exception as e:  # noqa: BLE001 - any tokenizer failure only loses the sample
        return f"could not load {tf}: {e}"
    shown = " ".join(first.tokens[:12])
    rep = report(lens, ctx.spec.data.max_length, ctx.spec.train.per_device_batch_size, exact=exact)
    advice = rep.advice()
    return (
        f"row 1 → {len(first.ids)} tokens [{shown}{' …' if len(first.ids) > 12 else ''}]; "
        + rep.summary()
        + (f"; consider {advice}" if advice else "")
    )


@functools.lru_cache(maxsize=8)
def _sample_lengths(
    path: str, size: int, mtime_ns: int, fmt: str, tokenizer: str, tok_mtime_ns: int
) -> tuple[list[int], int]:
    """Token lengths of the file's bounded sample; the file's and tokenizer's size/mtime in the
    key, so an edit of either is measured again and a form edit of anything else is not."""
    from tunedeck.core.estimate.lengths import token_lengths

    samples = scan_dataset(Path(path), fmt)["samples"]
    if not samples:
        raise ValueError(f"{path}: no usable rows")
    return token_lengths(tokenizer, ["\n".join(t) for t in samples])


def length_report(spec):
    """(LengthReport, "") for the spec's data.path sample with its model's tokenizer and its
    data.max_length and batch, or (None, why there is none). For the compose form: the sample
    is tokenized once per file and tokenizer (cached), so edits of other keys cost nothing."""
    from tunedeck.core.estimate.lengths import report

    d = spec.data
    if not d.path:
        return None, "no data.path (the backend brings its own dataset)"
    path = Path(d.path).expanduser()
    if not path.is_file():
        return None, f"data.path {path}: no such file"
    tf = _tokenizer_file(spec)
    if tf is None:
        return None, "the model's tokenizer is not here yet (built or downloaded at launch)"
    try:
        st, tst = path.stat(), tf.stat()
        lens, exact = _sample_lengths(
            str(path), st.st_size, st.st_mtime_ns, d.format, str(tf), tst.st_mtime_ns
        )
    except FileNotFoundError:
        return None, f"data.path {path}: no such file"
    except Exception as e:  # noqa: BLE001 - preflight names the file's problem in full
        return None, f"data.path {path}: {e}"
    return report(lens, d.max_length, spec.train.per_device_batch_size, exact=exact), ""


def check_dataset(ctx: Context) -> CheckResult:
    id, title = "data.rows", "Dataset readable and parseable"
    d = ctx.spec.data
    if not d.path:
        return result(id, title, "skip", "no data.path (the backend brings its own dataset)")
    paths = [Path(d.path).expanduser()] + ([Path(d.val_path).expanduser()] if d.val_path else [])
    details, bad_all, fmt = [], [], d.format
    first = None
    from tunedeck.core.demo import DataFileError

    for p, key in zip(paths, ("data.path", "data.val_path")):
        if (
            not p.exists()
            and traits_of(ctx.spec.backend).hub_datasets
            and "/" in str(d.path)
            and not str(d.path).startswith(("/", "."))
        ):
            return result(id, title, "skip", f"{d.path}: not a local file (ms-swift dataset id)")
        try:
            scan = scan_dataset(p, fmt, key)
        except FileNotFoundError:
            return result(
                id,
                title,
                "fail",
                f"{p}: no such file",
                f"fix {key} (relative paths start at the spec file's folder)",
            )
        except NotUtf8 as e:
            return result(
                id,
                title,
                "fail",
                f"{p}: not UTF-8 text on line {e.line} (near byte {e.byte})",
                "convert the file to UTF-8 JSONL",
            )
        except DataFileError as e:
            # a FIFO, a device, a socket, a folder: named without being opened or read
            return result(
                id,
                title,
                "fail",
                str(e),
                f"point {key} at a regular JSONL file (copy the data into a file; "
                "a pipe, a device or a folder cannot be read as a dataset)",
            )
        except OSError as e:
            return result(
                id,
                title,
                "fail",
                f"{p}: cannot read: {e.strerror}",
                "check the path and its permissions",
            )
        fmt = scan["format"]
        first = first or scan
        bad_all += scan["bad"]
        details.append(
            f"{p.name}: {scan['rows']} rows ({scan['format']})"
            + (f" in {scan['partial']} (the rest is read at launch)" if scan["partial"] else "")
        )
    if first and first["rows"] == 0:
        return result(
            id,
            title,
            "fail",
            f"{paths[0]}: no usable rows" + (f"; {bad_all[0]}" if bad_all else ""),
            "check the file's format",
        )
    detail = "; ".join(details)
    if bad_all:
        listed = "\n".join(bad_all[:MAX_BAD_SHOWN])
        more = (
            f"\n… and {len(bad_all) - MAX_BAD_SHOWN} more" if len(bad_all) > MAX_BAD_SHOWN else ""
        )
        status = "warn" if d.skip_bad_rows else "fail"
        return result(
            id,
            title,
            status,
            f"{detail}; {len(bad_all)} bad row(s):\n{listed}{more}",
            "fix or delete those lines"
            + ("" if d.skip_bad_rows else ", or set data.skip_bad_rows = true"),
            None
            if d.skip_bad_rows or not traits_of(ctx.spec.backend).skips_bad_rows
            else {"data.skip_bad_rows": True},
        )
    return result(id, title, "pass", f"{detail}; {_token_stats(ctx, first['samples'])}")


def _hub_reachable() -> bool:
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=2.0):
            return True
    except OSError:
        return False


def check_model(ctx: Context) -> CheckResult:
    from tunedeck.core.demo import BUILTIN_TINY
    from tunedeck.core.estimate import hub_cache_dir

    id, title = "model.files", "Model config, tokenizer and weights present"
    mp = ctx.spec.model.path
    if mp == BUILTIN_TINY:
        return result(id, title, "pass", "built-in tiny Qwen2, built in code on first use")
    if mp.startswith("builtin:"):
        return result(
            id,
            title,
            "fail",
            f"model.path {mp!r}: unknown builtin model",
            f"use {BUILTIN_TINY} or a model folder",
        )
    p = Path(mp).expanduser()
    if p.is_dir():
        return _check_folder(id, title, p)
    if p.exists():
        return result(
            id,
            title,
            "fail",
            f"model.path {mp}: a file, not a model folder",
            "point model.path at the folder holding config.json",
        )
    looks_local = mp.startswith(("/", ".", "~")) or mp.count("/") != 1
    if looks_local:
        return result(
            id,
            title,
            "fail",
            f"model.path {mp}: no such folder",
            "fix model.path (relative paths start at the spec file's folder)",
        )
    cached = hub_cache_dir(mp)
    if cached:
        r = _check_folder(id, title, cached)
        r.detail = f"hub id {mp} cached at {cached}; " + r.detail
        return r
    offline = any(
        os.environ.get(k, "") not in ("", "0") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    if offline or not _hub_reachable():
        why = "HF_HUB_OFFLINE is set" if offline else "the hub is unreachable from this node"
        return result(
            id,
            title,
            "fail",
            f"hub id {mp} is not in the local cache and {why}",
            f"download it where there is network (huggingface-cli download {mp} "
            "--local-dir DIR) and set model.path to DIR",
        )
    return result(
        id,
        title,
        "warn",
        f"hub id {mp} is not cached: every node downloads it at launch",
        f"pre-download it (huggingface-cli download {mp})",
    )


def _check_folder(id: str, title: str, p: Path) -> CheckResult:
    cfg = p / "config.json"
    if not cfg.exists():
        return result(
            id,
            title,
            "fail",
            f"{cfg}: missing",
            "a model folder needs config.json (save_pretrained writes it)",
        )
    try:
        conf = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return result(id, title, "fail", f"{cfg}: unreadable: {e}", "re-download the model")
    toks = [n for n in TOKENIZER_FILES if (p / n).exists()]
    if not toks:
        return result(
            id,
            title,
            "fail",
            f"{p}: no tokenizer ({', '.join(TOKENIZER_FILES)})",
            "copy the tokenizer files next to config.json",
        )
    index = next(iter(p.glob("*.index.json")), None)
    if index:
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError) as e:
            return result(id, title, "fail", f"{index}: unreadable: {e}", "re-download it")
        missing = sorted(s for s in shards if not (p / s).exists())
        if missing:
            return result(
                id,
                title,
                "fail",
                f"{p}: {len(missing)} weight shard(s) missing: " + ", ".join(missing[:3]),
                "finish the download",
            )
    weights = [f for f in p.iterdir() if f.suffix in WEIGHT_SUFFIXES]
    if not weights:
        return result(
            id,
            title,
            "fail",
            f"{p}: no weights (*.safetensors / *.bin)",
            "finish the download or point model.path at the full folder",
        )
    size = sum(f.stat().st_size for f in weights) / 2**30
    return result(
        id,
        title,
        "pass",
        f"{conf.get('model_type', '?')} config, {toks[0]}, "
        f"{len(weights)} weight file(s), {size:.1f} GiB",
    )


_SAMPLE_SUFFIX = re.compile(r"#\d+$")
_DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt", ".arrow")


def _local_entry(entry: str) -> Path | None:
    """The local path an ms-swift --dataset entry names (its `#N` sample suffix cut), or None
    for a hub id (`org/name`, `org/name:subset`)."""
    raw = _SAMPLE_SUFFIX.sub("", entry.strip())
    p = Path(raw).expanduser()
    if raw.startswith(("/", ".", "~")) or p.exists() or raw.lower().endswith(_DATA_SUFFIXES):
        return p
    return None


def check_dataset_entries(ctx: Context) -> CheckResult:
    """ms-swift's --dataset / --val_dataset entries (data.datasets, data.val_datasets): local
    files and folders checked like data.path (exists, readable, a bounded sample parses into
    a known format); hub ids listed as not checked offline."""
    id, title = "data.datasets", "ms-swift datasets (local entries)"
    d = ctx.spec.data
    entries = [("data.datasets", e) for e in d.datasets] + [
        ("data.val_datasets", e) for e in d.val_datasets
    ]
    if not entries:
        return result(id, title, "skip", "no data.datasets entries")
    ok, hub = [], []
    for key, entry in entries:
        p = _local_entry(entry)
        if p is None:
            hub.append(entry)
            continue
        if not p.exists():
            return result(
                id,
                title,
                "fail",
                f"{key}: {entry}: no such file or folder",
                f"fix the entry in {key} (relative paths start at the spec file's folder)",
            )
        files = (
            sorted(f for f in p.rglob("*") if f.suffix in (".jsonl", ".json"))
            if p.is_dir()
            else [p]
        )
        if not files:
            return result(
                id,
                title,
                "fail",
                f"{key}: {entry}: a folder with no .jsonl/.json file",
                "point the entry at the data file, or put the data in the folder",
            )
        try:
            scan = scan_dataset(files[0], "auto", key)
        except (OSError, NotUtf8, ValueError) as e:
            return result(
                id,
                title,
                "fail",
                f"{key}: {files[0]}: cannot be read as a dataset: {e}",
                "convert it to UTF-8 JSONL in a known format",
            )
        if scan["rows"] == 0:
            why = f"; {scan['bad'][0]}" if scan["bad"] else ""
            return result(
                id,
                title,
                "fail",
                f"{key}: {files[0]}: no usable rows{why}",
                "check the file's format (messages, query/response, alpaca)",
            )
        ok.append(f"{entry}: {scan['rows']} rows ({scan['format']})")
    detail = "; ".join(ok + [f"{h}: a hub id, not checked offline" for h in hub])
    return result(id, title, "pass", detail)


CHECKS = [check_dataset, check_dataset_entries, check_model]
