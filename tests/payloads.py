"""Real code-execution payloads for checkpoint files (regression tests of issue 13).

Each payload, when unpickled by an unrestricted unpickler, creates the file `marker`; a test
asserts that llmtrain's loaders refuse every one and that the marker never appears, and (as a
control) that plain ``pickle.loads`` does create it, so the payloads are known to be live.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any


def _unicode(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE


def _stack_global(module: str, name: str, arg: str, protocol: int = 4) -> bytes:
    """PROTO n; module; name; STACK_GLOBAL; (arg,); REDUCE; STOP: protocol 4+ resolves a dotted
    name attribute by attribute, so ("pathlib", "os.system") is os.system."""
    frame = _unicode(module) + _unicode(name) + b"\x93" + _unicode(arg) + b"\x85R."
    return b"\x80" + bytes([protocol]) + b"\x95" + struct.pack("<Q", len(frame)) + frame


def _global(module: str, name: str, arg: str, protocol: int) -> bytes:
    """GLOBAL opcode (text), as protocols 0-3 write it."""
    head = b"" if protocol < 2 else b"\x80" + bytes([protocol])
    return head + f"c{module}\n{name}\n(V{arg}\ntR.".encode()


class _Reduce:
    def __init__(self, func: Any, args: tuple[Any, ...]):
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args


def pickle_payloads(marker: Path) -> dict[str, bytes]:
    """name -> pickle bytes that create `marker` when unpickled without restrictions."""
    shell = f"touch {marker}"
    python = f"open({str(marker)!r}, 'w').close()"
    out: dict[str, bytes] = {}
    for protocol in range(6):
        out[f"os.system-reduce-p{protocol}"] = pickle.dumps(
            _Reduce(os.system, (shell,)), protocol=protocol
        )
        out[f"builtins.eval-global-p{protocol}"] = _global("builtins", "eval", python, protocol)
        out[f"builtins.exec-global-p{protocol}"] = _global("builtins", "exec", python, protocol)
    for protocol in (4, 5):
        # Dotted names through modules an allow-list might accept as a whole.
        out[f"dotted-dcp-metadata-p{protocol}"] = _stack_global(
            "torch.distributed.checkpoint.metadata", "os.system", shell, protocol
        )
        out[f"dotted-pathlib-p{protocol}"] = _stack_global("pathlib", "os.system", shell, protocol)
        out[f"dotted-torch-p{protocol}"] = _stack_global("torch", "os.system", shell, protocol)
    # getattr(__import__('os'), 'system')(cmd), built from builtins only.
    out["builtins.getattr-chain-p0"] = (
        f"cbuiltins\ngetattr\n(cbuiltins\n__import__\n(Vos\ntRVsystem\ntR(V{shell}\ntR."
    ).encode()
    return out


def torch_file_with_pickle(raw: bytes) -> bytes:
    """A torch.save zip file whose data.pkl is `raw` (what torch.load unpickles)."""
    import torch

    buffer = io.BytesIO()
    torch.save({"x": 1}, buffer)
    source = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = raw if info.filename.endswith("/data.pkl") else source.read(info)
            target.writestr(info, data)
    return out.getvalue()


def torch_save_payloads(marker: Path) -> dict[str, bytes]:
    """name -> torch.save-format bytes whose unpickling creates `marker`."""
    import torch

    out = {name: torch_file_with_pickle(raw) for name, raw in pickle_payloads(marker).items()}
    for protocol in (2, 3, 4, 5):
        buffer = io.BytesIO()
        torch.save(_Reduce(os.system, (f"touch {marker}",)), buffer, pickle_protocol=protocol)
        out[f"torch.save-reduce-p{protocol}"] = buffer.getvalue()
    return out


def rewrite_manifest(folder: Path) -> None:
    """What an attacker with write access does after tampering: make the (unsigned) manifest
    agree with the files again."""
    import hashlib
    import json

    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p != manifest_path):
        rel = path.relative_to(folder).as_posix()
        files[rel] = {
            "size": path.stat().st_size,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
    manifest["files"] = files
    manifest["total_bytes"] = sum(f["size"] for f in files.values())
    manifest.pop("hmac_sha256", None)
    manifest_path.write_text(json.dumps(manifest))
