"""An ms-swift plugin (--external_plugins) for restart tests: the callback `crash_once` ends
rank 1 with exit code 3 at the end of step SWIFT_CRASH_AT_STEP on the agent's first attempt
only, after that step's checkpoint (if any) is written by the steps before it."""

import os

from swift.callbacks import callbacks_map
from swift.callbacks.base import TrainerCallback


class CrashOnce(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if (
            os.environ.get("TUNEDECK_ATTEMPT") == "0"
            and os.environ.get("RANK") == "1"
            and state.global_step == int(os.environ["SWIFT_CRASH_AT_STEP"])
        ):
            print(f"rank 1 crashes on purpose at step {state.global_step}", flush=True)
            os._exit(3)
        return control


callbacks_map["crash_once"] = CrashOnce
