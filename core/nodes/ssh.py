"""The system `ssh`, as the head uses it to reach a node.

BatchMode (never a password prompt that nothing answers), the user's own keys and config
(ProxyJump, ControlMaster and Host aliases honoured: we pass no -i and no -o that overrides
them), keep-alives so a dead link is noticed in ~15 s. `TUNEDECK_SSH_CONFIG` names an ssh
config file to use instead of ~/.ssh/config (ssh -F): tests, or a cluster's own file.

ssh joins the words after the destination into one line for the remote shell, so the remote
command is quoted word by word (shlex.join): a path with a space stays one argument.
"""

from __future__ import annotations

import os
import shlex

CONFIG_ENV = "TUNEDECK_SSH_CONFIG"
ALIVE_INTERVAL_S = 5
ALIVE_COUNT = 3


def ssh_argv(dest: str, remote: list[str], connect_timeout_s: int = 10) -> list[str]:
    argv = [
        "ssh",
        "-T",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={connect_timeout_s}",
        "-o",
        f"ServerAliveInterval={ALIVE_INTERVAL_S}",
        "-o",
        f"ServerAliveCountMax={ALIVE_COUNT}",
    ]
    config = os.environ.get(CONFIG_ENV, "").strip()
    if config:
        argv += ["-F", config]
    # "--" ends ssh's options: a destination can never be read as one (roster refuses "-x")
    return argv + ["--", dest, shlex.join(remote)]
