"""A user's own HF Trainer script, as tunedeck's script backend would run it: it knows nothing
of tunedeck but the variables a script may read (TUNEDECK_OUTPUT_DIR, and on a restart
TUNEDECK_RESUME_FROM). It fine-tunes the tiny demo model (built with tunedeck.core.demo) with
LoRA on CPU or GPU. --crash_at_step N ends rank 1 after step N on the first attempt (restart
tests).

    torchrun --nproc_per_node 2 tests/scripts/hf_trainer_script.py --data presets/data/demo_chat.jsonl \
        --max_steps 5 --logging_steps 1 --output_dir /tmp/out
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--data",
        default=str(Path(__file__).resolve().parents[2] / "presets" / "data" / "demo_chat.jsonl"),
    )
    ap.add_argument("--max_steps", type=int, default=5)
    ap.add_argument("--logging_steps", type=int, default=1)
    ap.add_argument("--max_length", type=int, default=64)
    ap.add_argument("--save_steps", type=int, default=0)
    ap.add_argument("--crash_at_step", type=int, default=0)
    ap.add_argument("--output_dir", default=os.environ.get("TUNEDECK_OUTPUT_DIR", "hf_out"))
    args = ap.parse_args()

    from tunedeck.core.demo import ensure_tiny_model, load_tokenizer

    # before any process group exists (transformers saves weights on rank 0 only after it)
    model_dir = ensure_tiny_model(args.data)

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForCausalLM,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    class CrashOnce(TrainerCallback):
        def on_step_end(self, targs, state, control, **kw):
            if (
                state.global_step == args.crash_at_step
                and os.environ.get("RANK") == "1"
                and os.environ.get("TUNEDECK_ATTEMPT") == "0"
            ):
                print(f"rank 1 crashes on purpose at step {state.global_step}", flush=True)
                os._exit(3)

    tok = load_tokenizer(model_dir)
    rows = [json.loads(line) for line in open(args.data, encoding="utf-8") if line.strip()]
    texts = [tok.apply_chat_template(r["messages"], tokenize=False) for r in rows]

    class Chats(torch.utils.data.Dataset):
        def __len__(self):
            return len(texts)

        def __getitem__(self, i):
            return tok(texts[i], truncation=True, max_length=args.max_length)

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    cpu = not torch.cuda.is_available()
    targs = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=2,
        learning_rate=5e-3,
        logging_steps=args.logging_steps,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        report_to="none",
        use_cpu=cpu,
        ddp_backend="gloo" if cpu else None,
        ddp_find_unused_parameters=False,
        dataloader_num_workers=0,
        seed=1,
    )
    Trainer(
        model=model,
        args=targs,
        train_dataset=Chats(),
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
        callbacks=[CrashOnce()] if args.crash_at_step else None,
    ).train(resume_from_checkpoint=os.environ.get("TUNEDECK_RESUME_FROM") or None)
    if torch.distributed.is_initialized():
        # as torch asks: left to interpreter exit, gloo's threads can abort a rank
        # (SIGABRT) after training finished, seen once on two hosts
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
