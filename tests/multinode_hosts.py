"""Two Linux "hosts" for multi-node tests: network namespaces joined by a veth pair, each with
its own address and its own real sshd, reachable only with a key made for the test.

Nothing touches the user's ~/.ssh: the key, known_hosts and the ssh config live in the test's
folder (the head uses them through TUNEDECK_SSH_CONFIG → ssh -F). Everything is torn down in
`close()` (sshd killed, namespaces deleted, which deletes the veth pair), also on failure.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
IFACE = "td0"  # both ends carry the same name, one per namespace
SSH_PORT = 2222


def unavailable() -> str | None:
    """Why two hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "iproute2 (ip) is not installed"
    if not os.path.exists(SSHD):
        return "OpenSSH server (sshd) is not installed (apt-get install openssh-server)"
    if not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        return "the OpenSSH client is not installed"
    probe = f"tdprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(*argv: str) -> None:
    r = subprocess.run(list(argv), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")


@dataclass
class Hosts:
    root: Path
    names: list[str] = field(default_factory=list)  # namespace per host
    addrs: list[str] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)  # Host names in ssh_config
    sshd: list[subprocess.Popen] = field(default_factory=list)

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    @property
    def head_only(self) -> Path:
        """A folder only the head sees: the other hosts' sshd (and so every ssh session
        there) has an empty tmpfs mounted over it. A head home under it is a run folder on
        the head's own disk; one anywhere else is on a filesystem both hosts share."""
        return self.root / "head-only"

    def netns_argv(self, i: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.names[i], *argv]

    def named_argv(self, i: int, argv: list[str]) -> list[str]:
        """argv on host i where the hosts resolve by their aliases (node0, node1...): its
        network namespace, and a mount namespace of its own with a hosts file naming them
        bound over /etc/hosts (nothing outside changes). Unlike `ip netns exec` it keeps
        this machine's /sys, whose cgroup mounts slurmd needs."""
        names = self.root / "hosts"
        if not names.exists():
            names.write_text(
                Path("/etc/hosts").read_text()
                + "".join(f"{a} {n}\n" for a, n in zip(self.addrs, self.aliases))
            )
        return [
            "nsenter",
            f"--net=/run/netns/{self.names[i]}",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount --bind "$0" /etc/hosts && exec "$@"',
            str(names),
            *argv,
        ]

    def close(self) -> None:
        for p in self.sshd:
            if p.poll() is None:
                p.kill()
            p.wait()
        for n in self.names:
            # processes left in a namespace keep nothing of it alive once it is deleted
            subprocess.run(["ip", "netns", "del", n], capture_output=True)

    def start_sshd(self, i: int) -> subprocess.Popen:
        sshd = [SSHD, "-D", "-e", "-f", str(self.root / f"sshd{i}.conf")]
        if i > 0:  # in a mount namespace of its own, without the head's private folder
            sshd = [
                sys.executable,
                "-m",
                "tests.multinode_hosts",
                "hide",
                str(self.head_only),
                *sshd,
            ]
        with open(self.root / f"sshd{i}.log", "ab") as err:
            return subprocess.Popen(
                ["ip", "netns", "exec", self.names[i], *sshd],
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=REPO,
            )

    def restart_sshd(self, i: int) -> None:
        """Host i's sshd again (a test took it away to make the host unreachable)."""
        if self.sshd[i].poll() is None:
            return
        self.sshd[i].wait()
        self.sshd[i] = self.start_sshd(i)
        deadline = time.monotonic() + 20
        while self.ssh(i, "true", timeout=10).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd on {self.addrs[i]} did not come back")
            time.sleep(0.2)

    def ssh(self, i: int, *remote: str, timeout: float = 20) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.netns_argv(
                0,
                [
                    "ssh",
                    "-F",
                    str(self.ssh_config),
                    "-o",
                    "BatchMode=yes",
                    self.aliases[i],
                    *remote,
                ],
            ),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def _same_code() -> list[str]:
    path = os.environ.get("PYTHONPATH", "")
    return [f"SetEnv PYTHONPATH={path}"] if path and " " not in path else []


