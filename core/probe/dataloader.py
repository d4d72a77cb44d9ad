"""Time how long a rank blocks in next() on torch DataLoader iterators, at ~1 µs per batch.

`install()` runs in every rank through the injected sitecustomize. It does not import torch:
it patches `_BaseDataLoaderIter.__next__` when torch.utils.data.dataloader is first imported
(an import hook that removes itself), or at once if it already is. Patching the iterator
class, not DataLoader, leaves DataLoader objects, their pickling and their worker processes
exactly as they were. Waits are summed per second and appended as

    {"t": <end of the second>, "kind": "data_wait", "rank": r, "wait_s": s, "n": batches}

to $TUNEDECK_RUN_DIR/events/probe_rank<RANK>.jsonl. Every path catches everything: a broken
probe turns itself off, it never breaks the user's program.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time

TARGET = "torch.utils.data.dataloader"
_state = threading.local()
_recorder = None


class _Recorder:
    def __init__(self, path: str, rank: int):
        self.path = path
        self.rank = rank
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.sec = None
        self.wait = 0.0
        self.n = 0
        self.f = None
        self.dead = False

    def add(self, dt: float) -> None:
        if self.dead or os.getpid() != self.pid:
            return
        sec = int(time.time())
        with self.lock:
            if self.sec is not None and sec != self.sec:
                self._flush()
            self.sec = sec
            self.wait += dt
            self.n += 1

    def _flush(self) -> None:
        if not self.n or self.sec is None:
            return
        line = json.dumps(
            {
                "t": self.sec + 1.0,
                "kind": "data_wait",
                "rank": self.rank,
                "wait_s": round(self.wait, 6),
                "n": self.n,
            }
        )
        self.wait, self.n = 0.0, 0
        try:
            if self.f is None:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                self.f = open(self.path, "a", encoding="utf-8")
            self.f.write(line + "\n")
            self.f.flush()
        except Exception:
            self.dead = True

    def close(self) -> None:
        try:
            if os.getpid() != self.pid:
                return
            with self.lock:
                self._flush()
                if self.f is not None:
                    self.f.close()
                    self.f = None
        except Exception:
            pass

    def after_fork(self) -> None:
        # a forked child (a DataLoader worker) must not write the parent's totals
        self.pid = -1
        self.f = None


def _patch(mod) -> None:
    try:
        cls = mod._BaseDataLoaderIter
        orig = cls.__next__
        if getattr(orig, "_tunedeck_probe", False):
            return
        modules = sys.modules

        def __next__(self):
            worker_mod = modules.get("torch.utils.data._utils.worker")
            if getattr(_state, "depth", 0) or (
                worker_mod is not None and getattr(worker_mod, "_worker_info", None)
            ):
                return orig(self)  # nested loader, or inside a DataLoader worker
            _state.depth = 1
            t0 = time.perf_counter()
            try:
                batch = orig(self)
            finally:
                _state.depth = 0
            try:
                _recorder.add(time.perf_counter() - t0)
            except Exception:
                pass
            return batch

        __next__._tunedeck_probe = True
        __next__.__wrapped__ = orig
        __next__.__name__ = orig.__name__
        __next__.__qualname__ = orig.__qualname__
        __next__.__doc__ = orig.__doc__
        cls.__next__ = __next__
    except Exception:
        pass


class _Hook:
    """A meta-path finder that only watches for torch's dataloader module, once."""

    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return None
            orig_exec = spec.loader.exec_module

            def exec_module(module):
                orig_exec(module)
                _patch(module)

            spec.loader.exec_module = exec_module
            return spec
        except Exception:
            return None


def install() -> bool:
    """Turn the probe on in this process if it is a rank of a tunedeck run."""
    global _recorder
    try:
        run_dir = os.environ.get("TUNEDECK_RUN_DIR")
        rank = os.environ.get("RANK")
        if not run_dir or rank is None or os.environ.get("TUNEDECK_PROBE") == "0":
            return False
        if _recorder is not None:
            return True
        from tunedeck.core.rundir import RunDir

        _recorder = _Recorder(str(RunDir(run_dir).probe_file(int(rank))), int(rank))
        atexit.register(_recorder.close)
        os.register_at_fork(after_in_child=_recorder.after_fork)
        if TARGET in sys.modules:
            _patch(sys.modules[TARGET])
        else:
            sys.meta_path.insert(0, _Hook())
        return True
    except Exception:
        return False


def chain_sitecustomize(our_file: str) -> None:
    """Run the sitecustomize that ours shadows (a distro's or the user's), if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(our_file))
    paths = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None or not spec.origin:
        return
    if os.path.abspath(spec.origin) == os.path.abspath(our_file):
        return
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
