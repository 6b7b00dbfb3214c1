"""Mask files: our safetensors bit fields (write, stamp, read) and the released LACUNA ``mask.pt``.

On disk our files store the narrowest bit field that holds every group (uint8 up to 8 groups: LACUNA's 6 take a
quarter of the int32's bytes, which the scorer must read for every scalar); in memory a
:class:`~lacuna_metrics.masks.mask_set.MaskSet` is always int32. A released ``mask.pt`` lists every parameter and stores
all-zero vectors for the frozen ones (see :meth:`~lacuna_metrics.masks.mask_set.MaskSet.nonzero_names`).
:class:`MaskReader` reads either kind tensor by tensor, for the scorer.

Definitions: ``docs/definitions.md#checkpoints-and-mask-files``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from safetensors import SafetensorError, safe_open

from lacuna_metrics.manifest import save_tensors
from lacuna_metrics.masks.mask_set import (
    MaskError,
    MaskSet,
    _check_fingerprint,
    _checked_groups,
    _numel,
    _shape_str,
    _stray_bit,
    component,
    group_bits,
)

if TYPE_CHECKING:
    from lacuna_metrics.weights.checkpoints import Scratch

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MODEL_KEY",
    "MaskReader",
    "Verification",
    "load_masks",
    "save_masks",
    "stamp_masks",
    "storage_dtype",
]

#: ``format`` / ``version`` metadata of our safetensors mask files. Version 2 stores uint8 bit fields when
#: ``num_groups <= 8`` (int32 otherwise); version 1 files (always int32) are still read.
FORMAT_NAME: str = "lacuna-bench-masks"
FORMAT_VERSION: str = "2"
_READABLE_VERSIONS = {"1": ("I32",), "2": ("U8", "I32")}
_SAFETENSORS_NAMES = {"U8": torch.uint8, "I32": torch.int32}

_REQUIRED_METADATA = ("format", "version", "num_groups", "budget", "seed", "forget_groups", "retain_groups")
_ORDER_KEY = "tensor_order"
#: Optional metadata: :meth:`lacuna_metrics.weights.checkpoints.Checkpoint.fingerprint` of the model the masks describe.
MODEL_KEY = "model_fingerprint"
_RESERVED_METADATA = frozenset((*_REQUIRED_METADATA, _ORDER_KEY, MODEL_KEY))
_TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def storage_dtype(num_groups: int) -> torch.dtype:
    """The on-disk bit field of a mask file: uint8 when every group fits in 8 bits, else int32."""
    return torch.uint8 if num_groups <= 8 else torch.int32


def save_masks(maskset: MaskSet, path: str | os.PathLike[str], *, model_fingerprint: str | None = None) -> Path:
    """Write ``maskset`` atomically as a safetensors file with one bit-field tensor per mask and string metadata.

    The bit field is :func:`storage_dtype` (uint8 for up to 8 groups, the bits unchanged). ``model_fingerprint``
    (default: ``maskset.model_fingerprint``) is :meth:`lacuna_metrics.weights.checkpoints.Checkpoint.fingerprint` of the
    model the masks describe; ``lacuna score`` then refuses them for another model. Masks built before that model
    exists (the testbed's injection) are stamped afterwards with :func:`stamp_masks`.

    The file is written to a temporary file in the target directory and then ``os.replace``-d, so readers
    never see a partial file. Unknown ``budget`` / ``seed`` are stored as empty strings.
    """
    path = Path(path)
    clash = sorted(_RESERVED_METADATA & set(maskset.extra))
    if clash:
        raise MaskError(f"extra metadata uses reserved keys {clash}")
    assert maskset.forget_groups is not None and maskset.retain_groups is not None
    metadata = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "num_groups": str(maskset.num_groups),
        "budget": "" if maskset.budget is None else repr(float(maskset.budget)),
        "seed": "" if maskset.seed is None else str(int(maskset.seed)),
        "forget_groups": ",".join(str(g) for g in maskset.forget_groups),
        "retain_groups": ",".join(str(g) for g in maskset.retain_groups),
        _ORDER_KEY: json.dumps(list(maskset.packed)),
        **maskset.extra,
    }
    fingerprint = model_fingerprint or maskset.model_fingerprint
    if fingerprint is not None:
        metadata[MODEL_KEY] = _check_fingerprint(fingerprint)
    dtype = storage_dtype(maskset.num_groups)
    return save_tensors(path, {name: t.to(dtype) for name, t in maskset.packed.items()}, metadata)


def stamp_masks(path: str | os.PathLike[str], model_fingerprint: str) -> Path:
    """Record ``model_fingerprint`` in an existing mask file of ours, atomically; the tensors are not touched.

    The testbed builds its masks before the injected model exists; once it does, this ties the file to it
    (``lacuna score`` compares it with ``--before``'s fingerprint). The tensors are not loaded: they are mapped from
    the file and written by the shared atomic writer (:func:`lacuna_metrics.manifest.save_tensors`, which streams
    them from the mapping), with the new metadata; the file mode is kept. Raises MaskError for a file that is not
    one of ours (a ``mask.pt`` cannot be stamped).
    """
    import contextlib
    import mmap
    import stat

    path = Path(path)
    fingerprint = _check_fingerprint(model_fingerprint)
    if not path.is_file():
        raise FileNotFoundError(f"mask file not found: {path}")
    if _sniff(path) != "safetensors":
        raise MaskError(f"{path}: a PyTorch mask.pt cannot be stamped; convert it with load_masks + save_masks")
    with path.open("rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        try:
            header = json.loads(fh.read(n)) if 0 < n <= 100 * 1024 * 1024 else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            header = None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT_NAME:
        raise MaskError(f"{path}: not a {FORMAT_NAME} file (no such metadata); only our mask files can be stamped")
    assert isinstance(header, dict)
    mode = stat.S_IMODE(path.stat().st_mode)
    with path.open("rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        save_tensors(path, _mapped_tensors(path, header, mapped, 8 + n), {**metadata, MODEL_KEY: fingerprint})
    finally:
        with contextlib.suppress(BufferError):  # views still held by a traceback: freed with it
            mapped.close()
    os.chmod(path, mode)
    return path


def _mapped_tensors(path: Path, header: dict[str, Any], mapped: Any, base: int) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors ``header`` as views of the file mapped at ``mapped`` (data from ``base``), in
    file order, without reading them (copy-on-write mapping: never written, so no page is copied)."""
    tensors: dict[str, torch.Tensor] = {}
    entries = sorted(((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"])
    for name, info in entries:
        dtype = _SAFETENSORS_NAMES.get(info.get("dtype"))
        if dtype is None:
            raise MaskError(f"{path}: tensor {name!r} has dtype {info.get('dtype')}, not a mask bit field")
        start, stop = (int(v) for v in info["data_offsets"])
        shape = tuple(int(d) for d in info["shape"])
        count = (stop - start) // torch.empty((), dtype=dtype).element_size()
        if count != _numel(shape) or base + stop > len(mapped):
            raise MaskError(f"{path}: tensor {name!r}: its data does not fit its shape {_shape_str(shape)}")
        flat = (
            torch.frombuffer(mapped, dtype=dtype, count=count, offset=base + start)
            if count
            else torch.empty(0, dtype=dtype)
        )
        tensors[name] = flat.reshape(shape)
    return tensors


def load_masks(
    path: str | os.PathLike[str],
    *,
    num_groups: int | None = None,
    forget_groups: tuple[int, ...] | None = None,
    retain_groups: tuple[int, ...] | None = None,
) -> MaskSet:
    """Read our safetensors mask file or a released LACUNA ``mask.pt``. The kind is detected from the bytes.

    safetensors: metadata is validated; ``num_groups``, if given, must agree with it. ``mask.pt``: a dict
    ``name -> flat int32 tensor`` read only via ``torch.load(weights_only=True)``. Its tensors stay flat
    (call :meth:`MaskSet.reshape_to`) and all-zero vectors are kept. ``num_groups`` defaults to 6 and
    budget/seed are None. Malformed files raise MaskError naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"mask file not found: {path}")
    if _sniff(path) == "torch":
        return _load_mask_pt(path, num_groups, forget_groups, retain_groups)
    return _load_safetensors(path, num_groups, forget_groups, retain_groups)


def _sniff(path: Path) -> Literal["torch", "safetensors"]:
    with path.open("rb") as fh:
        head = fh.read(9)
    if len(head) == 9 and head[8:9] == b"{":  # u64 header length, then the JSON header
        return "safetensors"
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":  # torch zip archive / legacy pickle
        return "torch"
    return "torch" if path.suffix in _TORCH_SUFFIXES else "safetensors"


def _parse_groups(path: Path, key: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",")) if text else ()
    except ValueError:
        raise MaskError(f"{path}: metadata {key}={text!r} is not a comma-separated list of integers") from None


def _load_safetensors(
    path: Path,
    num_groups: int | None,
    forget_groups: tuple[int, ...] | None,
    retain_groups: tuple[int, ...] | None,
) -> MaskSet:
    packed: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            metadata = fh.metadata() or {}
            missing = [k for k in _REQUIRED_METADATA if k not in metadata]
            if missing:
                raise MaskError(
                    f"{path}: missing metadata keys {missing}; not a {FORMAT_NAME} file (use load_masks on our "
                    f"safetensors output or a LACUNA mask.pt)"
                )
            allowed = _READABLE_VERSIONS.get(metadata["version"], ("I32",))
            for name in fh.keys():
                dtype = fh.get_slice(name).get_dtype()
                if dtype not in allowed:
                    raise MaskError(
                        f"{path}: tensor {name!r} has dtype {dtype}, expected {' or '.join(allowed)} "
                        f"(mask file version {metadata['version']})"
                    )
                packed[name] = fh.get_tensor(name).to(torch.int32)
    except MaskError:
        raise
    except (SafetensorError, OSError, ValueError) as exc:
        raise MaskError(f"{path} is not a readable safetensors mask file: {exc}") from exc

    if metadata["format"] != FORMAT_NAME:
        raise MaskError(f"{path}: metadata format={metadata['format']!r}, expected {FORMAT_NAME!r}")
    if metadata["version"] not in _READABLE_VERSIONS:
        raise MaskError(
            f"{path}: unsupported mask file version {metadata['version']!r} (expected one of {sorted(_READABLE_VERSIONS)})"
        )
    try:
        file_groups = int(metadata["num_groups"])
        budget = float(metadata["budget"]) if metadata["budget"] else None
        seed = int(metadata["seed"]) if metadata["seed"] else None
    except ValueError as exc:
        raise MaskError(f"{path}: malformed metadata: {exc}") from exc
    if num_groups is not None and num_groups != file_groups:
        raise MaskError(f"{path} holds {file_groups} groups but num_groups={num_groups} was requested")
    if _ORDER_KEY in metadata:
        try:
            order = json.loads(metadata[_ORDER_KEY])
        except json.JSONDecodeError as exc:
            raise MaskError(f"{path}: malformed metadata {_ORDER_KEY}: {exc}") from exc
        if not isinstance(order, list) or sorted(order) != sorted(packed):
            raise MaskError(f"{path}: metadata {_ORDER_KEY} does not list exactly the stored tensors")
        packed = {name: packed[name] for name in order}
    extra = {k: v for k, v in metadata.items() if k not in _RESERVED_METADATA}
    try:
        return MaskSet(
            packed=packed,
            model_fingerprint=metadata.get(MODEL_KEY) or None,
            num_groups=file_groups,
            budget=budget,
            seed=seed,
            forget_groups=(
                _parse_groups(path, "forget_groups", metadata["forget_groups"])
                if forget_groups is None
                else forget_groups
            ),
            retain_groups=(
                _parse_groups(path, "retain_groups", metadata["retain_groups"])
                if retain_groups is None
                else retain_groups
            ),
            extra=extra,
        )
    except MaskError as exc:
        raise MaskError(f"{path}: {exc}") from exc


def _load_mask_pt(
    path: Path,
    num_groups: int | None,
    forget_groups: tuple[int, ...] | None,
    retain_groups: tuple[int, ...] | None,
) -> MaskSet:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises pickle, zip and runtime errors alike
        raise MaskError(f"{path} could not be read as a LACUNA mask.pt: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, Mapping):
        raise MaskError(f"{path}: expected a dict name -> int32 tensor, got {type(obj).__name__}")
    packed: dict[str, torch.Tensor] = {}
    for name, tensor in obj.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise MaskError(f"{path}: entry {name!r} is not a str -> tensor pair")
        if tensor.dtype != torch.int32:
            raise MaskError(f"{path}: tensor {name!r} has dtype {tensor.dtype}, expected torch.int32")
        packed[name] = tensor
    try:
        return MaskSet(
            packed=packed,
            num_groups=6 if num_groups is None else num_groups,
            budget=None,
            seed=None,
            forget_groups=forget_groups,
            retain_groups=retain_groups,
            extra={"source_format": "mask.pt", "source_file": path.name},
        )
    except MaskError as exc:
        raise MaskError(f"{path}: {exc}") from exc


def mask_num_groups(path: str | os.PathLike[str]) -> int:
    """The number of groups of a mask file without reading its tensors: our file's metadata, or LACUNA's six for a
    released ``mask.pt`` (its ``num_groups`` config; a stray bit is refused when the tensors are read)."""
    path = Path(path)
    if _sniff(path) == "torch":
        return 6
    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            return int((fh.metadata() or {})["num_groups"])
    except (SafetensorError, OSError, KeyError, ValueError) as exc:
        raise MaskError(f"{path}: no readable num_groups in the mask file's metadata ({exc})") from None


# --------------------------------------------------------------------------------------------------
# Streaming access for scorers


class MaskReader:
    """Packed masks read tensor by tensor, so scoring a 7B pair never holds all masks at once.

    Our safetensors files are read in row blocks from disk. A released ``mask.pt`` (a pickle) is
    loaded whole with ``torch.load(weights_only=True)`` and its flat vectors are reshaped on read.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        forget_groups: tuple[int, ...] | None = None,
        retain_groups: tuple[int, ...] | None = None,
    ) -> None:
        from lacuna_metrics.weights.checkpoints import Checkpoint, CheckpointError

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"mask file not found: {self.path}")
        self._memory: MaskSet | None = None
        self._file: Checkpoint | None = None
        #: The model these masks were built for (our files only); None: they cannot be tied to a model.
        self.model_fingerprint: str | None = None
        if _sniff(self.path) == "torch":
            self._memory = load_masks(self.path, forget_groups=forget_groups, retain_groups=retain_groups)
            meta = self._memory
            self.num_groups, self.forget_groups, self.retain_groups = (
                meta.num_groups,
                meta.forget_groups,
                meta.retain_groups,
            )
            self.names = list(meta.packed)
        else:
            try:
                with safe_open(str(self.path), framework="pt", device="cpu") as fh:
                    metadata = fh.metadata() or {}
                self._file = Checkpoint(self.path, masks=True)
            except (SafetensorError, OSError, CheckpointError) as exc:
                raise MaskError(f"{self.path} is not a readable safetensors mask file: {exc}") from exc
            missing = [k for k in _REQUIRED_METADATA if k not in metadata]
            if missing or metadata.get("format") != FORMAT_NAME:
                raise MaskError(f"{self.path}: missing metadata {missing or ['format']}; not a {FORMAT_NAME} file")
            try:
                self.num_groups = int(metadata["num_groups"])
            except ValueError as exc:
                raise MaskError(f"{self.path}: malformed metadata num_groups: {exc}") from exc
            try:
                self.forget_groups, self.retain_groups = _checked_groups(
                    self.num_groups,
                    forget_groups or _parse_groups(self.path, "forget_groups", metadata["forget_groups"]),
                    retain_groups or _parse_groups(self.path, "retain_groups", metadata["retain_groups"]),
                )
                if metadata.get(MODEL_KEY):
                    self.model_fingerprint = _check_fingerprint(metadata[MODEL_KEY])
            except MaskError as exc:
                raise MaskError(f"{self.path}: {exc}") from None
            version = metadata["version"]
            if version not in _READABLE_VERSIONS:
                raise MaskError(f"{self.path}: unsupported mask file version {version!r}")
            allowed = {_SAFETENSORS_NAMES[d] for d in _READABLE_VERSIONS[version]}
            for name in self._file.names:
                if self._file.info(name).dtype not in allowed:
                    raise MaskError(
                        f"{self.path}: tensor {name!r} is {self._file.info(name).dtype}, expected "
                        f"{' or '.join(_READABLE_VERSIONS[version])} (mask file version {version})"
                    )
            self.names = list(self._file.names)
        self.forget_bits = group_bits(self.forget_groups or ())
        self.retain_bits = group_bits(self.retain_groups or ())

    def verify(self) -> str:
        """Read the whole file once: return its fingerprint (:func:`~lacuna_metrics.weights.checkpoints.file_fingerprint`,
        the same digest) and refuse a scalar with a bit at or beyond ``num_groups`` set, naming tensor and bit.

        Such a bit belongs to no group: the scorer would silently count the scalar as outside every group.
        """
        import hashlib

        from lacuna_metrics.weights.checkpoints import Scratch, _hash_range, file_fingerprint

        if self._memory is not None:
            for name, packed in self._memory.packed.items():
                self._refuse_stray_bits(name, packed)
            return file_fingerprint(self.path)
        assert self._file is not None
        ckpt, digest, scratch, done = self._file, hashlib.sha256(), Scratch(), 0
        infos = sorted((ckpt.info(n) for n in ckpt.names if not ckpt.is_alias(n)), key=lambda i: i.offset)
        for info in infos:  # header and gaps hashed as they are, tensors while their bits are checked
            if info.offset < done:
                raise MaskError(f"{self.path}: the data of tensor {info.name!r} overlaps another tensor's")
            _hash_range(self.path, done, info.offset - done, digest)
            for start, stop in ckpt.iter_blocks(info.name, 1 << 24):
                block = ckpt.read_raw(info.name, start, stop, scratch=scratch).reshape(-1)
                digest.update(block.view(torch.uint8).numpy().data)
                self._refuse_stray_bits(info.name, block)
            done = info.offset + torch.empty((), dtype=info.dtype).element_size() * info.numel
        _hash_range(self.path, done, self.path.stat().st_size - done, digest)
        return "sha256:" + digest.hexdigest()

    def verify_in_background(self) -> Verification:
        """:meth:`verify` on a thread of its own, started now: the scorer's walk runs meanwhile (reading and
        hashing the whole file costs seconds of a large model's mask, serial if done first), checks
        :meth:`Verification.check` before each block, so a stray bit still stops it early, and takes the
        fingerprint from :meth:`Verification.result` once the walk is done."""
        return Verification(self.verify)

    def check_model(self, names: Iterable[str], shape_of: Any, source: str) -> None:
        """Before any scalar is read: every masked attention/MLP tensor exists in the model ``source`` (tensor
        ``names``, ``shape_of(name)`` its shape) with the mask's shape, and at least one does."""
        have = set(names)
        masked = [n for n in self.names if component(n) is not None]
        missing = [n for n in masked if n not in have]
        if missing:
            raise MaskError(f"{self.path} masks {len(missing)} tensors missing from {source}: {missing[:8]}")
        if not masked:
            raise MaskError(f"{self.path}: no masked attention/MLP tensors in {source}")
        for n in masked:
            self.check_shape(n, tuple(shape_of(n)), source)

    def _refuse_stray_bits(self, name: str, packed: torch.Tensor) -> None:
        bit = _stray_bit(packed, self.num_groups)
        if bit is not None:
            raise MaskError(
                f"{self.path}: mask for {name!r} sets bit {bit}, but the file has num_groups={self.num_groups} "
                f"(bits 0-{self.num_groups - 1}); it was built for more groups, or the file is damaged"
            )

    def numel(self, name: str) -> int:
        if self._memory is not None:
            return int(self._memory.packed[name].numel())
        assert self._file is not None
        return self._file.info(name).numel

    def shape(self, name: str) -> tuple[int, ...]:
        if self._memory is not None:
            return tuple(self._memory.packed[name].shape)
        assert self._file is not None
        return self._file.shape(name)

    def read(
        self, name: str, shape: tuple[int, ...], start: int, stop: int, *, scratch: Scratch | None = None
    ) -> torch.Tensor:
        """Rows ``[start, stop)`` of the packed mask of ``name``, viewed with the parameter's ``shape``, in the
        stored bit field (uint8 or int32; the same bits)."""
        if self._memory is not None:
            return self._memory.packed[name].reshape(shape)[start:stop]
        assert self._file is not None
        return self._file.read_raw(name, start, stop, scratch=scratch)

    def check_shape(self, name: str, shape: tuple[int, ...], source: str) -> None:
        """Fail with a message naming the tensor when its mask does not fit the parameter."""
        mask_shape = self.shape(name)
        flat_ok = self._memory is not None and len(mask_shape) == 1 and mask_shape[0] == _numel(shape)
        if mask_shape != tuple(shape) and not flat_ok:
            raise MaskError(
                f"{self.path}: mask for {name!r} has shape {_shape_str(mask_shape)} but {source} has {_shape_str(shape)}"
            )


class Verification:
    """A :meth:`MaskReader.verify` running on a daemon thread (an error elsewhere need not wait for it)."""

    def __init__(self, verify: Callable[[], str]) -> None:
        self._future: Future[str] = Future()

        def run() -> None:
            try:
                self._future.set_result(verify())
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                self._future.set_exception(exc)

        threading.Thread(target=run, name="lacuna-mask-verify", daemon=True).start()

    def check(self) -> None:
        """Raise the verification's error if it has already failed (never waits)."""
        if self._future.done() and (exc := self._future.exception()) is not None:
            raise exc

    def result(self) -> str:
        """Wait for the verification: the mask file's fingerprint, or its error raised."""
        return self._future.result()
