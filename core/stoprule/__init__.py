"""Rules by which a run stops itself early, checked by its own agent: the sweep's median
stopping rule (`median`). The built-in trainer's early stop on eval loss is the trainer's
(train.early_stop_patience)."""
