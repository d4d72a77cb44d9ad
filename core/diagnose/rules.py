"""Log signatures → finding categories, each with the cause and the fix in the user's terms.

A `Rule` matches one logical line (rank prefix already stripped). Rules are tried in order and
the first match wins, so specific signatures come before general ones. `NOISE` lines are known
to be harmless and never match a rule. Everything that needs more than one line (tracebacks,
torchrun's failure report, NCCL summaries, metric records) lives in scan.py / engine.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tunedeck.core.ingest.parsers.nccl import FACT_TOKENS as NCCL_FACT_TOKENS


@dataclass(frozen=True)
class Rule:
    category: str
    severity: str
    pattern: re.Pattern
    summary: str  # may use {m0} (the whole match) and named groups
    cause: str
    fix: str


def _r(category, severity, pattern, summary, cause, fix, flags=0) -> Rule:
    return Rule(category, severity, re.compile(pattern, flags), summary, cause, fix)


OOM_GPU_FIX = (
    "Lower train.per_device_batch_size (keep the effective batch with grad_accum), "
    "enable gradient checkpointing, shorten max_length, use LoRA/QLoRA, or shard "
    "the model (FSDP2 / ZeRO-3). If the message shows much reserved-but-unallocated "
    "memory, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
)

# SIGKILL cannot be caught, so the killed process writes nothing: what sends it and how to
# tell which one did (a rank's, torchrun's and a printed `Killed` line's findings all say it)
SIGKILL_CAUSE = (
    "Something killed the process with SIGKILL, which cannot be caught, so it "
    "wrote nothing: most often the kernel's OOM killer (the host ran out of RAM, "
    "or the job's cgroup hit its memory limit), else a scheduler or a user's "
    "`kill -9`."
)
SIGKILL_CHECK = (
    "See whether the OOM killer did it: `dmesg -T | grep -i -E 'out of memory|"
    "killed process{pid}'` or `journalctl -k{since} | grep -i -E 'out of memory|"
    "killed process'` on that host; check host RAM (`free -g`) and the cgroup's "
    "limit and OOM count (`cat /sys/fs/cgroup/memory.max "
    "/sys/fs/cgroup/memory.events`; a Slurm job: `sacct -j JOB -o "
    "JobID,State,MaxRSS,ReqMem`). No OOM kill logged: the scheduler, a script or "
    "another user sent `kill -9` (the scheduler's log, `last`, who shares the "
    "account)."
)
SIGKILL_FIX = (
    SIGKILL_CHECK.format(pid="", since="") + " An OOM kill: lower host memory use "
    "(fewer dataloader workers, lazy tokenization, smaller prefetch), run fewer "
    "ranks per node, or ask for more memory."
)

CHECKPOINT_FULL_SUMMARY = "checkpoint save failed: the disk (or quota) is full"
CHECKPOINT_FULL_CAUSE = (
    "Writing a checkpoint failed part-way because its filesystem ran out of space (or the "
    "user's quota): checkpoints are the largest files a run writes, so a full disk shows "
    "first there. PyTorch's zip writer reports the short write as `unexpected pos N vs M` / "
    "`PytorchStreamWriter failed writing file ...: file write failed` rather than as "
    "errno 28; safetensors, save_pretrained and plain file writes say `No space left on "
    "device` or `Disk quota exceeded`. The program did not fail; its output disk did."
)
CHECKPOINT_FULL_FIX = (
    "Free space where checkpoints go (`df -h` and `df -i` on the output folder; `quota -s` "
    "for a quota), or point the output at a bigger disk (run.output_dir; ms-swift/HF "
    "--output_dir); keep fewer checkpoints (train.save_total_limit / --save_total_limit, "
    "--save_only_model to skip optimizer states) or save less often. Then resume from the "
    "last complete checkpoint; the one being written is incomplete."
)

# frames of a traceback that was writing a checkpoint (torch.save, safetensors, HF/PEFT
# save_pretrained, the trainers' save functions, torch.distributed.checkpoint): a full disk
# met there is a failed checkpoint save
CHECKPOINT_SAVE_FRAMES = re.compile(
    r"torch/serialization\.py|safetensors/|torch/distributed/checkpoint/"
    r"|tunedeck/core/train/checkpoint\.py|core/train/checkpoint\.py"
    r"|, in (?:save|_save|save_pretrained|save_model|_save_checkpoint|save_checkpoint"
    r"|save_file|save_state|_save_optimizer_and_scheduler|_save_rng_state|write_record"
    r"|_write_files|_save_to_state_dict)\b"
)


# an exception that says a write failed without saying why (the C++ stream error torch's zip
# writer raises first on a full disk); inside a checkpoint save it is that save failing
WRITE_FAILED = re.compile(
    r"basic_ios::clear|iostream error|write\(\): fd \d+ failed"
    r"|[Ww]rite failed"
)


def saving_checkpoint(lines) -> bool:
    """A traceback (its lines) that failed while writing a checkpoint."""
    return any(CHECKPOINT_SAVE_FRAMES.search(ln) for ln in lines)


LOOPBACK = "loopback_address"

RULES: list[Rule] = [
    _r(
        "oom_gpu",
        "error",
        r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|HIP out of memory"
        r"|NCCL WARN .*Cuda failure 'out of memory'|CUDA error: out of memory"
        r"|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|No executable batch size found"
        r"|out of memory on device \d|Out of memory while trying to allocate",
        "GPU out of memory",
        "The process asked the GPU for more memory than was free.",
        OOM_GPU_FIX,
    ),
    _r(
        "oom_host",
        "error",
        r"DefaultCPUAllocator: (?:can't allocate|not enough) memory|^MemoryError\b|"
        r"std::bad_alloc|Cannot allocate memory|Out of memory: Killed process|oom-kill"
        r"|_ArrayMemoryError|Unable to allocate [\d.]+ [KMGT]i?B for an array"
        r"|oom_kill_process|Memory cgroup out of memory|OOMKilled",
        "host (CPU) out of memory",
        "The machine ran out of RAM (or the process hit its memory limit).",
        "Use fewer dataloader workers, stream or lazily tokenize the dataset, load the model "
        "with low_cpu_mem_usage / in the compute dtype, or run fewer ranks per node.",
    ),
    # before the NCCL rules: the watchdog reports a CUDA fault it found, and the fault is the
    # cause (the watchdog's abort and the peers' timeouts follow from it)
    _r(
        "cuda_fault",
        "error",
        r"an illegal memory access was encountered|cudaErrorIllegalAddress"
        r"|CUDA_ERROR_ILLEGAL_ADDRESS|an illegal instruction was encountered"
        r"|cudaErrorIllegalInstruction|device-side assert triggered|Assertion `[^`]+` failed"
        r"|Device-side assertion `[^`']+' failed|hipErrorIllegalAddress"
        r"|CUDA error: (?:unspecified launch failure|misaligned address|unknown error"
        r"|the launch timed out|operation not permitted when stream is capturing)"
        r"|uncorrectable ECC error|ECC error encountered|cudaErrorECCUncorrectable"
        r"|GPU has fallen off the bus|unhandled cuda error|NVRM: Xid",
        "CUDA fault on the GPU",
        "A GPU kernel failed: an out-of-bounds read or write (often an index out of range, "
        "e.g. a token id ≥ vocab size or a label outside the classes), a device-side "
        "assertion, a kernel or driver bug, or a hardware fault (ECC, Xid). CUDA reports it "
        "asynchronously, so it often surfaces in NCCL's watchdog rather than at the op.",
        "Re-run with CUDA_LAUNCH_BLOCKING=1 to see the failing op; check token ids against the "
        "vocab size and the tokenizer/model pairing; try without custom kernels "
        "(flash-attn, liger) to rule them out. ECC / Xid / fallen off the bus: check "
        "`nvidia-smi -q -d ECC` and dmesg, and take the GPU out of service.",
    ),
    # the watchdog saw no progress at all: a hang, whatever collective was running
    _r(
        "stall",
        "error",
        r"Heartbeat monitor timed out|watchdog got stuck for \d+ seconds"
        r"|due to ProcessGroupNCCL watchdog hang|detected no heartbeat of its watchdog"
        r"|ProcessGroupNCCL watchdog hang",
        "the run hung: NCCL's watchdog saw no progress",
        "A collective or a CUDA call never returned, so ProcessGroupNCCL's heartbeat monitor "
        "killed the process: a rank stuck outside the collective (data loading, a deadlock, a "
        "rank-0-only step), a GPU or driver hang, or a network stall between nodes.",
        "Find the rank that is not where the others are (py-spy dump --pid <pid> on each rank, "
        "or `tunedeck stacks`); make every rank run the same collectives; if one step is "
        "legitimately long, raise TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC and the process-group "
        "timeout.",
    ),
    _r(
        "nccl_timeout",
        "error",
        r"Watchdog caught collective operation timeout|collective operation timeout"
        r"|Timed out waiting \d+ms for (?:recv|send) operation|NCCL communicator was aborted"
        r"|ncclTimeout|Gloo.*timed out| milliseconds before timing out"
        r"|Timeout at NCCL work: \d+",
        "collective operation timed out",
        "A collective (all-reduce, barrier, ...) did not complete on all ranks within the "
        "process-group timeout: one rank never reached it (stuck in data loading, a hang, a "
        "different code path) or the network between ranks stalled.",
        "Look at what the rank named in the summary was doing (py-spy dump --pid <pid>). Make sure "
        "every rank runs the same collectives in the same order (same number of batches per "
        "rank, no rank-0-only work inside the loop); raise the timeout only for long "
        "one-off work such as checkpointing or evaluation on one rank.",
    ),
    # a rank dialed a peer's loopback address: that peer's node announced 127.x (gloo binds
    # what the hostname resolves to when no interface is named); loopback.py names the node
    # and the interface from what each node recorded
    _r(
        LOOPBACK,
        "error",
        r"remote=\[127\.[\d.]+\]|\] connect \[127\.[\d.]+\]|Connect to 127\.[\d.]+<",
        "a rank dialed a peer at a loopback address",
        "A rank of another node announced a loopback address to its peers, so they dialed "
        "their own machine and were refused, and the first collective failed or hung. gloo "
        "binds the address the node's hostname resolves to (127.0.0.1 on many images and "
        "containers) unless an interface is named.",
        "Set cluster.interface to the interface that routes to cluster.master_addr on every "
        "node (`ip route get <master_addr>` shows it; GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME "
        "in env per node), and run `tunedeck preflight`: its net.interface check asks every "
        "node.",
    ),
    _r(
        "nccl_version_mismatch",
        "error",
        r"NCCL version mismatch|ncclInvalidUsage.*version|incompatible NCCL versions?",
        "NCCL versions differ between ranks",
        "Ranks loaded different NCCL libraries, so they cannot talk to each other.",
        "Use the same environment (torch build, nvidia-nccl-cu* wheel, LD_LIBRARY_PATH) "
        "on every node.",
    ),
    # NCCL probing its network plugins: fine on one node, TCP between nodes (chain.py decides)
    _r(
        "nccl_socket_fallback",
        "info",
        r"NET/OFI Only EFA provider is supported|NET/OFI [^\n]*(?:[Ff]ailed|Unable|not supported)"
        r"|Failed to open libibverbs|NET/IB : No device found|No IB devices? found"
        r"|NET/Plugin ?: [^\n]*(?:[Nn]o plugin|Could not find|Plugin load|[Ff]ailed)"
        r"|Could not find: libnccl-net|libnccl-net[\w.-]*: cannot open|aws-ofi-nccl",
        "NCCL found no fast network plugin (InfiniBand / EFA) and uses TCP sockets",
        "NCCL probes its network plugins at start; none was usable, so traffic between nodes "
        "goes over TCP sockets.",
        "On one node nothing to do (GPUs talk over NVLink/PCIe). Across nodes, install the "
        "RDMA stack (rdma-core / MOFED, aws-ofi-nccl on EFA) and expose the devices to the job, "
        "or expect inter-node all-reduce at TCP speed.",
    ),
    _r(
        "nccl_network",
        "error",
        r"NCCL WARN .*(?:Connection (?:closed|reset|refused)|Net ?: |NET/|socket|Socket)"
        r"|NCCL error.*(?:remote process exited|network error|ncclRemoteError|ncclSystemError)"
        r"|ncclRemoteError|unhandled system error|ncclSystemError|ncclInternalError"
        r"|socketProgress|Got completion from peer|ibv_poll_cq|Call to ibv_\w+ failed"
        r"|no socket interface found|does not loop back|NET/IB[^\n]*(?:error|Error)",
        "NCCL network error",
        "NCCL lost or could not open a connection between ranks: a peer died, the network "
        "interface is wrong or blocked by a firewall, or the link failed.",
        "Check that the earliest failing rank did not crash first. Pin the interface with "
        "NCCL_SOCKET_IFNAME=<iface> (the one the nodes reach each other on), open the ports "
        "between nodes, and run with NCCL_DEBUG=INFO to see the transport.",
    ),
    _r(
        "port_in_use",
        "error",
        r"EADDRINUSE|[Aa]ddress already in use|Only one usage of each socket address"
        r"|errno: 98|failed to listen on any local network address|Address in use",
        "rendezvous port already in use",
        "torchrun could not listen on the master port: another job (or a leftover process "
        "from an earlier run) holds it.",
        "Pick another port (cluster.master_port, or `auto`), or find the holder with "
        "`ss -ltnp | grep <port>` and stop it.",
    ),
    _r(
        "rendezvous_unreachable",
        "error",
        r"RendezvousTimeoutError|RendezvousClosedError|DistStoreError: Timed out after"
        r"|The client socket has (?:failed to connect|timed out)|"
        r"RendezvousConnectionError(?!.*failed to shutdown)|Connection refused.*(?:store|rendezvous)"
        r"|Timed out initializing process group in store based barrier"
        r"|DistNetworkError: [^\n]*(?:timed out|[Cc]onnection refused|failed to connect)"
        r"|Socket Timeout|wait timeout after \d+ms, keys:",
        "rendezvous failed: nodes could not meet",
        "Not every node joined the rendezvous in time: a node was not started, started too "
        "late, cannot reach the master address/port, or used a different rdzv id or node count.",
        "Start all nodes with the same --nnodes, rdzv id and endpoint; check that the master "
        "address resolves and the port is open from every node (nc -zv <addr> <port>); "
        "raise join_timeout if nodes start far apart.",
    ),
    # before the /dev/shm rule: torch words it "Too many open files. Communication with the
    # workers is no longer possible", and the fix is the fd limit, not the shm size
    _r(
        "too_many_open_files",
        "error",
        r"Too many open files|EMFILE|received 0 items of ancdata",
        "too many open files",
        "The process hit its open-file limit (DataLoader workers sharing tensors by file "
        "descriptor, many dataset shards).",
        "Raise the limit (ulimit -n 65536) or use "
        "torch.multiprocessing.set_sharing_strategy('file_system').",
    ),
    _r(
        "dataloader_shm",
        "error",
        r"insufficient shared memory|unable to write to file </torch_|No space left on device.*shm"
        r"|killed by signal: Bus error|unable to (?:open|mmap) shared memory",
        "DataLoader out of shared memory (/dev/shm)",
        "DataLoader workers pass batches through /dev/shm, which is too small (Docker "
        "defaults to 64 MB).",
        "Run the container with --shm-size=16g (or --ipc=host), lower "
        "dataloader_num_workers, or set the sharing strategy to file_system.",
    ),
    # a checkpoint written onto a full disk: before disk_full (safetensors' wording also says
    # "No space left on device"); a disk_full line inside a save's traceback is renamed to this
    # in engine.py
    _r(
        "checkpoint_write_failed",
        "error",
        r"\bunexpected pos \d+ vs \d+|PytorchStreamWriter failed writing"
        r"|Error while serializing: I/?[Oo] ?[Ee]rror",
        CHECKPOINT_FULL_SUMMARY,
        CHECKPOINT_FULL_CAUSE,
        CHECKPOINT_FULL_FIX,
    ),
    # after the /dev/shm rule (its "No space left on device" names shm)
    _r(
        "disk_full",
        "error",
        r"No space left on device|\[Errno 28\]|Disk quota exceeded|\[Errno 122\]"
        r"|database or disk is full|ENOSPC",
        "the disk is full",
        "A write failed because the filesystem (or the user's quota) is full: checkpoints, "
        "logs, the dataset cache or a temp folder filled it.",
        "Free space or point the output elsewhere (run.output_dir, HF_HOME, TMPDIR); keep "
        "fewer checkpoints (save_total_limit); check `df -h` and `df -i` on that path.",
    ),
    _r(
        "io_error",
        "error",
        r"\[Errno 5\] Input/output error|Stale file handle|\[Errno 116\]"
        r"|Transport endpoint is not connected|\[Errno 121\] Remote I/O error"
        r"|Read-only file system|\[Errno 30\]",
        "storage I/O error",
        "The filesystem failed a read or write: a network or FUSE mount dropped, a disk "
        "error, or a filesystem remounted read-only after an error.",
        "Check the mount (`mount`, `dmesg` for I/O errors) and its server; write checkpoints "
        "and caches to local disk and copy them out; retry once the mount is back.",
    ),
    _r(
        "dataloader_worker_killed",
        "error",
        r"DataLoader worker \(pid(?:\(s\))?[^)]*\) (?:is killed by signal|exited unexpectedly)",
        "a DataLoader worker died",
        "A data-loading worker process was killed (usually the kernel's OOM killer, since "
        "each worker holds a copy of the dataset) or crashed in the dataset code.",
        "Check `dmesg | grep -i kill` for the OOM killer; lower dataloader_num_workers or "
        "memory per worker (lazy tokenization); run with num_workers=0 to see a dataset "
        "exception directly.",
    ),
    _r(
        "ddp_unused_parameters",
        "warning",
        r"find_unused_parameters=True was specified in DDP constructor, but did not find any",
        "DDP searches for unused parameters needlessly",
        "find_unused_parameters=True makes DDP walk the graph every step, but every parameter "
        "got a gradient.",
        "Set find_unused_parameters=False (ms-swift/HF: --ddp_find_unused_parameters false).",
    ),
    _r(
        "ddp_unused_parameters",
        "error",
        r"Expected to have finished reduction in the prior iteration|"
        r"parameters that were not used in producing (?:the )?loss"
        r"|did not receive grad for rank \d+",
        "DDP: parameters received no gradient",
        "Some trainable parameters did not take part in the loss, so DDP waited for their "
        "gradients forever.",
        "Freeze parameters you do not train, or set find_unused_parameters=True "
        "(--ddp_find_unused_parameters true); with gradient checkpointing use "
        "use_reentrant=False.",
    ),
    _r(
        "device_mismatch",
        "error",
        r"Expected all tensors to be on the same device",
        "tensors on different devices",
        "An operation mixed tensors on different devices (CPU vs GPU, or two GPUs): often a "
        "model loaded with device_map='auto' under torchrun, or inputs not moved to the "
        "rank's device.",
        "Do not use device_map='auto' with DDP/FSDP; move the batch to the model's device; "
        "check LOCAL_RANK → torch.cuda.set_device.",
    ),
    _r(
        "dtype_mismatch",
        "error",
        r"expected scalar type (?P<dt_want>\w+) but found (?P<dt_got>\w+)"
        r"|expected (?:mat1 and mat2|both inputs) to have the same dtype"
        r"|Input type \(\S+\) and weight type \(\S+\) should be the same",
        "an operation mixed dtypes: {dt_want} expected, {dt_got} found",
        "Two tensors of one operation have different dtypes: weights in bf16/fp16 fed float32 "
        "inputs (or the reverse), typically a module left in float32 by a custom kernel or a "
        "cast, or mixed precision switched off for part of the model.",
        "Run the forward under autocast (train.dtype / --torch_dtype with bf16), or cast the "
        "module or the inputs to the model's dtype; check custom kernels for a hard-coded dtype.",
    ),
    _r(
        "checkpoint_mismatch",
        "error",
        r"size mismatch for (?P<cm_key>[\w.]+): copying a param with shape"
        r"|from checkpoint, the shape in current model is|^\s*size mismatch for\s*$"
        r"|Error\(s\) in loading state_dict for (?P<cm_cls>\w+)"
        r"|Missing key\(s\) in state_dict: \"(?P<cm_miss>[\w.]+)\"",
        "the checkpoint does not fit the model ({cm_key}{cm_cls}{cm_miss})",
        "The weights being loaded were saved from a model of another shape or structure: a "
        "different base model or size, another vocabulary (resized embeddings), an adapter "
        "trained on another base, or a resume into a run whose model settings changed.",
        "Load the checkpoint into the model it was made for (same base model, same vocabulary "
        "and LoRA settings); to resume, keep the run's model settings; for an adapter, check "
        "its adapter_config.json's base_model_name_or_path.",
    ),
    # the built-in trainer's own event (core/rundir/events.py): compile failed, eager goes on
    _r(
        "compile_fallback",
        "warning",
        r"\"phase\": ?\"eager_fallback\"",
        "torch.compile failed: training goes on eager (slower)",
        "Compiling the model for a batch shape failed (a missing C compiler or Triton, an op "
        "the compiler does not support, a recompile limit); the trainer fell back to eager "
        "mode, which is correct but slower (about 1.3x on a 7B LoRA on H200).",
        "Read the error in the evidence; install a C compiler / matching Triton, or set "
        "train.compile = false to skip the attempt.",
    ),
    _r(
        "fsdp_mixed_requires_grad",
        "warning",
        r"has both parameters with requires_grad=True and False",
        "FSDP unit mixes frozen and trainable parameters",
        "An FSDP-wrapped module holds both frozen and trainable parameters (typical for LoRA), "
        "so gradient memory is higher than expected.",
        "Wrap LoRA layers in their own FSDP units (lambda auto-wrap policy), or use FSDP2 "
        "(fully_shard), which handles mixed requires_grad.",
    ),
    _r(
        "fsdp_mixed_requires_grad",
        "error",
        r"Must flatten tensors with uniform `?requires_grad`?|requires uniform `?requires_grad`?",
        "FSDP cannot flatten frozen and trainable parameters together",
        "FSDP1 with use_orig_params=False needs every parameter of a unit to share "
        "requires_grad; LoRA mixes them.",
        "Set use_orig_params=True, wrap LoRA layers separately, or use FSDP2.",
    ),
    _r(
        "fsdp_mixed_dtype",
        "error",
        r"Must flatten tensors with uniform dtype|requires uniform dtype",
        "FSDP unit mixes dtypes",
        "Parameters of one FSDP unit have different dtypes (e.g. fp32 LoRA weights in a bf16 "
        "model).",
        "Cast the model to one dtype before wrapping and use MixedPrecision for compute, or "
        "use FSDP2.",
    ),
    _r(
        "fp16_overflow",
        "error",
        r"Current loss scale already at minimum|loss scale.*(?:reached|at) (?:the )?minimum",
        "fp16 loss scale collapsed",
        "Gradients overflow in fp16 at every step, so the loss scaler cannot go lower; "
        "training cannot continue.",
        "Train in bf16 (GPUs since Ampere), lower the learning rate, clip gradients, "
        "check data for extreme values.",
    ),
    _r(
        "fp16_overflow",
        "warning",
        r"OVERFLOW! Rank \d+ Skipping step|Gradient overflow\.\s+Skipping step",
        "fp16 gradient overflow, steps skipped",
        "fp16 gradients overflowed and the step was skipped; a few at the start are normal "
        "while the loss scaler calibrates.",
        "If it keeps happening, train in bf16 or lower the learning rate.",
    ),
    _r(
        "gpu_count_mismatch",
        "error",
        r"invalid device ordinal|n_gpu: \d+, local_world_size|Duplicate GPU detected"
        r"|CUDA_VISIBLE_DEVICES.*(?:fewer|not enough)",
        "more ranks than visible GPUs",
        "nproc_per_node is larger than the number of GPUs this node can see, so two ranks "
        "share a GPU or a rank has none.",
        "Set nproc_per_node to the number of GPUs in CUDA_VISIBLE_DEVICES (nvidia-smi -L).",
    ),
    _r(
        "flag_error",
        "error",
        r"remaining_argv: (?P<args>\[.*\])|error: unrecognized arguments: (?P<args2>.*)"
        r"|Some specified arguments are not used by the HfArgumentParser: (?P<args3>\[.*\])"
        r"|error: argument (?P<arg>--?[\w-]+): (?P<why>.*)"
        r"|error: the following arguments are required: (?P<req>.*)",
        "command line flag rejected",
        "The training program does not accept a flag it was given.",
        "Fix the flag (see the suggestion).",
    ),
    _r(
        "missing_module",
        "error",
        r"ModuleNotFoundError: No module named '(?P<mm_mod>[\w.]+)'"
        r"|ImportError: (?P<mm_lib>lib[\w.+-]+\.so[\w.]*): cannot open shared object file",
        "a module the program needs is not installed: {mm_mod}{mm_lib}",
        "The Python environment the ranks run in lacks a package (or a native library) the "
        "code imports: it is installed in another environment, or an optional extra (e.g. "
        "flash-attn, deepspeed, bitsandbytes) was never installed.",
        "Install it in the environment torchrun starts (`python -m pip install <package>`, "
        "matching the torch/CUDA build for compiled ones), or turn off the feature that needs "
        "it; on several nodes, install it on every node.",
    ),
    _r(
        "version_mismatch",
        "error",
        r"got an unexpected keyword argument '(?P<vm_kw>\w+)'"
        r"|cannot import name '(?P<vm_name>\w+)' from '(?P<vm_from>[\w.]+)'",
        "the installed library does not accept {vm_kw}{vm_name}",
        "The code (or its config) was written for another version of a library: the argument "
        "or name was renamed or removed in the installed one (transformers renamed "
        "evaluation_strategy to eval_strategy, for instance).",
        "Use the installed version's name for it (see the library's changelog), or install "
        "the version the code was written for (`pip show <package>` shows what you have).",
    ),
    # a rank's own last words when a signal ends it (torchrun's table may be cut or missing)
    _r(
        "worker_segfault",
        "error",
        r"Fatal Python error: (?:Segmentation fault|Bus error)|Segmentation fault \(core dumped\)"
        r"|Caught signal 11 \(Segmentation fault|SIGSEGV received"
        r"|\bSignal: Segmentation fault \(11\)|\*\*\* SIGSEGV \(@"
        r"|<Signals\.SIGSEGV: 11>|returned non-zero exit status -11\b",
        "a rank crashed with a segmentation fault",
        "Native code crashed (a CUDA extension, a mismatched library build, or corrupted memory).",
        "Run with PYTHONFAULTHANDLER=1 to get the Python stack; check that compiled extensions "
        "(flash-attn, bitsandbytes, deepspeed ops) match the installed torch/CUDA.",
    ),
    # a C++ thread still joinable when its process ends: most often a process group that
    # exit tore down, after the last step (its outputs were written before)
    _r(
        "exit_abort",
        "error",
        r"terminate called without an active exception",
        "a rank aborted while its process was exiting (a thread still running: "
        "terminate called without an active exception)",
        "The C++ runtime ended the process (SIGABRT) because one of its threads was still "
        "running as it exited. In a training script this is most often the process group "
        "left for the interpreter's exit to tear down: gloo's or NCCL's threads meet a "
        "peer that is already gone. It usually comes after the last step, whose outputs "
        "were already written; the exit code still fails the run.",
        "End the script with torch.distributed.destroy_process_group() after its last save. "
        "If the rank's log shows the training's end (the last step, the final summary or "
        "checkpoint), the outputs are complete and nothing needs to run again.",
    ),
    _r(
        "worker_sigabrt",
        "error",
        r"Fatal Python error: Aborted|Aborted \(core dumped\)"
        r"|<Signals\.SIGABRT: 6>|returned non-zero exit status -6\b",
        "a rank aborted (SIGABRT)",
        "The rank aborted itself: a C++ exception or an assertion in torch/NCCL/CUDA (the "
        "lines just before it say which).",
        "Read the rank's stderr just before the abort for the C++ error.",
    ),
    # torchrun itself got a signal: nothing failed inside the run (chain.py words it per signal)
    _r(
        "launcher_signal",
        "error",
        r"Received (?P<sig>\d+|Signals\.SIG\w+) death signal, shutting down workers"
        r"|SignalException: Process \d+ got signal: (?P<sig2>\d+)"
        r"|\*\*\* (?:JOB|STEP) [\d.]+ ON \S+ CANCELLED AT \S+(?P<slurm_why> DUE TO [A-Z ]+)?",
        "the launcher was stopped by a signal",
        "torchrun itself received a signal and shut its workers down; no rank failed on its own.",
        "See who sent it.",
    ),
    _r(
        "worker_sigkill",
        "error",
        r"^Killed\s*$|: line \d+: +\d+ Killed\b"
        r"|<Signals\.SIGKILL: 9>|returned non-zero exit status -9\b",
        "a process was killed (SIGKILL)",
        SIGKILL_CAUSE,
        SIGKILL_FIX,
    ),
    # generic wordings, last: on a line that also names the error, that rule wins
    _r(
        "nccl_timeout",
        "error",
        r"Some NCCL operations have failed or timed out",
        "NCCL operations failed or timed out",
        "A collective failed or did not complete in time; the lines around it say which.",
        "Look for the first error on any rank (a crash, a CUDA fault, a network error); if there "
        "is none, a rank never reached the collective: see what it was doing (py-spy dump).",
    ),
    _r(
        "worker_sigabrt",
        "error",
        r"terminate called after throwing an instance of",
        "a rank aborted on a C++ exception",
        "A C++ exception nobody caught ended the process (SIGABRT); its what() line says which.",
        "Read the what(): line just after it.",
    ),
]

# Known-harmless lines: never errors (torchrun banner, c10d teardown after a good run).
NOISE = re.compile(
    r"Setting OMP_NUM_THREADS environment variable|node_rank is only used for static"
    r"|failed to shutdown the rendezvous|recvValueWithTimeout failed|Connection was likely closed"
    r"|Destroy COMPLETE|Closing env plugin"
)

# One scan of the line decides whether any rule can match at all (most lines match none).
ANY = re.compile("|".join(f"(?:{r.pattern.pattern})" for r in RULES))

# Flags users carry over from other versions → what to use instead.
FLAG_RENAMES = {
    "--train_type": ("--tuner_type", "ms-swift 4.x renamed --train_type to --tuner_type"),
    "--tuner_type": ("--train_type", "ms-swift 3.x calls it --train_type"),
    "--sft_type": ("--tuner_type", "a 2.x ms-swift name"),
    "--model_id_or_path": ("--model", "a 2.x ms-swift name"),
    "--lora_target_modules": ("--target_modules", "a 2.x ms-swift name"),
    "--batch_size": ("--per_device_train_batch_size", "a 2.x ms-swift name"),
    "--dtype": ("--torch_dtype", "a 2.x ms-swift name"),
    "--dataset_test_ratio": ("--split_dataset_ratio", "a 2.x ms-swift name"),
    "--use_flash_attn": ("--attn_impl flash_attn", "a 2.x ms-swift name"),
    "--fsdp_transformer_layer_cls_to_wrap": ("--fsdp fsdp2", "removed in transformers 5"),
}

# Exception types of a traceback that a rule above already explains better.
CONSEQUENCE_PATTERNS = re.compile(
    r"Connection closed by peer|Connection reset by peer|remote worker crashing"
    r"|Received a dump signal|Process group watchdog thread terminated|DistBackendError"
    r"|Broken pipe|ProcessGroupGloo.*(?:closed|reset)"
)


def match_line(text: str) -> tuple[Rule, re.Match] | None:
    """The first rule matching this line, or None (noise never matches)."""
    if not ANY.search(text) or NOISE.search(text):
        return None
    for rule in RULES:
        m = rule.pattern.search(text)
        if m:
            return rule, m
    return None


def flag_advice(line: str) -> tuple[list[str], str]:
    """The rejected flags on a flag-error line and a suggestion naming replacements."""
    flags = re.findall(r"(--?[A-Za-z][\w-]*)", line.split(":", 1)[-1])
    hints = []
    for f in flags:
        if f in FLAG_RENAMES:
            new, why = FLAG_RENAMES[f]
            hints.append(f"use {new} instead of {f} ({why})")
    if not hints and flags:
        hints.append(
            f"remove or correct {', '.join(dict.fromkeys(flags))}; run the program "
            "with --help to see the flags of the installed version"
        )
    return flags, "; ".join(hints)


# -- prefilter for the scanner's fast path (scan.FileScanner._chunk) ---------------------------
# `TOKENS`: literals of which every line that can matter contains at least one. For the rules
# they are derived from the rule regexes themselves (each alternative's longest literal run), so
# a new rule cannot silently escape the prefilter: an alternative without a literal makes import
# fail instead of missing lines (the NCCL INFO lines that carry a fact: `NCCL_FACT_TOKENS`, from
# core/ingest/parsers/nccl.py). `TIME_HINT` finds lines that may carry a time stamp.

import re._parser as _sre_parse  # noqa: E402  the stdlib's own regex parser, to read literals


def branch_literals(pattern: str) -> list[str]:
    """For each top-level alternative, its longest run of literal characters."""
    items = list(_sre_parse.parse(pattern))
    if len(items) == 1 and items[0][0] is _sre_parse.BRANCH:
        branches = [list(b) for b in items[0][1][1]]
    else:
        branches = [items]
    out = []
    for br in branches:
        best = cur = ""
        for op, av in br:
            if op is _sre_parse.LITERAL:
                cur += chr(av)
                best = max(best, cur, key=len)
            else:
                cur = ""
        if len(best) < 3:
            raise ValueError(f"rule pattern alternative without a literal: {pattern!r}")
        out.append(best)
    return out


_RULE_LITERALS = {
    lit
    for r in RULES
    if not r.pattern.flags & re.IGNORECASE
    for lit in branch_literals(r.pattern.pattern)
}
if any(r.pattern.flags & re.IGNORECASE for r in RULES):
    raise ValueError("case-insensitive rules need case-folded prefilter tokens")

_OTHER = (
    "Traceback (most",
    " FAILED",
    "=" * 20,  # tracebacks, torchrun's report
    ' File "',  # a traceback whose header was cut off
    "nqueued",
    "exitcode",
    "closing signal",  # watchdog, torchrun lines
    "\r",
    "|",
    "step",
    "\n{",  # metrics and tqdm (scan.poll's filter)
    "loss: ",
    "loss :",  # mmengine, MetricLogger, DLLogger lines
    "NCCL WARN",
    "NCCL ERROR",
    "NCCL TRACE",  # NCCL lines other than plain INFO
    # torchrun's failure table when its head was cut off (scan / parsers.torchrun), the
    # DeepSpeed launcher's exit line, the signal the launcher passed on
    "local_rank",
    "time      :",
    "host      :",
    "error_file",
    "received by PID",
    "traceback :",
    "Root Cause",
    "return code",
    "closing signal",
    "Data ",
    "data_time",  # per-step data vs step time
    "Loading checkpoint shards",  # host-memory sign before a SIGKILL
)
TOKENS: tuple[bytes, ...] = tuple(
    sorted({t.encode() for t in (*_RULE_LITERALS, *_OTHER)} | set(NCCL_FACT_TOKENS))
)
REPORT_TOKENS: tuple[bytes, ...] = tuple(t for t in TOKENS if t not in NCCL_FACT_TOKENS)

# glog and ISO stamps both contain HH:MM:SS
TIME_HINT = re.compile(rb":\d\d:\d\d")
TIME_HINT_STR = re.compile(TIME_HINT.pattern.decode())
