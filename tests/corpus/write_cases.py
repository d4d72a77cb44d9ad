"""Write the corpus's written cases: failures that cannot be caused on this CPU machine (CUDA,
NCCL, multi-node, DeepSpeed's launcher, ...), written here in our own words to match the line
formats of the public report named beside each case (its prefixes, wrapping, interleaving,
truncation); never a copy of anyone's post.

    .venv/bin/python tests/corpus/write_cases.py

Each case is a list of (rank or None, line): None is a line of the launcher, a number a line
a rank printed. A variant renders it the way it reached the user: bare, with torchrun's
`[rankN]:` or `--tee`'s `[defaultN]:`, srun -l's `N:`, a timestamp on every line, a k8s or
pdsh prefix, colour codes, a rich box, a tmux copy, hard-wrapped at a terminal's width, or
cut at the top. Writes tests/corpus/written/<case>.log and tests/corpus/written.json.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "written"

PY = "/opt/conda/lib/python3.10/site-packages"


def tb(rank, frames, exc):
    """A Python traceback printed by `rank`."""
    lines = [(rank, "Traceback (most recent call last):")]
    for path, no, fn, code in frames:
        lines += [(rank, f'  File "{path}", line {no}, in {fn}'), (rank, f"    {code}")]
    return lines + [(rank, ln) for ln in exc.split("\n")]


def torchrun_tb():
    """torchrun's own traceback before its failure table."""
    return tb(
        None,
        [
            ("/opt/conda/bin/torchrun", 8, "<module>", "sys.exit(main())"),
            (f"{PY}/torch/distributed/run.py", 806, "main", "run(args)"),
            (
                f"{PY}/torch/distributed/launcher/api.py",
                264,
                "launch_agent",
                "raise ChildFailedError(",
            ),
        ],
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    )


def table(script, entries, root_idx=0, header=True):
    """torchrun's failure report; entries: (rank, host, exitcode, pid, time, traceback)."""
    out = []
    if header:
        out += [(None, "=" * 60), (None, f"{script} FAILED"), (None, "-" * 60)]
    others = [e for i, e in enumerate(entries) if i != root_idx]
    out.append((None, "Failures:"))
    if not others:
        out.append((None, "  <NO_OTHER_FAILURES>"))
    for i, e in enumerate(others, 1):
        out += [(None, f"[{i}]:")] + _entry(*e)
    out += [(None, "-" * 60), (None, "Root Cause (first observed failure):"), (None, "[0]:")]
    out += _entry(*entries[root_idx]) + [(None, "=" * 60)]
    return out


def _entry(rank, host, code, pid, when, trace):
    return [
        (None, f"  time      : {when}"),
        (None, f"  host      : {host}"),
        (None, f"  rank      : {rank} (local_rank: {rank % 8})"),
        (None, f"  exitcode  : {code} (pid: {pid})"),
        (None, "  error_file: <N/A>"),
        (None, f"  traceback : {trace}"),
    ]


def sig_trace(code, pid):
    names = {
        -9: "SIGKILL",
        -6: "SIGABRT",
        -11: "SIGSEGV",
        -15: "SIGTERM",
        -1: "SIGHUP",
        -7: "SIGBUS",
    }
    if code < 0:
        return f"Signal {-code} ({names[code]}) received by PID {pid}"
    return "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"


def glog(
    level,
    msg,
    t="0629 00:06:21.246000",
    tid="140229302286144",
    where="torch/distributed/elastic/multiprocessing/api.py:851",
):
    return f"{level}{t} {tid} {where}] {msg}"


def failed_line(code, local, pid):
    return glog(
        "E",
        f"failed (exitcode: {code}) local_rank: {local} (pid: {pid}) of binary: "
        "/opt/conda/bin/python3.10",
        where="torch/distributed/elastic/multiprocessing/api.py:826",
    )


def closing(pid, sig="SIGTERM"):
    return glog("W", f"Sending process {pid} closing signal {sig}")


def shards(n, total):
    pct = n * 100 // total
    return (
        f"Loading checkpoint shards: {pct:3d}%|{'█' * (pct // 10):<10}| {n}/{total} "
        f"[00:{n * 9:02d}<00:{(total - n) * 9:02d},  9.10s/it]"
    )


def nccl(host, pid, dev, level, msg):
    return f"{host}:{pid}:{pid + 100} [{dev}] NCCL {level} {msg}"


def watchdog_timeout(rank, seq=4211, op="ALLREDUCE", ms=600000, ran=600075):
    return (
        f"[E ProcessGroupNCCL.cpp:475] [Rank {rank}] Watchdog caught collective operation "
        f"timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=8388608, NumelOut=8388608, "
        f"Timeout(ms)={ms}) ran for {ran} milliseconds before timing out."
    )


def hf_dicts(n, loss0=2.1, step0=1):
    return [
        (
            0,
            str(
                {
                    "loss": round(loss0 - 0.05 * i, 4),
                    "grad_norm": 1.2,
                    "learning_rate": 2e-5,
                    "epoch": round(0.01 * (i + 1), 2),
                }
            ),
        )
        for i in range(n)
    ]


# -- the cases -----------------------------------------------------------------------------
# name: (category or "a|b", rank, host, url, lines, variants)

CASES: dict[str, tuple] = {}


def case(name, category, rank, url, lines, variants=("plain",), host=None, text_rank=False):
    """`rank`: the rank a user would name; the case expects it only where the rendering
    shows it (a rank prefix), or always when the text itself names it (`text_rank`)."""
    CASES[name] = (category, rank, host, url, lines, variants, text_rank)


# renderings that show which rank printed a line, and those that show a host
SHOWS_RANK = {
    "rank",
    "default",
    "srun",
    "determined",
    "torchx",
    "clockrank",
    "interleave",
    "pdsh",
    "mpitag",
}
SHOWS_HOST = {"pdsh"}


