"""Read HF checkpoints one tensor (or one block of rows) at a time, never a whole model.

Scoring a 7B pair on a laptop means the reader, not the metric, decides the memory bill. So this
module parses safetensors headers itself and reads each tensor's bytes with ``os.preadv`` straight
into a fresh torch buffer: no memory map (whose touched pages would count against the process's
resident memory until the file is closed), no copy of the whole file. Supported layouts are the ones
``save_pretrained`` writes: ``model.safetensors``, sharded ``model.safetensors.index.json``, and
PyTorch ``pytorch_model.bin`` (+ index) in the zip format (``torch.save`` since PyTorch 1.6), which is
read only with ``torch.load(weights_only=True, mmap=True)``, one shard at a time; the legacy non-zip
format is refused with the conversion to run. Tied weights (``lm_head.weight`` absent but
``tie_word_embeddings``) are exposed under both names.

Weights must be floating point: an integer or boolean ``*.weight`` (or block projection bias) is refused
by name, since its integers would be scored as if they were floats; other integer tensors are buffers
(``position_ids``, causal masks) and are skipped (:attr:`Checkpoint.skipped`).

Every read is checked for NaN/inf, and every error names the file and the tensor.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lacuna_metrics.kernels import count_nonfinite

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "TensorInfo",
    "FINGERPRINT_SCHEME",
    "check_compatible",
    "file_fingerprint",
    "fingerprint_of",
    "release_memory",
    "tensor_digest",
]

_SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
}
#: Mask files (``Checkpoint(..., masks=True)``): int32 bit fields, or uint8 ones for up to 8 groups.
_MASK_DTYPES: dict[str, torch.dtype] = {**_SAFETENSORS_DTYPES, "I32": torch.int32, "U8": torch.uint8}
#: Integer and boolean tensors of a model checkpoint. A weight stored so (a quantized or corrupted checkpoint)
#: is refused, since scoring its integers as floats gives a wrong number silently; other integer tensors are
#: buffers (``position_ids``, causal-mask ``attn.bias``) that hold no learned value and are skipped.
_INTEGER_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
}
#: The first bytes of a PyTorch zip archive (``torch.save`` since 1.6); anything else is the legacy format.
_ZIP_MAGIC = b"PK\x03\x04"
_MAX_HEADER = 100 * 1024 * 1024
#: Hashed into every :meth:`Checkpoint.fingerprint`; bump it when what the fingerprint covers changes.
FINGERPRINT_SCHEME = "lacuna-weights/1"
_HASH_CHUNK = 8 << 20  # bytes per read while hashing
_HASH_THREADS = 4  # at most; never more than the CPUs
_EMBEDDING_NAMES = ("model.embed_tokens.weight", "transformer.wte.weight", "embed_tokens.weight", "wte.weight")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not match another one; the message names file and tensor."""


def _is_weight(name: str) -> bool:
    """A learned tensor by its name: ``*.weight`` or a block projection's bias (what the scores read)."""
    from lacuna_metrics.weights.anatomy import classify_name

    return name.endswith(".weight") or classify_name(name) is not None


def _skip_integer(skipped: dict[str, str], file: Path, name: str, dtype_name: str, shape: tuple[int, ...]) -> None:
    """Record an integer buffer in ``skipped``; refuse an integer weight (the message names file and tensor)."""
    if _is_weight(name):
        raise CheckpointError(
            f"{file}: tensor {name!r} is a weight stored as {dtype_name} {list(shape)}; lacuna scores floating-point "
            "weights only (dequantize the checkpoint first)"
        )
    skipped[name] = dtype_name


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: file, dtype, shape and (for safetensors) the byte offset of its data."""

    name: str
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int = -1  # absolute byte offset in ``file``; -1 for PyTorch pickles

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1


class Scratch:
    """Reused block buffers, one set per thread: reading block after block into fresh memory costs page faults
    (the kernel zeroes every new page), reading into the same buffers does not. A block read with a scratch
    is valid until the next read with the same scratch and key."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def take(self, key: str, dtype: torch.dtype, count: int) -> torch.Tensor:
        """A flat ``dtype`` tensor of ``count`` elements for ``key`` (grown when too small), contents undefined."""
        buffer = self._buffers.get((key, dtype))
        if buffer is None or buffer.numel() < count:
            buffer = self._buffers[key, dtype] = torch.empty(count, dtype=dtype)
        return buffer[:count]


