"""A causal LM's shape, read from its `config.json` alone (no weights, no transformers).

Qwen2/Llama/Mistral-style decoders: token embedding, L layers of (GQA attention + gated MLP),
final norm, output head (tied or not). Parameter counts follow from the shape exactly enough
for memory planning (Qwen2.5-7B: 7,615,616,512 counted by PyTorch, the same here).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ArchError(ValueError):
    pass


@dataclass(frozen=True)
class ModelArch:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False
    head_dim: int = 0  # 0 = hidden // heads
    qkv_bias: bool = False
    model_type: str = "llama"
    max_len: int = 0  # longest sequence the config allows (0 = it names none)

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.hd

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.hd

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of every linear in one decoder layer."""
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_params(self) -> int:
        n = sum(a * b for a, b in self.linear_shapes().values())
        if self.qkv_bias:
            n += self.q_dim + 2 * self.kv_dim
        return n + 2 * self.hidden  # two RMSNorm weights

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    def total_params(self) -> int:
        return (
            self.embedding_params()
            + self.layers * self.layer_params()
            + self.hidden
            + self.head_params()
        )

    def linear_params(self) -> int:
        """Weights of the decoder linears (what QLoRA quantizes)."""
        return self.layers * sum(a * b for a, b in self.linear_shapes().values())

    def lora_params(self, rank: int, targets: list[str] | tuple[str, ...]) -> int:
        mods = self.lora_modules(targets)
        shapes = self.linear_shapes()
        return self.layers * sum(rank * (shapes[m][0] + shapes[m][1]) for m in mods)

    @staticmethod
    def lora_modules(targets) -> list[str]:
        """Which layer linears a target list adapts ("all-linear" = all but the head)."""
        targets = list(targets or [])
        if not targets or "all-linear" in targets or "all_linear" in targets:
            return list(LINEAR_NAMES)
        return [
            m for m in LINEAR_NAMES if any(t == m or t.endswith("." + m) or m in t for t in targets)
        ]

    def to_json(self) -> dict:
        d = asdict(self)
        d["params"] = self.total_params()
        return d


def _get(cfg: dict, *names, default=None):
    for n in names:
        if n in cfg and cfg[n] is not None:
            return cfg[n]
    return default


def arch_from_config(cfg: dict, source: str = "config.json") -> ModelArch:
    """Shape from a HF config dict. Multimodal configs keep the LM under `text_config`."""
    if isinstance(cfg.get("text_config"), dict) and "hidden_size" not in cfg:
        cfg = {
            **cfg["text_config"],
            "tie_word_embeddings": cfg.get(
                "tie_word_embeddings", cfg["text_config"].get("tie_word_embeddings")
            ),
        }
    hidden = _get(cfg, "hidden_size", "n_embd", "d_model")
    layers = _get(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = _get(cfg, "num_attention_heads", "n_head")
    vocab = _get(cfg, "vocab_size")
    missing = [
        k
        for k, v in (
            ("hidden_size", hidden),
            ("num_hidden_layers", layers),
            ("num_attention_heads", heads),
            ("vocab_size", vocab),
        )
        if not v
    ]
    if missing:
        raise ArchError(f"{source}: missing {', '.join(missing)}; cannot size the model")
    mtype = str(cfg.get("model_type", "llama"))
    return ModelArch(
        hidden=int(hidden),
        layers=int(layers),
        heads=int(heads),
        kv_heads=int(_get(cfg, "num_key_value_heads", default=heads)),
        intermediate=int(_get(cfg, "intermediate_size", "n_inner", default=4 * hidden)),
        vocab=int(vocab),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        head_dim=int(_get(cfg, "head_dim", default=0) or 0),
        qkv_bias=bool(_get(cfg, "attention_bias", default=mtype in ("qwen2",))),
        model_type=mtype,
        max_len=max_model_len(cfg),
    )


# the config keys a model's length limit goes by, as ms-swift reads them (the smallest wins)
MAX_LEN_KEYS = (
    "seq_length",
    "max_position_embeddings",
    "n_positions",
    "model_max_length",
    "seq_len",
    "max_seq_len",
    "max_sequence_length",
    "max_seq_length",
)


def max_model_len(cfg: dict) -> int:
    """The longest sequence a config allows: what ms-swift truncates at when --max_length is
    not given (0 when the config names no limit)."""
    found = [
        int(v)
        for k in MAX_LEN_KEYS
        if isinstance(v := cfg.get(k), (int, float)) and not isinstance(v, bool) and v > 0
    ]
    return min(found, default=0)


def load_arch(path: str | Path) -> ModelArch:
    """From a model folder (or a config.json file)."""
    p = Path(path).expanduser()
    cfg_path = p / "config.json" if p.is_dir() else p
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ArchError(f"{cfg_path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise ArchError(f"{cfg_path}: not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ArchError(f"{cfg_path}: expected a JSON object")
    return arch_from_config(cfg, str(cfg_path))


# Reference shapes (public Qwen2.5 configs) for the calibration bench, tests and the advisor's
# examples; any other model is read from its own config.json.
QWEN25 = {
    "0.5b": dict(
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    ),
    "1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    ),
    "7b": dict(
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
    ),
}