# signal exits without torchrun's full table
case(
    "sigkill_after_shards",
    "oom_host",
    2,
    "https://github.com/OpenBMB/MiniCPM-V/issues/312",
    [(None, shards(1, 7)), (None, shards(4, 7)), (None, shards(7, 7))]
    + [(None, closing(p)) for p in (29734, 29735, 29737)]
    + [(None, failed_line(-9, 2, 29736))]
    + torchrun_tb(),
    ("plain", "iso", "cut2"),
    text_rank=True,
)
case(
    "sigkill_bare_line",
    "worker_sigkill|oom_host",
    0,
    "https://github.com/meta-llama/llama/issues/856",
    [
        (None, "> initializing model parallel with size 1"),
        (None, "> initializing ddp with size 1"),
        (
            None,
            "[2023-10-13 17:40:02,544] torch.distributed.elastic.multiprocessing.api: [ERROR] "
            "failed (exitcode: -9) local_rank: 0 (pid: 62498) of binary: /home/u/env/bin/python",
        ),
    ]
    + torchrun_tb(),
    ("plain",),
    text_rank=True,
)
case(
    "sigkill_oldlog_shards_midway",
    "oom_host",
    0,
    "https://github.com/zai-org/ChatGLM2-6B/issues/525",
    [
        (
            None,
            shards(4, 7) + "ERROR:torch.distributed.elastic.multiprocessing.api:failed "
            "(exitcode: -9) local_rank: 0 (pid: 8180) of binary: /usr/bin/python3",
        )
    ]
    + torchrun_tb()
    + table("main.py", [(0, "gpu-box", -9, 8180, "2023-09-05_10:11:12", sig_trace(-9, 8180))]),
    ("plain",),
    text_rank=True,
)
case(
    "sigkill_table_cut_head",
    "worker_sigkill",
    3,
    "https://github.com/meta-llama/llama-models/issues/334",
    table(
        "train.py",
        [(3, "node-a", -9, 2198, "2025-04-29_10:00:01", sig_trace(-9, 2198))],
        header=False,
    )[4:],
    ("plain", "iso"),
    text_rank=True,
)
case(
    "segfault_table_timestamped",
    "worker_segfault",
    5,
    "https://github.com/NVIDIA/Megatron-LM/issues/1880",
    [(None, failed_line(-11, 5, 4412))]
    + torchrun_tb()
    + table(
        "pretrain_gpt.py",
        [
            (5, "dgx-07", -11, 4412, "2025-06-01_08:00:00", sig_trace(-11, 4412)),
            (4, "dgx-07", -15, 4411, "2025-06-01_08:00:02", sig_trace(-15, 4411)),
        ],
    ),
    ("iso", "glogish"),
    host="dgx-07",
    text_rank=True,
)
case(
    "sigabrt_alone",
    "worker_sigabrt",
    1,
    "https://github.com/deepspeedai/DeepSpeed/issues/3989",
    [(None, closing(4001)), (None, failed_line(-6, 1, 4002))] + torchrun_tb(),
    ("plain",),
    text_rank=True,
)
case(
    "sigsegv_fatal_python",
    "worker_segfault",
    3,
    "https://github.com/vllm-project/vllm/issues/4108",
    [
        (3, "Fatal Python error: Segmentation fault"),
        (3, ""),
        (3, "Thread 0x00007f2a1c7fe700 (most recent call first):"),
        (3, f'  File "{PY}/torch/utils/data/_utils/pin_memory.py", line 52 in _pin_memory_loop'),
        (None, closing(811)),
        (None, failed_line(-11, 3, 814)),
    ],
    ("rank", "default"),
    text_rank=True,
)
case(
    "deepspeed_return_code_9",
    "worker_sigkill|oom_host",
    0,
    "https://github.com/deepspeedai/DeepSpeed/issues/3232",
    [
        (None, "[2023-04-14 13:11:20,101] [INFO] [launch.py:229:main] dist_world_size=1"),
        (
            None,
            "[2023-04-14 13:11:27,879] [INFO] [launch.py:428:sigkill_handler] Killing "
            "subprocess 13266",
        ),
        (
            None,
            "[2023-04-14 13:11:27,885] [ERROR] [launch.py:434:sigkill_handler] "
            "['/usr/bin/python3', '-u', 'main.py', '--local_rank=0', '--zero_stage', '2', "
            "'--deepspeed'] exits with return code = -9",
        ),
    ],
    ("plain",),
    text_rank=True,
)
case(
    "deepspeed_return_code_11",
    "worker_segfault",
    1,
    "https://github.com/deepspeedai/DeepSpeed/issues/3989",
    [
        (
            None,
            "[2023-07-19 10:43:05,393] [INFO] [real_accelerator.py:133:get_accelerator] "
            "Setting ds_accelerator to cuda (auto detect)",
        ),
        (
            None,
            "[2023-07-19 10:44:13,980] [INFO] [launch.py:315:sigkill_handler] Killing "
            "subprocess 3966",
        ),
        (
            None,
            "[2023-07-19 10:44:13,982] [ERROR] [launch.py:321:sigkill_handler] "
            "['/usr/bin/python3', '-u', 'clip_ft.py', '--local_rank=1', '--deepspeed_config', "
            "'ds.json'] exits with return code = -11",
        ),
    ],
    ("plain", "ansi"),
    text_rank=True,
)
case(
    "sighup_nohup",
    "launcher_signal",
    None,
    "https://github.com/modelscope/ms-swift/issues/5884",
    [
        (0, "Train:  16%|█▌        | 4080/25120 [3:02:10<15:17:25,  2.62s/it]"),
        (
            None,
            "W0920 09:10:41.194000 84933 site-packages/torch/distributed/elastic/agent/server/"
            "api.py:719] Received 1 death signal, shutting down workers",
        ),
        (
            None,
            "W0920 09:10:41.195000 84933 site-packages/torch/distributed/elastic/"
            "multiprocessing/api.py:900] Sending process 85005 closing signal SIGHUP",
        ),
        (
            None,
            "W0920 09:10:41.195000 84933 site-packages/torch/distributed/elastic/"
            "multiprocessing/api.py:900] Sending process 85006 closing signal SIGHUP",
        ),
    ]
    + tb(
        None,
        [
            (f"{PY}/torch/distributed/run.py", 883, "run", "elastic_launch("),
            (
                f"{PY}/torch/distributed/elastic/multiprocessing/api.py",
                84,
                "_terminate_process_handler",
                'raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)',
            ),
        ],
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 84933 got "
        "signal: 1",
    ),
    ("plain", "cut2", "tmux"),
)
case(
    "sighup_old_logger",
    "launcher_signal",
    None,
    "https://github.com/modelscope/ms-swift/issues/64",
    [
        (0, "{'loss': 2.2907, 'learning_rate': 9.547e-05, 'epoch': 2.6, 'global_step': 4080}"),
        (
            0,
            " 16%|█▋        | 4084/25120 [3:02:22<16:20:02,  2.80s/it]WARNING:torch.distributed."
            "elastic.agent.server.api:Received 1 death signal, shutting down workers",
        ),
        (
            None,
            "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 2973583 "
            "closing signal SIGHUP",
        ),
        (
            None,
            "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 2973584 "
            "closing signal SIGHUP",
        ),
    ],
    ("plain",),
)
case(
    "sigterm_from_scheduler",
    "launcher_signal",
    None,
    "https://github.com/determined-ai/determined/issues/8915",
    [
        (
            None,
            "WARNING: torch.distributed.elastic.agent.server.api:Received 15 death signal, "
            "shutting down workers",
        )
    ]
    + [
        (
            None,
            f"WARNING: torch.distributed.elastic.multiprocessing.api:Sending process {p} "
            "closing signal SIGTERM",
        )
        for p in (165, 166, 168)
    ],
    ("determined", "plain"),
)
case(
    "exit1_all_ranks_no_tb",
    "rank_crashed",
    0,
    "https://github.com/pytorch/pytorch/issues/123808",
    [
        (
            None,
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) "
            "local_rank: 0 (pid: 17966) of binary: /home/u/env/bin/python",
        )
    ]
    + torchrun_tb()
    + table(
        "llama.py",
        [
            (0, "ws-01", 1, 17966, "2024-04-11_09:00:00", sig_trace(1, 0)),
            (1, "ws-01", 1, 17967, "2024-04-11_09:00:00", sig_trace(1, 0)),
            (2, "ws-01", 1, 17968, "2024-04-11_09:00:00", sig_trace(1, 0)),
        ],
    ),
    ("plain", "iso"),
    text_rank=True,
)

# hangs announced by the watchdog
HEART = (
    "[PG 0 Rank {r}] Heartbeat monitor timed out! Process will be terminated after "
    "dumping debug info. workMetaList_.size()=103"
)
STUCK = (
    "[PG 0 Rank {r}] [PG 0 Rank {r}] ProcessGroupNCCL's watchdog got stuck for 600 seconds "
    "without making progress in monitoring enqueued collectives. This typically indicates "
    "a NCCL/CUDA API hang blocking the watchdog, and could be triggered by another thread "
    "holding the GIL inside a CUDA api, or other deadlock-prone behaviors."
)
case(
    "watchdog_heartbeat",
    "stall|nccl_timeout",
    1,
    "https://github.com/Intellindust-AI-Lab/DEIM/issues/105",
    [
        (1, "[E ProcessGroupNCCL.cpp:1316] " + HEART.format(r=1)),
        (
            1,
            "[E ProcessGroupNCCL.cpp:1153] [PG 0 Rank 1] ProcessGroupNCCL preparing to dump "
            "debug info.",
        ),
        (1, "[F ProcessGroupNCCL.cpp:1169] " + STUCK.format(r=1)),
        (0, "[E ProcessGroupNCCL.cpp:1316] " + HEART.format(r=0)),
    ],
    ("rank", "wrap120"),
    text_rank=True,
)
case(
    "watchdog_stuck_only",
    "stall|nccl_timeout",
    4,
    "https://github.com/modelscope/ms-swift/issues/7992",
    [
        (4, "[E205 18:11:06.375750231 ProcessGroupNCCL.cpp:1870] " + STUCK.format(r=4)),
        (0, "[E205 18:11:06.375964157 ProcessGroupNCCL.cpp:1870] " + STUCK.format(r=0)),
    ],
    ("clockrank", "rank"),
    text_rank=True,
)
case(
    "watchdog_terminating",
    "stall|nccl_timeout",
    6,
    "https://github.com/om-ai-lab/VLM-R1/issues/257",
    [
        (
            6,
            "[E429 13:55:49.384372190 ProcessGroupNCCL.cpp:1743] [PG ID 0 PG GUID 0(default_pg) "
            "Rank 6] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making "
            "progress in monitoring enqueued collectives.",
        ),
        (
            6,
            "[F429 14:03:49.385461578 ProcessGroupNCCL.cpp:1554] [PG ID 0 PG GUID 0(default_pg) "
            "Rank 6] Terminating the process after attempting to dump debug info, due to "
            "ProcessGroupNCCL watchdog hang.",
        ),
    ],
    ("rank", "wrap116"),
    text_rank=True,
)
case(
    "nccl_watchdog_timeout",
    "nccl_timeout|stall",
    2,
    "https://github.com/hiyouga/LlamaFactory/issues/7396",
    [
        (2, watchdog_timeout(2)),
        (
            2,
            "[E ProcessGroupNCCL.cpp:489] Some NCCL operations have failed or timed out. Due to "
            "the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
            "corrupted/incomplete data.",
        ),
        (
            2,
            "[E ProcessGroupNCCL.cpp:495] To avoid data inconsistency, we are taking the entire "
            "process down.",
        ),
        (None, closing(2201)),
        (None, failed_line(-6, 2, 2203)),
    ]
    + torchrun_tb(),
    ("plain", "rank", "srun"),
    text_rank=True,
)

