"""The shipped LightGBM model compiled to native code (lleaves, LLVM), cached on disk next to the model.

On the shipped 100-tree model a single-threaded ``lgb.Booster.predict`` costs 35 / 71 / 201 us for
4 / 16 / 64 rows, almost all of it LightGBM's per-call setup and tree walk; the lleaves-compiled forest
costs 10 / 16 / 40 us (docs/predictor.md, Runtime). Compiling takes about 1 s, so the object code is
cached in ``<model dir>/.compiled/`` (or the user cache dir when that is not writable) under a key of the
model's bytes, the compiler's versions and the host CPU: a changed model or another CPU gets a fresh
build. lleaves loads a cached object without any check, so each one has a sha256 sidecar and a file
that does not match it is rebuilt instead of being handed to the JIT.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import os
import platform
import sys
import uuid
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import numpy as np

Backend = Literal["auto", "lightgbm", "lleaves"]
BACKENDS: tuple[str, ...] = ("auto", "lightgbm", "lleaves")
BACKEND_ENV = "TREEWISE_PREDICTOR_BACKEND"  # overrides the default "auto" (A/B runs without code changes)
CACHE_DIR = ".compiled"
OBJECT_SUFFIX = ".o"  # lleaves caches an ELF object for LLVM's MCJIT, not a shared library
DIGEST_SUFFIX = ".sha256"
COMPILE_FLAGS = "fblocksize=all"  # part of the cache key: change it when _compile's flags change


class CompileError(RuntimeError):
    """The model could not be compiled; the message says why (the caller may fall back to LightGBM)."""


_Entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)


@dataclass(eq=False)
class CompiledForest:
    """A compiled forest: ``predict(x)`` equals ``lgb.Booster.predict(x)`` (objective applied), one thread.

    ``predict_prefix`` is the per-level path: it calls the compiled function on a reused buffer through
    pointers made once, which saves ~5 us of lleaves' per-call conversions (a third of a 16-row call).
    """

    model: Any  # lleaves.Model, compiled
    source: str  # the cached object file it was loaded from or written to, or "memory"
    built: bool  # True when this load compiled the model, False when it reused the cache
    _entry: Any = field(default=None, init=False, repr=False)
    _bound: tuple[np.ndarray, np.ndarray, int, int] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        # lleaves 1.3's entry point forest_root(double *rows, double *out, int start, int end); keep the public
        # predict when another lleaves lacks it or the model is not a one-output fp64 forest.
        entry = getattr(self.model, "_c_entry_func", None)
        if entry is not None and self.model.use_fp64 and self.model.num_model_per_iteration() == 1:
            self._entry = _Entry(ctypes.cast(entry, ctypes.c_void_p).value)

    @property
    def entry_address(self) -> int | None:
        """Address of the compiled ``forest_root(double *rows, double *out, int start, int end)`` (valid while
        this object lives), for native callers (``controller.fused``); None where ``predict_prefix`` cannot use it."""
        return ctypes.cast(self._entry, ctypes.c_void_p).value if self._entry is not None else None

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.model.predict(np.ascontiguousarray(x, dtype=np.float64), n_jobs=1)

    def predict_prefix(self, buffer: np.ndarray, n: int) -> np.ndarray:
        """Predictions for the first ``n`` rows of a C-contiguous float64 (rows x features) buffer."""
        if self._entry is None or buffer.dtype != np.float64 or not buffer.flags.c_contiguous:
            return self.predict(buffer[:n])
        if self._bound is None or self._bound[0] is not buffer:
            out = np.empty(buffer.shape[0], dtype=np.float64)
            # Holding both arrays keeps the raw addresses valid.
            self._bound = (buffer, out, buffer.ctypes.data, out.ctypes.data)
        _, out, rows, results = self._bound
        self._entry(rows, results, 0, n)
        return out[:n].copy()

    def __deepcopy__(self, memo: dict) -> CompiledForest:
        # Native code is read-only and cannot be copied: copies share it, each with its own buffer binding.
        return CompiledForest(self.model, self.source, self.built)


def resolve_backend(backend: str | None) -> str:
    """``backend`` or, when None, ``$TREEWISE_PREDICTOR_BACKEND`` or "auto"; an unknown name raises."""
    name = backend if backend is not None else os.environ.get(BACKEND_ENV, "auto")
    if name not in BACKENDS:
        raise ValueError(f"predictor backend {name!r}: choose one of {', '.join(BACKENDS)}")
    return name


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "treewise" / "compiled"


def compile_forest(model_file: str | Path, cache_dirs: list[Path] | None = None) -> CompiledForest:
    """Load the cached compiled model or compile it (and cache it); raise CompileError when it cannot.

    ``cache_dirs`` default: ``<model dir>/.compiled``, then the user cache dir; the first writable one holds
    the cache. With none writable the model is compiled in memory for this process only.
    """
    model_file = Path(model_file)
    try:
        lleaves = importlib.import_module("lleaves")
        llvm = importlib.import_module("llvmlite.binding")
    except ImportError as err:
        raise CompileError(f"lleaves is not installed ({err}): pip install lleaves") from None
    try:
        model_hash = hashlib.sha256(model_file.read_bytes()).hexdigest()
        name = f"{model_hash[:24]}-{_environment_key(llvm)}"
        dirs = cache_dirs if cache_dirs is not None else [model_file.parent / CACHE_DIR, user_cache_dir()]
        home = next((d for d in dirs if _writable(d)), None)
        if home is None:
            return CompiledForest(_compile(lleaves, model_file, None), "memory", built=True)
        forest = _load_cached(lleaves, model_file, home / (name + OBJECT_SUFFIX))
        if forest is None:
            forest = _build(lleaves, model_file, home / (name + OBJECT_SUFFIX))
            if home == model_file.parent / CACHE_DIR:
                _prune(home, keep=model_hash[:24])
        return forest
    except CompileError:
        raise
    except Exception as err:  # any compiler failure (unsupported model, LLVM error) means: use LightGBM
        raise CompileError(f"lleaves could not compile {model_file}: {type(err).__name__}: {err}") from None


def _environment_key(llvm: Any) -> str:
    """What the object code depends on besides the model: compiler versions and the exact host CPU."""
    try:
        features = llvm.get_host_cpu_features().flatten()
    except RuntimeError:  # LLVM cannot detect them on some hosts; lleaves then compiles without them
        features = ""
    parts = [COMPILE_FLAGS, _version("lleaves"), _version("llvmlite"), llvm.get_process_triple(),
             llvm.get_host_cpu_name(), features, platform.machine(), sys.platform]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


def _writable(directory: Path) -> bool:
    """Create the folder and a probe file in it: permission bits alone do not show a read-only mount."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".probe-{uuid.uuid4().hex}.tmp"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def _compile(lleaves: Any, model_file: Path, cache: Path | None) -> Any:
    model = lleaves.Model(model_file=str(model_file))
    # One block of all trees: each row's trees are summed in LightGBM's order, so predictions are bit-identical
    # to Booster.predict (lleaves' default blocks of 34 differ by ~1e-16 and were no faster here at 4-64 rows).
    model.compile(cache=None if cache is None else str(cache), fblocksize=max(model.num_trees(), 1))
    return model