def make_hosts(root: Path, n: int = 2) -> Hosts:
    root.mkdir(parents=True, exist_ok=True)
    (root / "head-only").mkdir(exist_ok=True)
    tag = f"{os.getpid() % 100000}"
    subnet = 200 + os.getpid() % 50
    hosts = Hosts(root)
    try:
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation dir
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "id_test"))
        (root / "authorized_keys").write_text((root / "id_test.pub").read_text())
        os.chmod(root / "authorized_keys", 0o600)
        known, config = [], []
        a, b = f"tdv{tag}a", f"tdv{tag}b"
        for i in range(n):
            ns = f"td{tag}h{i}"
            _run("ip", "netns", "add", ns)
            hosts.names.append(ns)
        _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        for i, end in enumerate((a, b)):
            ns, addr = hosts.names[i], f"10.{subnet}.0.{i + 1}"
            _run("ip", "link", "set", end, "netns", ns)
            _run("ip", "-n", ns, "link", "set", end, "name", IFACE)
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", IFACE)
            _run("ip", "-n", ns, "link", "set", IFACE, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            hosts.addrs.append(addr)
        for i, ns in enumerate(hosts.names):
            key = root / f"host{i}_key"
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
            cfg = root / f"sshd{i}.conf"
            cfg.write_text(
                "\n".join(
                    [
                        f"ListenAddress {hosts.addrs[i]}",
                        f"Port {SSH_PORT}",
                        f"HostKey {key}",
                        f"AuthorizedKeysFile {root / 'authorized_keys'}",
                        "PermitRootLogin prohibit-password",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "UsePAM no",
                        "StrictModes no",
                        f"PidFile {root / f'sshd{i}.pid'}",
                        "LogLevel ERROR",
                        # every host runs the tunedeck the tests import (a checkout's, on
                        # PYTHONPATH), as a real cluster installs one tunedeck everywhere
                        *_same_code(),
                        "",
                    ]
                )
            )
            hosts.sshd.append(hosts.start_sshd(i))
            alias = f"node{i}"
            hosts.aliases.append(alias)
            known.append(
                f"[{hosts.addrs[i]}]:{SSH_PORT} {(root / f'host{i}_key.pub').read_text().split(' ')[0]} "
                f"{(root / f'host{i}_key.pub').read_text().split(' ')[1]}"
            )
            config += [
                f"Host {alias}",
                f"  HostName {hosts.addrs[i]}",
                f"  Port {SSH_PORT}",
                "  User root",
                f"  IdentityFile {root / 'id_test'}",
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {root / 'known_hosts'}",
                "  GlobalKnownHostsFile /dev/null",
                "  StrictHostKeyChecking yes",
                "  LogLevel ERROR",
                "",
            ]
        (root / "known_hosts").write_text("\n".join(known) + "\n")
        hosts.ssh_config.write_text("\n".join(config))
        deadline = time.monotonic() + 20
        for i in range(n):
            while True:
                r = hosts.ssh(i, "true", timeout=10)
                if r.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"sshd on {hosts.addrs[i]} did not answer: {r.stderr}"
                        f"{(root / f'sshd{i}.log').read_text()}"
                    )
                time.sleep(0.2)
        return hosts
    except BaseException:
        hosts.close()
        raise


def demo_spec(
    path: Path, name: str, steps: int, cluster: str, run: str = "", save_steps: int = 0
) -> Path:
    """The CPU demo (built-in trainer, tiny model, LoRA) with this `[cluster]` body and
    `[run]` body: the spec every multi-node test launches (ssh and Slurm alike)."""
    path.write_text(f'''name = "{name}"
backend = "builtin"
[model]
path = "builtin:tiny-qwen2"
[data]
path = "{REPO / "presets" / "data" / "demo_chat.jsonl"}"
max_length = 128
[method]
type = "lora"
[train]
max_steps = {steps}
per_device_batch_size = 4
save_steps = {save_steps}
[cluster]
device = "cpu"
{cluster.strip()}
[run]
{run.strip()}
''')
    return path


def _hide_then_exec(folder: str, argv: list[str]) -> None:
    """In a new mount namespace (private: nothing propagates back), an empty tmpfs over
    `folder`, then exec `argv`."""
    libc = ctypes.CDLL(None, use_errno=True)
    ms_rec, ms_private, clone_newns = 0x4000, 0x40000, 0x20000
    if (
        libc.unshare(clone_newns) != 0
        or libc.mount(b"none", b"/", None, ms_rec | ms_private, None) != 0
        or libc.mount(b"tmpfs", folder.encode(), b"tmpfs", 0, b"size=16m") != 0
    ):
        err = ctypes.get_errno()
        raise OSError(err, f"hiding {folder}: {os.strerror(err)}")
    os.execv(argv[0], argv)


if __name__ == "__main__":  # python -m tests.multinode_hosts hide FOLDER ARGV...
    if len(sys.argv) > 3 and sys.argv[1] == "hide":
        _hide_then_exec(sys.argv[2], sys.argv[3:])
    sys.exit("usage: python -m tests.multinode_hosts hide FOLDER ARGV...")