# CUDA faults through the NCCL watchdog
ILLEGAL = (
    "[PG ID 0 PG GUID 0(default_pg) Rank {r}] Process group watchdog thread terminated "
    "with exception: CUDA error: an illegal memory access was encountered"
)
case(
    "cuda_illegal_via_watchdog",
    "cuda_fault",
    2,
    "https://github.com/InternLM/lmdeploy/issues/3258",
    [
        (
            2,
            "frame #5: c10d::ProcessGroupNCCL::watchdogHandler() + 0x1da (0x7fa14b231b5a in "
            f"{PY}/torch/lib/libtorch_cuda.so)",
        ),
        (2, ""),
        (2, "terminate called after throwing an instance of 'c10::DistBackendError'"),
        (2, "  what():  " + ILLEGAL.format(r=2)),
        (
            2,
            "CUDA kernel errors might be asynchronously reported at some other API call, so the "
            "stacktrace below might be incorrect.",
        ),
        (2, "For debugging consider passing CUDA_LAUNCH_BLOCKING=1"),
        (None, closing(900)),
        (None, failed_line(-6, 2, 902)),
    ],
    ("rank", "plain", "cut1"),
    text_rank=True,
)
case(
    "cuda_illegal_old_watchdog",
    "cuda_fault",
    0,
    "https://github.com/vllm-project/vllm/issues/4108",
    [
        (
            0,
            "[E ProcessGroupNCCL.cpp:916] [Rank 0] NCCL watchdog thread terminated with "
            "exception: CUDA error: an illegal memory access was encountered",
        ),
        (0, "Fatal Python error: Aborted"),
    ],
    ("plain", "ray"),
    text_rank=True,
)
case(
    "cuda_illegal_instruction",
    "cuda_fault",
    3,
    "https://github.com/axolotl-ai-cloud/axolotl/issues/1473",
    tb(
        3,
        [("train.py", 88, "step", "loss.backward()")],
        "RuntimeError: CUDA error: an illegal instruction was encountered\nCompile with "
        "`TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    )
    + [(1, watchdog_timeout(1))],
    ("rank",),
)
case(
    "device_side_assert",
    "cuda_fault",
    0,
    "https://github.com/deepspeedai/Megatron-DeepSpeed/issues/207",
    [
        (
            0,
            "../aten/src/ATen/native/cuda/Indexing.cu:1146: indexSelectLargeIndex: block: "
            "[195,0,0], thread: [64,0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
        )
    ]
    + tb(
        0,
        [("model.py", 410, "forward", "inputs_embeds = self.embed_tokens(input_ids)")],
        "RuntimeError: CUDA error: device-side assert triggered",
    ),
    ("plain", "rich"),
)
case(
    "ecc_error",
    "cuda_fault",
    5,
    "https://github.com/kohya-ss/sd-scripts/issues/1434",
    tb(
        5,
        [("train.py", 200, "main", "optimizer.step()")],
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    )
    + [(3, watchdog_timeout(3))],
    ("rank", "iso"),
)

# other wordings of errors already known
case(
    "port_windows",
    "port_in_use",
    None,
    "https://github.com/Adi-iitd/AI-Art/issues/10",
    tb(
        None,
        [
            (
                r"C:\Users\u\env\lib\site-packages\torch\distributed\rendezvous.py",
                190,
                "_env_rendezvous_handler",
                "store = TCPStore(master_addr, master_port)",
            )
        ],
        "RuntimeError: Only one usage of each socket address (protocol/network address/port) "
        "is normally permitted.",
    ),
    ("plain",),
)
case(
    "port_errno98",
    "port_in_use",
    None,
    "https://github.com/meta-pytorch/torchtune/issues/1025",
    [
        (
            None,
            "[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:29500 "
            "(errno: 98 - Address already in use).",
        ),
        (
            None,
            "[W socket.cpp:426] [c10d] The server socket has failed to bind to 0.0.0.0:29500 "
            "(errno: 98 - Address already in use).",
        ),
        (
            None,
            "[E socket.cpp:462] [c10d] The server socket has failed to listen on any local "
            "network address.",
        ),
    ]
    + tb(
        None,
        [("/opt/conda/bin/torchrun", 33, "<module>", "sys.exit(main())")],
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
        "local network address. The server socket has failed to bind to [::]:29500 (errno: 98 "
        "- Address already in use).",
    ),
    ("plain", "tmux"),
)
case(
    "port_eaddrinuse_new",
    "port_in_use",
    None,
    "https://github.com/vllm-project/vllm/issues/39015",
    [
        (
            0,
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
            "local network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, "
            "message: address already in use",
        )
    ],
    ("plain", "wrap100"),
)
case(
    "fsdp_flatparam_requires_grad",
    "fsdp_mixed_requires_grad",
    0,
    "https://github.com/pytorch/pytorch/issues/104690",
    tb(
        0,
        [
            (
                f"{PY}/torch/distributed/fsdp/flat_param.py",
                435,
                "_validate_tensors_to_flatten",
                'raise ValueError("`FlatParameter` requires uniform `requires_grad`")',
            )
        ],
        "ValueError: `FlatParameter` requires uniform `requires_grad`",
    ),
    ("rank", "default"),
)
case(
    "nccl_remote_error_2_18",
    "nccl_network",
    1,
    "https://github.com/tatsu-lab/stanford_alpaca/issues/207",
    [
        (
            1,
            nccl(
                "node-b",
                3301,
                1,
                "WARN",
                "NET/IB : Got completion from peer 10.0.0.1<48302> "
                "with error 12, opcode 0, len 0, vendor err 129",
            ),
        ),
        (1, nccl("node-b", 3301, 1, "INFO", "transport/net.cc:1130 -> 6")),
    ]
    + tb(
        1,
        [("train.py", 77, "step", "dist.all_reduce(t)")],
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:219, remote process exited or there was a network error, NCCL version "
        "2.18.1\nncclRemoteError: A call failed possibly due to a network error or a remote "
        "process exiting prematurely.",
    ),
    ("rank", "pdsh"),
    host="node-b",
)
case(
    "nccl_unhandled_system_error",
    "nccl_network",
    0,
    "https://github.com/NVIDIA/nccl/issues/1657",
    tb(
        0,
        [("train.py", 40, "main", "model = DDP(model, device_ids=[local_rank])")],
        "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, "
        "unhandled system error, NCCL version 2.10.3\nncclSystemError: System call (e.g. socket, "
        "malloc) or external library call failed or device error. It can be also caused by "
        "unexpected exit of a remote peer, you can check NCCL warnings for failure reason and "
        "see if there is connection closure by a peer.",
    ),
    ("plain", "srun"),
)
case(
    "nccl_socket_connect_2_2x",
    "nccl_network",
    3,
    "https://github.com/NVIDIA/nccl/issues/1232",
    [
        (
            3,
            nccl(
                "gpu-3",
                5550,
                3,
                "WARN",
                "socketProgress: Connection closed by remote peer gpu-1<52310>",
            ),
        ),
        (3, nccl("gpu-3", 5550, 3, "INFO", "misc/socket.cc:752 -> 6")),
    ]
    + tb(
        3,
        [("train.py", 12, "<module>", "dist.barrier()")],
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:317, remote process exited or there was a network error, NCCL version "
        "2.21.5",
    ),
    ("default", "k8s"),
)
case(
    "nccl_internal_socket",
    "nccl_network",
    0,
    "https://github.com/NVIDIA/nccl/issues/795",
    [
        (0, nccl("vm1", 101, 0, "WARN", "Bootstrap : no socket interface found")),
        (
            0,
            "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, "
            "internal error, NCCL version 2.14.3",
        ),
        (0, "ncclInternalError: Internal check failed."),
    ],
    ("plain",),
)
case(
    "deepspeed_oom_wording",
    "oom_gpu",
    0,
    "https://github.com/huggingface/transformers/issues/24658",
    tb(
        0,
        [
            (
                f"{PY}/deepspeed/runtime/zero/stage_1_and_2.py",
                530,
                "__init__",
                "self.single_partition_of_fp32_groups[i].grad = torch.zeros(",
            )
        ],
        "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously "
        "reported at some other API call.",
    ),
    ("plain", "dslog"),
)
case(
    "accelerate_oom_wording",
    "oom_gpu",
    1,
    "https://github.com/huggingface/accelerate/issues/1934",
    tb(
        1,
        [
            (
                f"{PY}/accelerate/utils/memory.py",
                134,
                "decorator",
                'raise RuntimeError("No executable batch size found, reached zero.")',
            )
        ],
        "RuntimeError: No executable batch size found, reached zero.",
    ),
    ("rank",),
)
case(
    "torch_oom_with_rank",
    "oom_gpu",
    3,
    "https://github.com/lllyasviel/FramePack/issues/369",
    tb(
        3,
        [("train.py", 91, "training_step", "loss.backward()")],
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a "
        "total capacity of 79.15 GiB of which 1.02 GiB is free.",
    ),
    ("rank", "default", "srun", "wrap100", "interleave"),
)

# rank extraction
case(
    "ddp_unused_for_rank",
    "ddp_unused_parameters",
    2,
    "https://github.com/open-mmlab/mmdetection/issues/8626",
    tb(
        None,
        [("train.py", 150, "train", "loss = model(batch)")],
        "RuntimeError: Expected to have finished reduction in the prior iteration before "
        "starting a new one. This error indicates that your module has parameters that were "
        "not used in producing loss.\nParameter indices which did not receive grad for rank 2: "
        "141 142",
    ),
    ("plain",),
    text_rank=True,
)
case(
    "determined_rank_prefix",
    "rank_crashed",
    5,
    "https://github.com/determined-ai/determined/issues/8915",
    tb(5, [("train.py", 33, "main", "batch = next(it)")], "ZeroDivisionError: division by zero"),
    ("determined",),
)
case(
    "torchx_rank_prefix",
    "rank_crashed",
    1,
    "https://github.com/meta-pytorch/torchtune/pull/2620",
    tb(1, [("recipe.py", 610, "train", "tokens = batch['tokens']")], "KeyError: 'tokens'"),
    ("torchx",),
)
case(
    "pdsh_host_table",
    "worker_sigkill|oom_host",
    9,
    "https://github.com/deepspeedai/DeepSpeed/issues/4890",
    table(
        "train.py",
        [
            (9, "worker-2", -9, 771, "2024-01-03_11:00:00", sig_trace(-9, 771)),
            (8, "worker-2", -15, 770, "2024-01-03_11:00:01", sig_trace(-15, 770)),
        ],
    ),
    ("pdsh",),
    host="worker-2",
    text_rank=True,
)

# loader / files / memory
case(
    "too_many_open_files_loader",
    "too_many_open_files",
    0,
    "https://github.com/zju3dv/NeuralRecon/issues/91",
    tb(
        0,
        [(f"{PY}/torch/utils/data/dataloader.py", 1133, "_try_get_data", "raise RuntimeError(")],
        "RuntimeError: Too many open files. Communication with the workers is no longer "
        "possible. Please increase the limit using `ulimit -n` in the shell or change the "
        "sharing strategy by calling `torch.multiprocessing.set_sharing_strategy('file_system')` "
        "at the beginning of your code",
    ),
    ("plain", "rank"),
)
case(
    "ancdata",
    "too_many_open_files",
    1,
    "https://github.com/pytorch/pytorch/pull/34768",
    tb(
        1,
        [
            (
                f"{PY}/torch/multiprocessing/reductions.py",
                307,
                "rebuild_storage_fd",
                "fd = df.detach()",
            ),
            (
                "/usr/lib/python3.8/multiprocessing/reduction.py",
                164,
                "recvfds",
                'raise RuntimeError("received %d items of ancdata")',
            ),
        ],
        "RuntimeError: received 0 items of ancdata",
    ),
    ("rank",),
)
case(
    "shm_bus_error",
    "dataloader_shm",
    0,
    "https://github.com/msr-fiddle/pipedream/issues/28",
    [
        (
            0,
            "ERROR: Unexpected bus error encountered in worker. This might be caused by "
            "insufficient shared memory (shm).",
        )
    ]
    + tb(
        0,
        [(f"{PY}/torch/utils/data/dataloader.py", 1120, "_try_get_data", "raise RuntimeError(")],
        "RuntimeError: DataLoader worker (pid 3120) is killed by signal: Bus error. It is "
        "possible that dataloader's workers are out of shared memory.",
    ),
    ("plain", "k8s"),
)
case(
    "host_oom_dmesg",
    "oom_host",
    None,
    "https://github.com/pcyin/tranX/issues/41",
    [
        (
            None,
            "[Wed Jan 11 10:02:03 2023] Out of memory: Killed process 23007 (python) "
            "total-vm:81234567kB, anon-rss:60123456kB",
        )
    ],
    ("plain",),
)
case(
    "host_oom_numpy",
    "oom_host",
    0,
    "https://github.com/ru1ven/KeypointFusion/issues/3",
    tb(
        0,
        [("prep.py", 20, "main", "arr = np.zeros((n, d))")],
        "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 93.1 GiB for an array "
        "with shape (500000, 50000) and data type float32",
    ),
    ("plain",),
)

# the rest of the vocabulary, in public shapes
case(
    "rdzv_timeout_multinode",
    "rendezvous_unreachable",
    None,
    "https://github.com/ymcui/Chinese-LLaMA-Alpaca-2/issues/274",
    tb(
        None,
        [
            (
                f"{PY}/torch/distributed/elastic/rendezvous/dynamic_rendezvous.py",
                1031,
                "next_rendezvous",
                "self._op_executor.run(join_op, deadline)",
            )
        ],
        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
    ),
    ("plain", "iso"),
)
case(
    "store_barrier_timeout",
    "rendezvous_unreachable",
    None,
    "https://github.com/deepspeedai/Megatron-DeepSpeed/issues/338",
    tb(
        None,
        [
            (
                f"{PY}/torch/distributed/distributed_c10d.py",
                253,
                "_store_based_barrier",
                "raise RuntimeError(",
            )
        ],
        "RuntimeError: Timed out initializing process group in store based barrier on rank: "
        "3, for key: store_based_barrier_key:1 (world_size=4, worker_count=2, timeout=0:30:00)",
    ),
    ("plain",),
)
case(
    "nccl_version_mismatch",
    "nccl_version_mismatch",
    None,
    "https://github.com/NVIDIA/nccl/issues/1232",
    [
        (0, nccl("node0", 13571, 0, "INFO", "NCCL version 2.18.1+cuda12.1")),
        (1, nccl("node2", 22555, 0, "INFO", "NCCL version 2.19.3+cuda12.2")),
        (0, nccl("node0", 13571, 0, "INFO", "Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0")),
        (
            1,
            nccl(
                "node2", 22555, 0, "INFO", "Channel 00/0 : 0[0] -> 1[0] [receive] via NET/Socket/0"
            ),
        ),
    ],
    ("mpitag", "plain"),
)
case(
    "device_mismatch",
    "device_mismatch",
    1,
    "https://github.com/magic-research/bubogpt/issues/11",
    tb(
        1,
        [("train.py", 55, "forward", "return self.lm_head(h)")],
        "RuntimeError: Expected all tensors to be on the same device, but found at least two "
        "devices, cuda:1 and cuda:0!",
    ),
    ("rank", "ansi"),
)
case(
    "fsdp_mixed_dtype",
    "fsdp_mixed_dtype",
    0,
    "https://github.com/huggingface/trl/issues/1723",
    tb(
        0,
        [
            (
                f"{PY}/torch/distributed/fsdp/_init_utils.py",
                470,
                "_init_param_handle",
                "handle = FlatParamHandle(",
            )
        ],
        "ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and "
        "torch.float32",
    ),
    ("rank",),
)
case(
    "fp16_minimum_scale",
    "fp16_overflow",
    0,
    "https://github.com/ymcui/Chinese-LLaMA-Alpaca/issues/534",
    [(0, "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2, reducing to 1")]
    + tb(
        0,
        [(f"{PY}/deepspeed/runtime/fp16/loss_scaler.py", 183, "update_scale", "raise Exception(")],
        "Exception: Current loss scale already at minimum - cannot decrease scale anymore. "
        "Exiting run.",
    ),
    ("plain", "dslog"),
)
case(
    "invalid_device_ordinal",
    "gpu_count_mismatch",
    4,
    "https://github.com/tatsu-lab/stanford_alpaca/issues/67",
    tb(
        4,
        [("train.py", 10, "main", "torch.cuda.set_device(local_rank)")],
        "RuntimeError: CUDA error: invalid device ordinal",
    ),
    ("rank",),
)
case(
    "argparse_flag",
    "flag_error",
    None,
    "https://github.com/deepspeedai/DeepSpeed/issues/3961",
    [
        (None, "usage: run_clm.py [-h] [--model_name_or_path MODEL_NAME_OR_PATH]"),
        (None, "run_clm.py: error: unrecognized arguments: --deepspeed_config ds.json"),
    ],
    ("plain",),
)
case(
    "loader_worker_killed",
    "dataloader_worker_killed",
    2,
    "https://github.com/pytorch/pytorch/issues/8976",
    tb(
        2,
        [
            (
                f"{PY}/torch/utils/data/_utils/signal_handling.py",
                66,
                "handler",
                "_error_if_any_worker_fails()",
            )
        ],
        "RuntimeError: DataLoader worker (pid 28177) is killed by signal: Killed.",
    ),
    ("rank", "default"),
)
case(
    "python_exception_interleaved",
    "rank_crashed",
    3,
    "https://github.com/NVIDIA/nccl/issues/1928",
    tb(
        3,
        [("train.py", 120, "collate", "ids = torch.tensor(batch['input_ids'])")],
        "ValueError: expected sequence of length 512 at dim 1 (got 380)",
    )
    + [(0, "[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out.")]
    + tb(
        0,
        [("train.py", 130, "step", "dist.all_reduce(loss)")],
        "RuntimeError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from "
        "[0] via c10d key-value store by key '0', but store->get('0') got error: Connection "
        "reset by peer",
    ),
    ("rank", "interleave"),
)
case(
    "consequence_first_in_file",
    "rank_crashed",
    1,
    "https://github.com/hiyouga/LlamaFactory/issues/7396",
    tb(
        0,
        [("train.py", 130, "step", "dist.all_reduce(loss)")],
        "torch.distributed.DistBackendError: [0] is setting up NCCL communicator: Connection "
        "reset by peer",
    )
    + tb(
        1,
        [("data.py", 42, "__getitem__", "return self.rows[i]")],
        "IndexError: list index out of range",
    ),
    ("rank",),
)
case(
    "loss_zero_gradnan",
    "loss_anomaly",
    None,
    "https://github.com/jiahe7ay/MINI_LLM/issues/17",
    [
        (0, str({"loss": 1.8421, "grad_norm": 3.21, "learning_rate": 2e-5, "epoch": 0.01})),
        (0, str({"loss": 1.7013, "grad_norm": 2.95, "learning_rate": 2e-5, "epoch": 0.02})),
    ]
    + [
        (
            0,
            str(
                {
                    "loss": 0.0,
                    "grad_norm": float("nan"),
                    "learning_rate": 2e-5,
                    "epoch": round(0.03 + i / 100, 2),
                }
            ),
        )
        for i in range(4)
    ],
    ("plain",),
)
case(
    "data_time_dominates",
    "dataloader_starvation",
    None,
    "https://github.com/pytorch/examples/issues/164",
    [
        (
            0,
            f"Epoch: [0][{i:4d}/5005]\tTime  {1.9 + i / 1000:.3f} ( 2.010)\tData  "
            f"{1.7 + i / 1000:.3f} ( 1.820)\tLoss 6.9{i % 10} (6.9100)",
        )
        for i in range(10, 60, 10)
    ],
    ("plain", "iso"),
)
case(
    "stderr_killed_shell",
    "worker_sigkill|oom_host",
    None,
    "https://github.com/Shark-NLP/DiffuSeq/issues/64",
    [
        (None, "Map:  40%|████      | 40000/100000 [00:12<00:18, 3300.00 examples/s]"),
        (None, "Killed"),
    ],
    ("plain",),
)

# the launcher's own traceback comes last in the file but first in nothing
case(
    "root_in_table_only",
    "rank_crashed",
    1,
    "https://github.com/yangjianxin1/Firefly/issues/171",
    tb(
        1,
        [("train.py", 66, "main", "trainer.train()")],
        "AttributeError: 'NoneType' object has no attribute 'shape'",
    )
    + [(None, closing(99))]
    + torchrun_tb()
    + table("train.py", [(1, "srv", 1, 100, "2023-10-20_01:02:03", sig_trace(1, 0))]),
    ("rank", "iso"),
    text_rank=True,
)


# harder shapes: launchers' own words around the cause, many ranks at once, boxes, cuts
case(
    "deepspeed_oom_then_return_code",
    "oom_gpu",
    0,
    "https://github.com/deepspeedai/DeepSpeed/issues/3869",
    tb(
        None,
        [("bloom-ds-zero-inference.py", 190, "<module>", "model = deepspeed.init_inference(")],
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 978.00 MiB (GPU 0; "
        "4.00 GiB total capacity; 1.68 GiB already allocated; 0 bytes free)",
    )
    + [
        (
            None,
            "[2023-07-04 17:31:27,755] [INFO] [launch.py:315:sigkill_handler] Killing "
            "subprocess 953850",
        ),
        (
            None,
            "[2023-07-04 17:31:27,755] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python3', "
            "'-u', 'infer.py', '--local_rank=0', '--batch_size', '8'] exits with return code = 1",
        ),
    ],
    ("plain",),
    text_rank=True,
)
case(
    "oom_all_ranks_interleaved",
    "oom_gpu",
    5,
    "https://github.com/NVIDIA/nccl/issues/1928",
    [
        (r, ln)
        for r in (5, 2, 7, 0)
        for ln in (
            "Traceback (most recent call last):",
            '  File "train.py", line 212, in <module>',
            "    trainer.train()",
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU {r} has a "
            "total capacity of 79.10 GiB of which 2.31 GiB is free.",
        )
    ],
    ("rank", "default"),
)
case(
    "loader_worker_segfault",
    "dataloader_worker_killed",
    None,
    "https://github.com/MhLiao/DB/issues/94",
    [(None, "ERROR: Unexpected segmentation fault encountered in worker.")]
    + tb(
        None,
        [
            (
                f"{PY}/torch/utils/data/dataloader.py",
                1133,
                "_try_get_data",
                "raise RuntimeError(f'DataLoader worker (pid(s) {pids_str}) exited unexpectedly')",
            )
        ],
        "RuntimeError: DataLoader worker (pid 25902) is killed by signal: Segmentation fault.",
    ),
    ("plain",),
)
case(
    "cuda_fault_first_rank_of_three",
    "cuda_fault",
    2,
    "https://github.com/pytorch/pytorch/issues/180280",
    [
        (2, "[E1107 10:11:12.000000000 ProcessGroupNCCL.cpp:1900] " + ILLEGAL.format(r=2)),
        (
            2,
            "frame #3: c10d::ProcessGroupNCCL::WorkNCCL::finishedGPUExecutionInternal() const + 0x56",
        ),
        (0, "[E1107 10:21:12.000000000 ProcessGroupNCCL.cpp:632] " + watchdog_timeout(0)[30:]),
        (1, "[E1107 10:21:12.000000000 ProcessGroupNCCL.cpp:632] " + watchdog_timeout(1)[30:]),
    ],
    ("rank",),
    text_rank=True,
)
case(
    "ecc_in_rich_box_accelerate",
    "cuda_fault",
    None,
    "https://github.com/huggingface/accelerate/issues/1192",
    tb(
        None,
        [(f"{PY}/torch/nn/modules/module.py", 989, "_apply", "return self._apply(convert)")],
        "RuntimeError: CUDA error: uncorrectable ECC error encountered\nCUDA kernel errors might be "
        "asynchronously reported at some other API call,so the stacktrace below might be "
        "incorrect.",
    )
    + [
        (
            None,
            f"[15:58:29] WARNING  Sending process {p} closing signal SIGTERM"
            + " " * 40
            + "api.py:699",
        )
        for p in (197, 198, 199)
    ],
    ("rich", "plain"),
)
case(
    "rich_exception_then_torchrun",
    "rank_crashed",
    0,
    "https://github.com/yangjianxin1/Firefly/issues/32",
    tb(
        None,
        [
            (
                f"{PY}/transformers/convert_slow_tokenizer.py",
                114,
                "__init__",
                "fast_tokenizer = convert_slow_tokenizer(slow_tokenizer)",
            )
        ],
        "Exception: expected value at line 1 column 1",
    )
    + [
        (
            None,
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) "
            "local_rank: 0 (pid: 24024) of binary: /opt/conda/bin/python",
        )
    ]
    + torchrun_tb(),
    ("rich",),
    text_rank=True,
)
case(
    "exit1_cut_after_bar",
    "rank_crashed",
    3,
    "https://github.com/OEvortex/unsloth/issues/10",
    [(None, "  0%|          | 0/800 [00:22<?, ?it/s]")]
    + [
        (
            None,
            glog(
                "W",
                f"Sending process {p} closing signal SIGTERM",
                t="0801 13:23:17.366000",
                tid="32974",
                where="torch/distributed/elastic/multiprocessing/api.py:900",
            ),
        )
        for p in (33051, 33052, 33053)
    ]
    + [
        (
            None,
            glog(
                "E",
                "failed (exitcode: 1) local_rank: 3 (pid: 33054) of binary: "
                "/home/ubuntu/env/bin/python3",
                t="0801 13:23:20.000000",
                tid="32974",
                where="torch/distributed/elastic/multiprocessing/api.py:874",
            ),
        )
    ]
    + torchrun_tb()[:5],
    ("plain",),
    text_rank=True,
)


case(
    "exit1_table_only_identical_lines",
    "rank_crashed",
    0,
    "https://github.com/Vision-CAIR/MiniGPT-4/issues/237",
    [(None, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ")]
    + table(
        "train.py",
        [
            (0, "n136-117-136.example.org", 1, 78970, "2023-05-19_16:39:58", sig_trace(1, 0)),
            (1, "n136-117-136.example.org", 1, 78971, "2023-05-19_16:39:58", sig_trace(1, 0)),
        ],
    ),
    ("plain", "iso"),
    text_rank=True,
)


# -- classes a blind evaluation on other public reports found missing (our own lines) --------


def _hf(loss, gn, epoch):
    return f"{{'loss': {loss}, 'grad_norm': {gn}, 'learning_rate': 2e-05, 'epoch': {epoch}}}"


case(
    "old_launcher_child_segv",
    "worker_segfault",
    2,
    "https://github.com/pytorch/pytorch/issues/61839",
    tb(
        None,
        [
            (f"{PY}/torch/distributed/launch.py", 255, "main", "sigkill_handler(...)"),
            (f"{PY}/subprocess.py", 512, "run", "raise CalledProcessError(retcode, cmd)"),
        ],
        "subprocess.CalledProcessError: Command '['/usr/bin/python3', '-u', 'finetune.py', "
        "'--local_rank=2', '--epochs', '3']' died with <Signals.SIGSEGV: 11>.",
    )
    + [(None, "*" * 41)],
    ("plain", "iso"),
    text_rank=True,
)
case(
    "table_cut_before_root_trace",
    "worker_sigabrt",
    0,
    "https://github.com/open-mmlab/mmsegmentation/issues/3106",
    table(
        "tools/train.py",
        [
            (0, "lab-ws3", -6, 61002, "2024-02-11_09:14:55", sig_trace(-6, 61002)),
            (1, "lab-ws3", -6, 61003, "2024-02-11_09:14:55", sig_trace(-6, 61003)),
        ],
    )[:-3],
    ("plain",),
    text_rank=True,
)
case(
    "disk_full_behind_job_prefix",
    "disk_full",
    None,
    "https://github.com/databrickslabs/dolly/issues/139",
    [
        (None, f"2024-03-02 11:20:07.412 [41/trainer/7 (pid 5512)] [a3f0c2d1-77aa] {ln}")
        for ln in [
            "Saving model checkpoint to /mnt/out/checkpoint-600",
            "Traceback (most recent call last):",
            f'  File "{PY}/torch/serialization.py", line 441, in save',
            "    _save(obj, opened_zipfile, pickle_module, pickle_protocol)",
            "OSError: [Errno 28] No space left on device",
        ]
    ],
    ("plain",),
)
case(
    "io_error_on_a_rank",
    "io_error",
    1,
    "https://github.com/Mikubill/naifu/issues/35",
    tb(
        1,
        [
            ("/work/train.py", 88, "save_samples", "os.makedirs(out_dir, exist_ok=True)"),
            ("/usr/lib/python3.10/os.py", 225, "makedirs", "mkdir(name, mode)"),
        ],
        "OSError: [Errno 5] Input/output error: '/mnt/nfs/samples'",
    ),
    ("rank", "srun"),
)
case(
    "slurm_time_limit",
    "launcher_signal",
    None,
    "https://github.com/IGNF/myria3d/issues/123",
    [
        (0, "Epoch 3:  41%|████      | 812/1980 [31:02<44:38,  2.29s/it, loss=0.412]"),
        (
            None,
            "slurmstepd: error: *** JOB 88231 ON gpu-node-12 CANCELLED AT "
            "2024-05-02T03:00:11 DUE TO TIME LIMIT ***",
        ),
        (None, "srun: error: gpu-node-12: task 1: Terminated"),
        (None, "srun: error: gpu-node-12: task 0: Terminated"),
    ],
    ("plain",),
)
case(
    "fd_limit_then_shm",
    "too_many_open_files",
    None,
    "https://github.com/facebookresearch/maskrcnn-benchmark/issues/158",
    [
        (
            0,
            "RuntimeError: unable to open shared memory object </torch_4411_2231_0> in "
            "read-write mode: Too many open files (24)",
        )
    ]
    + tb(
        0,
        [
            (
                f"{PY}/torch/multiprocessing/reductions.py",
                322,
                "rebuild_storage_filename",
                "storage = cls._new_shared_filename(manager, handle, size)",
            )
        ],
        "RuntimeError: unable to open shared memory object </torch_4411_2231_1> in read-write mode",
    ),
    ("plain",),
)
case(
    "missing_module_lone_line",
    "missing_module",
    0,
    "https://github.com/togethercomputer/OpenChatKit/issues/175",
    [(0, "ModuleNotFoundError: No module named 'deepspeed'")],
    ("rank", "plain"),
)
case(
    "renamed_training_argument",
    "version_mismatch",
    None,
    "https://github.com/TW-NLP/ChineseErrorCorrector/issues/31",
    tb(
        None,
        [("/work/run_sft.py", 61, "main", "args = TrainingArguments(**cfg)")],
        "TypeError: TrainingArguments.__init__() got an unexpected keyword argument "
        "'evaluation_strategy'",
    ),
    ("plain",),
)
case(
    "grad_norm_nan_zero_loss",
    "loss_anomaly",
    None,
    "https://github.com/Time-MoE/Time-MoE/issues/31",
    [(None, _hf(0.0, "nan", round(0.3 + i / 50, 2))) for i in range(6)],
    ("plain",),
)
case(
    "grad_norm_nan_at_the_end",
    "loss_anomaly",
    None,
    "https://github.com/InternLM/xtuner/issues/187",
    [
        (
            None,
            f"05/11 14:0{i}:12 - mmengine - INFO - Epoch(train) [2][{i * 10 + 10}/512]  "
            f"lr: 1.2e-04  eta: 1:02:11  time: 1.91  data_time: 0.01  memory: 20311  "
            f"loss: {2.1 - i / 20:.4f}  grad_norm: {'nan' if i > 2 else f'{1.1 + i / 9:.4f}'}",
        )
        for i in range(5)
    ],
    ("plain",),
)
case(
    "metric_logger_inf_loss",
    "loss_anomaly",
    None,
    "https://github.com/facebookresearch/dinov2/issues/143",
    [
        (
            None,
            f"I0202 09:1{i}:00 77 ssl helpers.py:99] Training  [{i * 20:>6}/125000]  eta: 9 "
            f"days, 1:00:00  lr: 0.0001 (0.0001)  total_loss: inf (inf)",
        )
        for i in range(1, 5)
    ],
    ("plain",),
)

case(
    "signal_handler_segv",
    "worker_segfault",
    None,
    "https://github.com/pytorch/pytorch/issues/10344",
    [
        (None, "*** Process received signal ***"),
        (None, "[gpu-w07:20931] Signal: Segmentation fault (11)"),
        (None, "[gpu-w07:20931] Signal code: Address not mapped (1)"),
        (None, "[gpu-w07:20931] Failing at address: 0x7f3c00000010"),
        (None, "[gpu-w07:20931] [ 0] /lib/x86_64-linux-gnu/libpthread.so.0(+0x12890)"),
    ],
    ("plain",),
)
case(
    "hip_device_assertion",
    "cuda_fault",
    None,
    "https://github.com/mosaicml/composer/issues/2758",
    [
        (
            None,
            "/pytorch/aten/src/ATen/native/hip/Indexing.hip:1301: indexSelectSmallIndex: "
            "Device-side assertion `srcIndex < srcSelectDimSize' failed.",
        )
    ]
    * 3
    + tb(
        None,
        [("/work/model.py", 40, "forward", "x = self.embed(ids)")],
        "RuntimeError: HIP error: device-side assert triggered",
    ),
    ("plain",),
)
case(
    "bf16_weights_fp32_input",
    "dtype_mismatch",
    None,
    "https://github.com/OpenGVLab/DCNv4/issues/24",
    tb(
        None,
        [("/work/ops/deform.py", 77, "forward", "out = ext.forward(x, offset, w)")],
        "RuntimeError: expected scalar type Float but found BFloat16",
    ),
    ("plain", "rank"),
)
case(
    "megatron_nan_grad_no_loss_field",
    "loss_anomaly",
    None,
    "https://github.com/bigscience-workshop/Megatron-DeepSpeed/issues/396",
    [
        (
            None,
            f" iteration {i:8d}/  300000 | consumed samples: {i * 16:12d} | elapsed time per "
            f"iteration (ms): 3911.{i % 10} | learning rate: 2.500E-04 | global batch size:    "
            f"16 | loss scale: 1.0 | grad norm: nan | number of skipped iterations:   0 |",
        )
        for i in range(1200, 1205)
    ],
    ("plain",),
)

case(
    "traceback_cut_above_its_header",
    "rank_crashed",
    3,
    "https://github.com/hiyouga/LLaMA-Factory/issues/5871",
    [
        (3, '  File "/srv/app/data/loader.py", line 91, in load_one'),
        (3, '    raise ValueError(f"File {path} not found.")'),
        (3, "ValueError: File data/my_set.json not found."),
    ]
    + tb(1, [("/srv/app/launcher.py", 12, "<module>", "run_exp()")], "")[:3],
    ("rank",),
    text_rank=True,
)
case(
    "state_dict_shape_mismatch_wrapped",
    "checkpoint_mismatch",
    None,
    "https://github.com/kohya-ss/sd-scripts/issues/1340",
    [
        (None, "RuntimeError: Error(s) in loading state_dict for LoRANetwork:"),
        (None, "        size mismatch for"),
        (None, "lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight: copying a param"),
        (None, "with shape torch.Size([4, 768]) from checkpoint, the shape in current"),
        (None, "model is torch.Size([32, 768])."),
    ],
    ("plain",),
)
case(
    "nccl_work_timeout_new_wording",
    "nccl_timeout",
    2,
    "https://github.com/pytorch/pytorch/issues/115388",
    [
        (
            2,
            "[PG 0 Rank 2] Timeout at NCCL work: 5121, last enqueued NCCL work: 5121, last "
            "completed NCCL work: 5120.",
        ),
        (
            2,
            "[PG 0 Rank 2] Some NCCL operations have failed or timed out. Due to the "
            "asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
            "corrupted/incomplete data.",
        ),
    ],
    ("rank", "plain"),
    text_rank=True,
)

# -- hang forensics and the classes of issue 29: several ranks report, one is to blame ------
case(
    "nccl_timeout_missing_rank_reports_last",
    "nccl_timeout|rank_missing_from_collective",
    2,
    "https://github.com/pytorch/pytorch/issues/115388",
    [(r, watchdog_timeout(r, seq=5121)) for r in (0, 1, 3)]
    + [
        (
            r,
            f"[PG 0 Rank {r}] Timeout at NCCL work: 5121, last enqueued NCCL work: 5121, last "
            "completed NCCL work: 5120.",
        )
        for r in (3, 0, 1)
    ]
    + [
        (
            2,
            "[PG 0 Rank 2] Timeout at NCCL work: 5120, last enqueued NCCL work: 5120, last "
            "completed NCCL work: 5119.",
        )
    ],
    ("rank", "srun"),
)
case(
    "ds_loss_scale_collapse_then_torchrun",
    "fp16_overflow",
    1,
    "https://github.com/ymcui/Chinese-LLaMA-Alpaca/issues/534",
    [
        (
            1,
            f"[deepspeed] OVERFLOW! Rank 1 Skipping step. Attempted loss scale: {2**k}, "
            f"reducing to {2 ** (k - 1)}",
        )
        for k in (4, 3, 2, 1)
    ]
    + tb(
        1,
        [
            ("train.py", 210, "train", "model.step()"),
            (
                f"{PY}/deepspeed/runtime/fp16/loss_scaler.py",
                183,
                "update_scale",
                "raise Exception(",
            ),
        ],
        "Exception: Current loss scale already at minimum - cannot decrease scale anymore. "
        "Exiting run.",
    )
    + [(None, closing(5101)), (None, failed_line(1, 1, 5102))]
    + torchrun_tb(),
    ("rank", "plain"),
)
case(
    "fatal_python_aborted_thread_dumps",
    "worker_sigabrt",
    1,
    "https://github.com/deepspeedai/DeepSpeed/issues/3989",
    [
        (1, "Fatal Python error: Aborted"),
        (1, ""),
        (1, "Thread 0x00007f51d2ffd640 (most recent call first):"),
        (1, f'  File "{PY}/torch/utils/data/_utils/pin_memory.py", line 54 in _pin_memory_loop'),
        (1, '  File "/usr/lib/python3.10/threading.py", line 953 in run'),
        (1, ""),
        (1, "Current thread 0x00007f52a4e3f740 (most recent call first):"),
        (1, f'  File "{PY}/torch/autograd/graph.py", line 768 in _engine_run_backward'),
        (1, '  File "train.py", line 88 in step'),
        (None, closing(7001)),
        (None, failed_line(-6, 1, 7002)),
    ],
    ("rank", "iso", "clockrank"),
    text_rank=True,
)
case(
    "ddp_param_mismatch_echoed",
    "rank_crashed",
    1,
    "https://github.com/NVIDIA/nccl/issues/1928",
    tb(
        1,
        [("train.py", 61, "main", "model = DDP(model, device_ids=[local_rank])")],
        "RuntimeError: DDP expects same model across all ranks, but Rank 1 has 290 params, "
        "while rank 0 has inconsistent 291 params.",
    )
    + tb(
        0,
        [("train.py", 61, "main", "model = DDP(model, device_ids=[local_rank])")],
        "RuntimeError: DDP expects same model across all ranks, but Rank 0 has 291 params, "
        "while rank 1 has inconsistent 290 params.",
    ),
    ("rank", "interleave"),
)
case(
    "safetensors_save_disk_full",
    "checkpoint_write_failed|disk_full",
    0,
    "https://github.com/huggingface/transformers/issues/25237",
    tb(
        0,
        [
            ("train.py", 140, "save", "model.save_pretrained(out)"),
            (
                f"{PY}/safetensors/torch.py",
                286,
                "save_file",
                "serialize_file(_flatten(tensors), filename, metadata=metadata)",
            ),
        ],
        "safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 28, "
        'kind: StorageFull, message: "No space left on device" })',
    ),
    ("rank", "plain"),
)
case(
    "rank_sigbus",
    "worker_segfault",
    3,
    "https://github.com/vllm-project/vllm/issues/4108",
    [(None, closing(9201)), (None, failed_line(-7, 3, 9204))] + torchrun_tb(),
    ("plain",),
    text_rank=True,
)


# -- healthy logs ----------------------------------------------------------------------------

HEALTHY: dict[str, tuple] = {}


def healthy(name, url, lines, variants=("plain",)):
    HEALTHY[name] = (url, lines, variants)


OFI = [
    nccl("ip-10-0-1-5", 77, i, "INFO", msg)
    for i, msg in enumerate(
        (
            "NCCL version 2.18.3+cuda12.1",
            "NET/OFI Initializing aws-ofi-nccl 1.7.1-aws",
            "NET/Plugin: Loaded net plugin AWS Libfabric (v6)",
        )
    )
]
healthy(
    "nccl_ofi_probe_single_node",
    "https://github.com/aws/aws-ofi-nccl/issues/174",
    [(0, ln) for ln in OFI]
    + [
        (0, nccl("ip-10-0-1-5", 77, 0, "WARN", "NET/OFI Only EFA provider is supported")),
        (0, nccl("ip-10-0-1-5", 77, 0, "WARN", "NET/OFI aws-ofi-nccl initialization failed")),
        (0, nccl("ip-10-0-1-5", 77, 0, "INFO", "NET/IB : No device found.")),
        (0, nccl("ip-10-0-1-5", 77, 0, "INFO", "NET/Socket : Using [0]ens5:10.0.1.5<0>")),
        (0, nccl("ip-10-0-1-5", 77, 0, "INFO", "Using network Socket")),
        (
            0,
            nccl(
                "ip-10-0-1-5",
                77,
                0,
                "INFO",
                "comm 0x55d1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0",
            ),
        ),
        (0, nccl("ip-10-0-1-5", 77, 0, "INFO", "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC")),
        (0, nccl("ip-10-0-1-5", 77, 0, "INFO", "Connected all rings")),
    ]
    + hf_dicts(5),
    ("plain", "rank"),
)
healthy(
    "nccl_libibverbs_single",
    "https://github.com/aws/deep-learning-containers/issues/2675",
    [
        (0, nccl("box", 9, 0, "INFO", "Failed to open libibverbs.so[.1]")),
        (0, nccl("box", 9, 0, "INFO", "NET/Socket : Using [0]eth0:172.17.0.2<0>")),
        (0, nccl("box", 9, 0, "INFO", "Using network Socket")),
    ]
    + hf_dicts(4),
)
healthy(
    "c10d_client_retry",
    "https://github.com/pytorch/PiPPy/issues/158",
    [
        (
            None,
            "[W socket.cpp:464] [c10d] The client socket has failed to connect to "
            "[localhost]:29500 (errno: 99 - Cannot assign requested address).",
        )
    ]
    + hf_dicts(6),
    ("plain", "default"),
)
healthy(
    "ipv6_bind_then_ok",
    "https://github.com/pytorch/pytorch/issues/85604",
    [
        (
            None,
            "[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:29500 "
            "(errno: 98 - Address already in use).",
        )
    ]
    + hf_dicts(5),
)
healthy(
    "fp16_overflow_early",
    "https://github.com/deepspeedai/DeepSpeed/issues/2302",
    [
        (
            0,
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, "
            "reducing to 32768",
        )
    ]
    + [
        (
            0,
            f"[2024-01-01 10:00:{i:02d},000] [INFO] [logging.py:96:log_dist] [Rank 0] step="
            f"{i * 10}, skipped=1, lr=[1e-05], mom=[(0.9, 0.999)]",
        )
        for i in range(1, 6)
    ],
)
healthy(
    "ddp_unused_warning",
    "https://github.com/cszn/KAIR/issues/103",
    [
        (
            0,
            "[W reducer.cpp:1300] Warning: find_unused_parameters=True was specified in DDP "
            "constructor, but did not find any unused parameters in the forward pass.",
        )
    ]
    + hf_dicts(5),
    ("rank",),
)
healthy(
    "warnings_and_userwarnings",
    "https://github.com/acon96/home-llm/issues/37",
    [
        (
            0,
            f"{PY}/torch/utils/checkpoint.py:429: UserWarning: torch.utils.checkpoint: please "
            "pass in use_reentrant=True or use_reentrant=False explicitly.",
        ),
        (
            0,
            "`use_cache=True` is incompatible with gradient checkpointing. Setting "
            "`use_cache=False`.",
        ),
    ]
    + hf_dicts(8),
    ("plain", "iso"),
)
healthy(
    "rich_progress_ok",
    "https://github.com/Lightning-AI/pytorch-lightning/issues/4225",
    [
        (
            0,
            f"Epoch 0:  {p:3d}%|{'█' * (p // 10):<10}| {p * 10}/1000 [00:{p // 2:02d}<00:50, "
            f"19.8it/s, v_num=3, train_loss={2.5 - p / 100:.3f}]",
        )
        for p in range(10, 100, 20)
    ],
    ("plain", "ansi"),
)

healthy(
    "multinode_socket_fallback",
    "https://github.com/NVIDIA/nccl/issues/1232",
    [
        (0, nccl("node0", 13571, 0, "INFO", "NET/IB : No device found.")),
        (0, nccl("node0", 13571, 0, "INFO", "NET/Socket : Using [0]eth0:10.0.0.1<0>")),
        (1, nccl("node2", 22555, 0, "INFO", "NET/IB : No device found.")),
        (
            0,
            nccl(
                "node0",
                13571,
                0,
                "INFO",
                "comm 0x5583 rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0",
            ),
        ),
        (0, nccl("node0", 13571, 0, "INFO", "Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0")),
        (0, nccl("node0", 13571, 0, "INFO", "Connected all rings")),
    ]
    + hf_dicts(4),
    ("plain", "mpitag"),
)
healthy(
    "torchrun_banner_and_teardown",
    "https://github.com/pytorch/pytorch/issues/85604",
    [
        (None, "WARNING:torch.distributed.run:"),
        (None, "*" * 41),
        (
            None,
            "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, "
            "to avoid your system being overloaded, please further tune the variable for "
            "optimal performance in your application as needed.",
        ),
        (None, "*" * 41),
    ]
    + hf_dicts(6)
    + [
        (
            0,
            "{'train_runtime': 61.2, 'train_samples_per_second': 3.1, "
            "'train_loss': 1.93, 'epoch': 1.0}",
        )
    ],
)
healthy(
    "dataloader_data_time_small",
    "https://github.com/pytorch/examples/issues/164",
    [
        (
            0,
            f"Epoch: [0][{i:4d}/5005]\tTime  0.31{i % 10} ( 0.320)\tData  0.00{i % 10} ( 0.004)\t"
            f"Loss 6.9{i % 10} (6.9100)",
        )
        for i in range(10, 60, 10)
    ],
)


# -- variants ------------------------------------------------------------------------------


def render(lines, variant):
    out = []
    stamp = iter(range(10**6))
    for r, ln in lines:
        if (
            variant == "plain"
            or variant.startswith(("cut", "wrap"))
            or variant in ("interleave", "tmux", "rich", "glogish")
        ):
            out.append(ln)
        elif variant == "rank":
            out.append(f"[rank{r}]:{ln}" if r is not None else ln)
        elif variant == "default":
            out.append(f"[default{r}]:{ln}" if r is not None else ln)
        elif variant == "srun":
            out.append(f"{r}: {ln}" if r is not None else ln)
        elif variant == "iso":
            out.append(f"2024-05-14T09:12:{next(stamp) % 60:02d}.123456Z {ln}")
        elif variant == "clockrank":
            out.append(f"18:11:06.680 [rank{r}]:{ln}" if r is not None else f"18:11:06.680 {ln}")
        elif variant == "k8s":
            out.append(f"[pod/train-worker-0/pytorch] 2024-05-14T09:12:00.000Z {ln}")
        elif variant == "pdsh":
            out.append(f"worker-2: {ln}" if r is None else f"node-b: [rank{r}]:{ln}")
        elif variant == "determined":
            out.append(
                f"[2024-02-27T21:35:32.106313Z] fa88a9df [rank={r}] || {ln}"
                if r is not None
                else f"[2024-02-27T21:35:32.106313Z] fa88a9df || {ln}"
            )
        elif variant == "torchx":
            out.append(f"[trainer0|{r}]:{ln}" if r is not None else ln)
        elif variant == "mpitag":
            out.append(f"[{r}] {ln}" if r is not None else ln)
        elif variant == "ray":
            out.append(f"(RayWorker pid=70{r or 0}) {ln}")
        elif variant == "dslog":
            out.append(
                ln
                if r is None
                else f"[2024-03-01 10:00:00,000] [ERROR] [engine.py:1:x] {ln}"
                if ln.startswith(("RuntimeError", "Exception"))
                else ln
            )
        elif variant == "ansi":
            out.append(re.sub(r"(Error|ERROR|error|Exception)", "\x1b[1;31m\\1\x1b[0m", ln))
        else:
            raise ValueError(variant)
    if variant == "glogish":  # every launcher line through Python logging
        out = [f"[2025-06-01 08:00:0{i % 10},000] {ln}" for i, ln in enumerate(out)]
    if variant.startswith("cut"):
        out = out[int(variant[3:]) :]
    if variant.startswith("wrap"):
        w = int(variant[4:])
        out = [
            piece for ln in out for piece in ([ln[i : i + w] for i in range(0, len(ln), w)] or [""])
        ]
    if variant == "interleave":  # two ranks' lines alternate, prefixed as torchrun does
        out = [
            f"[rank{r}]:{ln}" if r is not None else ln
            for r, ln in sorted(lines, key=lambda x: lines.index(x) % 3)
        ]
    if variant == "tmux":
        out += ["", '[train] 0:python*                                  "gpu-box" 10:42 01-Dec-24']
    if variant == "rich":
        out = _rich(lines)
    return "\n".join(out) + "\n"


def _rich(lines):
    """The traceback as rich prints it: boxed frames, the exception below the box."""
    out, box = [], False
    for _, ln in lines:
        if ln.startswith("Traceback"):
            out.append("╭" + "─" * 30 + " Traceback (most recent call last) " + "─" * 30 + "╮")
            box = True
        elif box and ln.startswith("  "):
            out.append("│ " + ln.strip().ljust(93) + " │")
        elif box:
            out.append("╰" + "─" * 95 + "╯")
            out.append(ln)
            box = False
        else:
            out.append(ln)
    return out


def main() -> None:
    import shutil

    shutil.rmtree(OUT, ignore_errors=True)
    (OUT / "failures").mkdir(parents=True)
    (OUT / "healthy").mkdir(parents=True)
    manifest = {"failures": {}, "healthy": {}}
    for name, (cat, rank, host, url, lines, variants, text_rank) in CASES.items():
        for v in variants:
            fn = f"{name}__{v}.log"
            (OUT / "failures" / fn).write_text(render(lines, v))
            manifest["failures"][fn] = {
                "category": cat,
                "rank": rank if text_rank or v in SHOWS_RANK else None,
                "host": host if v in SHOWS_HOST or (host and text_rank) else None,
                "source": url,
                "variant": v,
            }
    for name, (url, lines, variants) in HEALTHY.items():
        for v in variants:
            fn = f"{name}__{v}.log"
            (OUT / "healthy" / fn).write_text(render(lines, v))
            manifest["healthy"][fn] = {"source": url, "variant": v}
    (HERE / "written.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    print(len(manifest["failures"]), "failure cases,", len(manifest["healthy"]), "healthy")


if __name__ == "__main__":
    main()