class Checkpoint:
    """A lazily read HF checkpoint directory (or a single ``.safetensors`` / ``.bin`` file).

    ``names`` lists every tensor (tied aliases included) in file order; :meth:`read` returns float32
    tensors for a name or a block of leading-dimension rows.
    """

    def __init__(self, path: str | os.PathLike[str], *, masks: bool = False) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"checkpoint not found: {self.path}")
        self._infos: dict[str, TensorInfo] = {}
        self._aliases: dict[str, str] = {}
        self._pickle_cache: tuple[Path, dict[str, torch.Tensor]] | None = None
        self._fingerprint: str | None = None
        #: Integer/bool buffers left out (name -> dtype): no learned value, not scored, not in the fingerprint.
        self.skipped: dict[str, str] = {}
        self._files, expected = self._discover()
        for file in self._files:
            dtypes = _MASK_DTYPES if masks else _SAFETENSORS_DTYPES
            if file.suffix == ".safetensors":
                infos = _safetensors_header(file, dtypes, None if masks else self.skipped)
            else:
                infos = _pickle_infos(file, None if masks else self.skipped)
            for info in infos:
                if info.name in self._infos:
                    first = self._infos[info.name].file.name
                    raise CheckpointError(f"{self.path}: tensor {info.name!r} appears in {first} and {file.name}")
                self._infos[info.name] = info
        if not self._infos:
            raise CheckpointError(f"{self.path}: no tensors found")
        for name, file in expected.items():
            if name in self.skipped:
                continue
            if name not in self._infos or self._infos[name].file != file:
                raise CheckpointError(f"{self.path}: the index maps {name!r} to {file.name}, which does not hold it")
        self._add_tied_aliases()

    # -- layout -------------------------------------------------------------------------------------

    def _discover(self) -> tuple[list[Path], dict[str, Path]]:
        """Weight files, and for sharded checkpoints which file the index says holds each tensor.

        The files ``from_pretrained`` loads, in its order (safetensors before PyTorch, a single file before an
        index), so that the weights scored are the ones lm-eval and the trainer load. A directory holding one
        format both as a single file and as an index is two checkpoints in one place: refused, naming both."""
        p = self.path
        if p.is_file():
            return [p], {}
        for single, index in (
            (p / "model.safetensors", p / "model.safetensors.index.json"),
            (p / "pytorch_model.bin", p / "pytorch_model.bin.index.json"),
        ):
            if single.is_file() and index.is_file():
                raise CheckpointError(
                    f"{p}: holds both {single.name} and {index.name}, two layouts of one checkpoint (transformers "
                    f"loads {single.name}); remove the stale one"
                )
            if single.is_file():
                return [single], {}
            if index.is_file():
                weight_map = _index_map(index)
                return list(dict.fromkeys(weight_map.values())), weight_map
        raise CheckpointError(
            f"{p}: no model.safetensors, model.safetensors.index.json, pytorch_model.bin or its index found"
        )

    def _add_tied_aliases(self) -> None:
        """``save_pretrained`` drops ``lm_head.weight`` when it is tied to the input embedding."""
        if "lm_head.weight" in self._infos or not self.config().get("tie_word_embeddings", True):
            return
        embedding = next((n for n in _EMBEDDING_NAMES if n in self._infos), None)
        if embedding is not None:
            self._aliases["lm_head.weight"] = embedding

    def config(self) -> dict[str, Any]:
        """The checkpoint's ``config.json`` (empty dict when there is none)."""
        cfg = (self.path if self.path.is_dir() else self.path.parent) / "config.json"
        if not cfg.is_file():
            return {}
        try:
            data = json.loads(cfg.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{cfg}: malformed JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise CheckpointError(f"{cfg}: expected a JSON object")
        return data

    @property
    def files(self) -> list[Path]:
        return list(self._files)

    @property
    def names(self) -> list[str]:
        return [*self._infos, *self._aliases]

    def info(self, name: str) -> TensorInfo:
        target = self._aliases.get(name, name)
        try:
            return self._infos[target]
        except KeyError:
            raise CheckpointError(f"{self.path}: no tensor {name!r}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return self.info(name).shape

    def is_alias(self, name: str) -> bool:
        return name in self._aliases

    def total_bytes(self) -> int:
        """Bytes of tensor data (aliases counted once): what a plain read of the checkpoint costs."""
        return sum(i.numel * _itemsize(i.dtype) for i in self._infos.values())

    def fingerprint(self) -> str:
        """``sha256:…`` of the weights' content: what a score, a cache or a gate names this checkpoint by.

        Covers every stored floating-point tensor (name, dtype, shape and all of its bytes) and the
        tied-weight aliases, nothing else (not the skipped integer buffers): not the path, file names, mtimes, sharding, tensor order inside the files,
        safetensors ``__metadata__``, nor ``config.json`` / tokenizer files. So the same weights saved
        sharded or as one file (safetensors or ``.bin``) share a fingerprint, and any changed scalar changes
        it. Each tensor is hashed on its own (streamed in 8 MiB reads, a few tensors in parallel: ``hashlib``
        releases the GIL), then the sorted list of ``(name, dtype, shape, digest)`` is hashed; see
        :data:`FINGERPRINT_SCHEME`. Computed once per instance.
        """
        if self._fingerprint is None:
            self._fingerprint = _content_fingerprint(self)
        return self._fingerprint

    # -- reading ------------------------------------------------------------------------------------

    def read(
        self,
        name: str,
        start: int = 0,
        stop: int | None = None,
        *,
        check_finite: bool = True,
        scratch: Scratch | None = None,
    ) -> torch.Tensor:
        """Rows ``[start, stop)`` of the leading dimension of ``name`` as float32 (the whole tensor by default).

        With ``scratch`` the block lands in reused buffers (valid until the next read with the same scratch).
        """
        return self.read_stored(name, start, stop, check_finite=check_finite, scratch=scratch)[1]

    def read_stored(
        self,
        name: str,
        start: int = 0,
        stop: int | None = None,
        *,
        check_finite: bool = True,
        scratch: Scratch | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`read`'s block both as stored (the bytes a fingerprint hashes, e.g. the pair walk's) and as float32
        (one tensor when stored as float32)."""
        info = self.info(name)
        stop = info.rows if stop is None else stop
        if not 0 <= start <= stop <= info.rows:
            raise CheckpointError(f"{info.file}: rows [{start}, {stop}) out of range for {name!r} {info.shape}")
        raw = self.read_raw(name, start, stop, scratch=scratch)
        if raw.dtype == torch.float32:
            out = raw
        elif scratch is not None:
            out = scratch.take(f"{self.path}:float32", torch.float32, raw.numel()).reshape(raw.shape).copy_(raw)
        else:
            out = raw.to(torch.float32)
        if check_finite and (bad := _nonfinite(out)):
            raise CheckpointError(f"{info.file}: tensor {name!r} contains {bad} NaN/inf values (rows {start}-{stop})")
        return raw, out

    def read_raw(
        self, name: str, start: int = 0, stop: int | None = None, *, scratch: Scratch | None = None
    ) -> torch.Tensor:
        """Rows ``[start, stop)`` of ``name`` in the stored dtype, without the NaN check (masks, benchmarks)."""
        info = self.info(name)
        stop = info.rows if stop is None else stop
        if not 0 <= start <= stop <= info.rows:
            raise CheckpointError(f"{info.file}: rows [{start}, {stop}) out of range for {name!r} {info.shape}")
        row_shape = info.shape[1:]
        row_elems = math.prod(row_shape)
        shape = (stop - start, *row_shape) if info.shape else ()
        if info.offset < 0:
            tensor = self._pickle_tensor(info)
            block = tensor[start:stop] if info.shape else tensor
            return block.reshape(shape).clone()
        count = (stop - start) * row_elems if info.shape else 1
        out = (
            torch.empty(count, dtype=info.dtype) if scratch is None else scratch.take(str(self.path), info.dtype, count)
        )
        if count:
            buf = out.view(torch.uint8).numpy()
            offset = info.offset + start * row_elems * _itemsize(info.dtype)
            fd = os.open(info.file, os.O_RDONLY)
            try:
                done = 0
                while done < buf.nbytes:
                    got = os.preadv(fd, [buf[done:]], offset + done)
                    if got <= 0:
                        raise CheckpointError(f"{info.file}: truncated while reading tensor {info.name!r}")
                    done += got
            finally:
                os.close(fd)
        return out.reshape(shape)

    def _pickle_tensor(self, info: TensorInfo) -> torch.Tensor:
        if self._pickle_cache is None or self._pickle_cache[0] != info.file:
            self._pickle_cache = None  # drop the previous shard before loading the next
            self._pickle_cache = (info.file, _load_pickle(info.file))
        return self._pickle_cache[1][info.name]

    def iter_blocks(self, name: str, block_elems: int) -> Iterator[tuple[int, int]]:
        """Row ranges of ``name`` holding about ``block_elems`` scalars each (at least one row)."""
        info = self.info(name)
        per_row = max(1, math.prod(info.shape[1:]))
        step = max(1, block_elems // per_row)
        for start in range(0, info.rows, step):
            yield start, min(info.rows, start + step)


# -- file formats ---------------------------------------------------------------------------------


def _nonfinite(values: torch.Tensor) -> int:
    """How many entries are NaN or ±inf (a compiled pass for float32, the common case)."""
    if values.dtype == torch.float32:
        return int(count_nonfinite(values.reshape(-1).contiguous().numpy()))
    return int((~torch.isfinite(values)).sum())


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _index_map(index: Path) -> dict[str, Path]:
    try:
        data = json.loads(index.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{index}: malformed JSON: {exc}") from exc
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: missing or empty 'weight_map'")
    out: dict[str, Path] = {}
    for name, shard in weight_map.items():
        path = index.parent / str(shard)
        if not path.is_file():
            raise CheckpointError(f"{index}: shard {shard!r} (holding {name!r}) not found")
        out[str(name)] = path
    return out


def _safetensors_header(
    file: Path, dtypes: Mapping[str, torch.dtype] = _SAFETENSORS_DTYPES, skipped: dict[str, str] | None = None
) -> list[TensorInfo]:
    """The tensors of a safetensors file's header. With ``skipped`` (a model checkpoint), integer buffers are
    recorded there and left out, integer weights refused; without it, ``dtypes`` decides alone."""
    size = file.stat().st_size
    with file.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{file}: not a safetensors file (shorter than 8 bytes)")
        n = int.from_bytes(head, "little")
        if n <= 0 or n > _MAX_HEADER or 8 + n > size:
            raise CheckpointError(f"{file}: not a safetensors file (header length {n})")
        try:
            header = json.loads(fh.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{file}: malformed safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{file}: malformed safetensors header (not an object)")
    base = 8 + n
    infos = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype_name, shape, (begin, end) = (
                entry["dtype"],
                tuple(int(d) for d in entry["shape"]),
                entry["data_offsets"],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{file}: malformed header entry for tensor {name!r}: {exc}") from exc
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (begin, end, *shape)):
            raise CheckpointError(f"{file}: tensor {name!r} has invalid data_offsets {[begin, end]} or shape {shape}")
        if dtype_name not in dtypes and skipped is not None and dtype_name in _INTEGER_DTYPES:
            _skip_integer(skipped, file, name, dtype_name, shape)
            continue
        if dtype_name not in dtypes:
            raise CheckpointError(f"{file}: tensor {name!r} has dtype {dtype_name}; supported: {sorted(dtypes)}")
        dtype = dtypes[dtype_name]
        if end - begin != math.prod(shape) * _itemsize(dtype) or base + end > size:
            raise CheckpointError(f"{file}: tensor {name!r} has inconsistent data offsets {begin}-{end}")
        infos.append(TensorInfo(name, file, dtype, shape, base + int(begin)))
    return infos


def _load_pickle(file: Path) -> dict[str, torch.Tensor]:
    with file.open("rb") as fh:
        head = fh.read(4)
    if head != _ZIP_MAGIC:
        legacy = head[:1] == b"\x80"  # a bare pickle: torch.save(..., _use_new_zipfile_serialization=False)
        what = "is in the legacy (non-zip) PyTorch format, not supported" if legacy else "is not a PyTorch zip archive"
        raise CheckpointError(
            f"{file}: {what}; convert the checkpoint to safetensors once: "
            f"AutoModelForCausalLM.from_pretrained('{file.parent}').save_pretrained(OUT)"
        )
    try:
        obj = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises pickle, zip and runtime errors alike
        raise CheckpointError(f"{file}: cannot be read with torch.load(weights_only=True): {exc}") from exc
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{file}: expected a state dict (name -> tensor)")
    return dict(obj)


def _pickle_infos(file: Path, skipped: dict[str, str] | None = None) -> list[TensorInfo]:
    state = _load_pickle(file)
    infos = []
    integer = {dtype: name for name, dtype in _INTEGER_DTYPES.items()}
    for name, t in state.items():
        if skipped is not None and t.dtype in integer:
            _skip_integer(skipped, file, name, integer[t.dtype], tuple(t.shape))
            continue
        if t.dtype not in _SAFETENSORS_DTYPES.values():
            raise CheckpointError(f"{file}: tensor {name!r} has unsupported dtype {t.dtype}")
        infos.append(TensorInfo(name, file, t.dtype, tuple(t.shape)))
    return infos


# -- fingerprints ---------------------------------------------------------------------------------

_DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in _MASK_DTYPES.items()}
_hash_buffers = threading.local()


def _hash_buffer() -> memoryview:
    buffer = getattr(_hash_buffers, "buffer", None)
    if buffer is None:
        buffer = _hash_buffers.buffer = memoryview(bytearray(_HASH_CHUNK))
    return buffer


def _hash_range(file: Path, offset: int, nbytes: int, digest: Any) -> None:
    """Feed ``nbytes`` of ``file`` from ``offset`` to ``digest`` (a hashlib object) through a reused buffer."""
    buffer = _hash_buffer()
    fd = os.open(file, os.O_RDONLY)
    try:
        done = 0
        while done < nbytes:
            got = os.preadv(fd, [buffer[: min(len(buffer), nbytes - done)]], offset + done)
            if got <= 0:
                raise CheckpointError(f"{file}: truncated at byte {offset + done} while hashing")
            digest.update(buffer[:got])
            done += got
    finally:
        os.close(fd)


def tensor_digest(ckpt: Checkpoint, info: TensorInfo) -> str:
    """SHA-256 (hex) of one stored tensor's bytes: a part of :meth:`Checkpoint.fingerprint`."""
    digest = hashlib.sha256()
    if info.offset >= 0:
        _hash_range(info.file, info.offset, info.numel * _itemsize(info.dtype), digest)
    else:  # a PyTorch pickle: the tensor's bytes, made contiguous (as safetensors stores them)
        tensor = ckpt._pickle_tensor(info).detach().contiguous().reshape(-1)
        digest.update(tensor.view(torch.uint8).numpy().data)
    return digest.hexdigest()


def _content_fingerprint(ckpt: Checkpoint) -> str:
    infos = list(ckpt._infos.values())
    mapped = [i for i in infos if i.offset >= 0]
    digests: dict[str, str] = {}
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = max(1, min(_HASH_THREADS, cpus, len(mapped)))
    if workers > 1:
        from concurrent.futures import ThreadPoolExecutor

        order = sorted(mapped, key=lambda i: (str(i.file), i.offset))  # file order: sequential reads
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lacuna-fingerprint") as pool:
            digests.update(zip((i.name for i in order), pool.map(lambda i: tensor_digest(ckpt, i), order), strict=True))
    for info in infos:  # pickles (one shard loaded at a time) and the single-thread case
        if info.name not in digests:
            digests[info.name] = tensor_digest(ckpt, info)
    return fingerprint_of(ckpt, digests)


def fingerprint_of(ckpt: Checkpoint, digests: Mapping[str, str]) -> str:
    """The fingerprint from every tensor's SHA-256 digest (:data:`FINGERPRINT_SCHEME`)."""
    payload = {
        "scheme": FINGERPRINT_SCHEME,
        "tensors": [
            [name, _DTYPE_NAMES[ckpt._infos[name].dtype], list(ckpt._infos[name].shape), digests[name]]
            for name in sorted(digests)
        ],
        "aliases": sorted([alias, target] for alias, target in ckpt._aliases.items()),
    }
    canonical = json.dumps(payload, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode("ascii")).hexdigest()


def file_fingerprint(path: str | os.PathLike[str]) -> str:
    """``sha256:…`` of a whole file's bytes (mask files: their metadata names the forget/retain groups)."""
    path = Path(path)
    digest = hashlib.sha256()
    _hash_range(path, 0, path.stat().st_size, digest)
    return "sha256:" + digest.hexdigest()


# -- pairing ----------------------------------------------------------------------------------------


def check_compatible(checkpoints: Mapping[str, Checkpoint], names: Sequence[str] | None = None) -> list[str]:
    """Check that all checkpoints hold the same tensor names with the same shapes; return the shared names.

    With ``names`` only those tensors are compared. Raises CheckpointError listing every difference.
    """
    items = list(checkpoints.items())
    ref_label, ref = items[0]
    wanted = list(ref.names) if names is None else list(names)
    problems: list[str] = []
    for label, ckpt in items:
        have = set(ckpt.names)
        missing = [n for n in wanted if n not in have]
        if missing:
            problems.append(f"{label} ({ckpt.path}) lacks {len(missing)} tensors: {_preview(missing)}")
        if names is None and label != ref_label:
            extra = [n for n in ckpt.names if n not in set(wanted)]
            if extra:
                problems.append(f"{label} ({ckpt.path}) has {len(extra)} tensors {ref_label} lacks: {_preview(extra)}")
        ref_have = set(ref.names)
        for n in wanted:
            if n in have and n in ref_have and ckpt.shape(n) != ref.shape(n):
                problems.append(f"{n}: {ref_label} {list(ref.shape(n))} vs {label} {list(ckpt.shape(n))}")
    if problems:  # one line: the first few differences and how many there are
        shown = "; ".join(problems[:5]) + (f"; ... (+{len(problems) - 5} more)" if len(problems) > 5 else "")
        raise CheckpointError(f"checkpoints do not match: {shown}")
    return wanted


def _preview(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f", ... (+{len(names) - limit})" if len(names) > limit else "")


_LIBC: Any = None


def release_memory() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere).

    Streaming allocates and frees many tensor-sized buffers; glibc keeps the freed pages mapped, so
    without a trim the resident size creeps up to a multiple of the largest tensor.
    """
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)
