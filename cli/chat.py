"""`tunedeck chat RUN [--checkpoint N|best|last] [-p PROMPT] [--compare]`: ask a run's model.

With -p the answer streams to stdout, then a line with time to first token and tokens/s
(--compare: the base model's answer first, then the tuned one's). Without -p the TUI's chat
screen opens: a prompt, both answers side by side as they stream."""

from __future__ import annotations

import os
import sys

from tunedeck.cli.common import err

from tunedeck.core.api import Answer, Chat, clean, find_run, pick_checkpoint, print_json


def register(sub) -> None:
    s = sub.add_parser("chat", help="ask a run's trained model (base vs tuned side by side)")
    s.add_argument("run", help="run id, unique prefix, or name")
    s.add_argument("--checkpoint", default="last", metavar="N|best|last")
    s.add_argument("-p", "--prompt", help="answer this prompt and exit (default: the chat screen)")
    s.add_argument("--compare", action="store_true", help="with -p: the base model's answer too")
    s.add_argument("--device", default="auto", help="cpu, cuda:N, or auto (a GPU with room)")
    s.add_argument("--max-new-tokens", type=int, default=96)
    s.add_argument("--json", action="store_true", help="with -p: the answers and timings as JSON")
    s.set_defaults(func=cmd_chat)


def cmd_chat(args) -> int:
    run = find_run(args.run)
    src = pick_checkpoint(run.run_dir, args.checkpoint)
    if args.prompt is None:
        if not sys.stdout.isatty() and not os.environ.get("TUNEDECK_FORCE_TUI"):
            err("the chat screen needs a terminal; -p PROMPT answers on stdout")
            return 2
        from tunedeck.tui.screens.chat import run_chat_app

        return run_chat_app(src, device=args.device, max_new_tokens=args.max_new_tokens)
    chat = Chat(src, device=args.device)
    out = []
    for tuned in (False, True) if args.compare else (True,):
        a = Answer()
        label = f"step {src.step}" if tuned else "base"
        if not args.json:
            print(f"[{label}] ", end="", flush=True)
        for piece in chat.stream(args.prompt, tuned, args.max_new_tokens, a):
            if not args.json:
                sys.stdout.write(clean(piece, multiline=True))
                sys.stdout.flush()
        rate = a.tokens_per_s
        if not args.json:
            print(
                f"\n({a.tokens} tokens, first after {a.ttft_s or 0:.3f} s, "
                f"{rate or 0:.1f} tokens/s on {chat.device})"
            )
        out.append(
            {
                "model": label,
                "text": a.text,
                "tokens": a.tokens,
                "ttft_s": a.ttft_s,
                "tokens_per_s": rate,
                "device": chat.device,
            }
        )
    if args.json:
        print_json(out)
    return 0