def _load_cached(lleaves: Any, model_file: Path, obj: Path) -> CompiledForest | None:
    """The cached build, when its bytes match their digest; a stale or corrupt one is removed."""
    digest = obj.with_suffix(DIGEST_SUFFIX)
    try:
        data, want = obj.read_bytes(), digest.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        want, data = "", b""
    if not data or hashlib.sha256(data).hexdigest() != want:
        for path in (obj, digest):
            path.unlink(missing_ok=True)
        return None
    return CompiledForest(_compile(lleaves, model_file, obj), str(obj), built=False)


def _build(lleaves: Any, model_file: Path, obj: Path) -> CompiledForest:
    """Compile, writing the object to a private temporary name, then move it and its digest into place.

    Readers only trust an object whose digest file matches, so a process killed midway (or two processes
    building at once) leaves either no entry or a complete one.
    """
    tmp = obj.with_name(f"{obj.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        model = _compile(lleaves, model_file, tmp)  # lleaves writes the object when the JIT finalises
        data = tmp.read_bytes()
        os.replace(tmp, obj)
        digest_tmp = tmp.with_suffix(".sha256.tmp")
        digest_tmp.write_text(hashlib.sha256(data).hexdigest() + "\n", encoding="ascii")
        os.replace(digest_tmp, obj.with_suffix(DIGEST_SUFFIX))
    finally:
        tmp.unlink(missing_ok=True)
    return CompiledForest(model, str(obj), built=True)


def _prune(directory: Path, keep: str) -> None:
    """Drop builds of earlier versions of this model (the folder belongs to one model.txt)."""
    for path in directory.iterdir():
        if path.suffix in (OBJECT_SUFFIX, DIGEST_SUFFIX) and not path.name.startswith(keep):
            path.unlink(missing_ok=True)
