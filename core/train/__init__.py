"""The built-in trainer that torchrun runs: `python -m tunedeck.core.train --run-dir RUN_DIR`.

Only this package imports torch/transformers/peft at module level, and nothing the CLI or TUI
imports at start imports it. Modules: data (jsonl → labelled batches), model (model, LoRA,
precision), trainer (DDP loop, graceful stop), checkpoint (folder layout), faults (failures
tests inject; loaded only when a TUNEDECK_TEST_* variable is set). The metrics stream's schema
is tunedeck.core.rundir.events.
"""
