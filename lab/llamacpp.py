"""The lab's model engine: llama.cpp's real ``llama-server``, built here, and a tiny random model.

The lab has no GPU and no prebuilt llama.cpp server installs on its Debian 12 and 13 hosts
(docs/serving.md says why), so the controller builds one, once: PyPI's ``llama-cpp-python``
sdist, pinned by version and sha256 (the hash checked before the archive is opened), vendors
llama.cpp (``vendor/llama.cpp``, its ``tools/server`` included). Only ``llama-server`` is
built, without optimisation (a tiny model needs no speed; the compile is what costs), without
OpenMP, libstdc++ and libgcc linked in: the binary needs glibc alone, built on Debian 12's
(2.36), so it runs on the lab's Debian 12 and 13 hosts. It lands in the lab's cache
(:data:`CACHE`, beside the images), named by the sdist's hash and the build's flags, and is
reused by every later lab. ``python -m lab.llamacpp build`` builds it (``./test`` starts it in
the background while the lab boots); :func:`server` waits for a build another process runs.

The model is a tiny llama-architecture model with random weights, made on the spot
(:func:`write_tiny_model`): a GGUF file of 64-wide embeddings, two blocks, and a byte-level
vocabulary (SentencePiece-style: every byte a token, printable ASCII as its own). Nothing
comes from a model hub. It answers completions with random text, which is all the lab needs.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import random
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from array import array
from pathlib import Path

from sparkrig.atomic import file_sha256

from .config import CACHE_DIR
from .system import LabError

VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# pip, run by uv (pinned), downloads the sdist by name from the package index the machine uses.
PIP = "pip==25.3"
CACHE = CACHE_DIR / "llama-cpp"
SOURCE = "vendor/llama.cpp"
# No optimisation (CMake's "None" type adds no -O: llama.cpp's own default would be Release),
# only what llama-server needs, nothing downloaded (LLAMA_USE_PREBUILT_UI off), glibc alone.
FLAGS = (
    "-G",
    "Ninja",
    "-DCMAKE_BUILD_TYPE=None",
    "-DGGML_NATIVE=OFF",
    "-DGGML_OPENMP=OFF",
    "-DGGML_CCACHE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc",
)
TARGET = "llama-server"


def build_key() -> str:
    """The cached binary's name part: the sdist's hash and the build's flags."""
    return hashlib.sha256("\n".join((SDIST_SHA256, *FLAGS, TARGET)).encode()).hexdigest()[:16]


def server_path() -> Path:
    return CACHE / f"llama-server-{VERSION}-{build_key()}"


def verified_sdist(path: Path, sha256: str = SDIST_SHA256) -> Path:
    """``path`` when its sha256 is the pinned one; a LabError otherwise (nothing opened)."""
    found = file_sha256(path)
    if found != sha256:
        raise LabError(f"{path}: sha256 {found}, not the pinned {sha256}: not used (remove it to download again)")
    return path


def fetch_sdist() -> Path:
    """The pinned sdist in the cache: downloaded by pip, by name and version, with its sha256
    required (``--require-hashes``: pip refuses any other file), then checked again before any
    use. Only this package comes as source (``--no-binary llama-cpp-python``) and nothing else
    is fetched (``--no-deps``): no build backend is built."""
    path = CACHE / SDIST
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".download-", dir=CACHE))
        try:
            (work / "requirements.txt").write_text(f"llama-cpp-python=={VERSION} --hash=sha256:{SDIST_SHA256}\n")
            argv = [
                "uv",
                "tool",
                "run",
                "--from",
                PIP,
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                "llama-cpp-python",
            ]
            argv += ["--require-hashes", "-r", str(work / "requirements.txt"), "-d", str(work), "-q"]
            done = subprocess.run(
                [*argv, "--disable-pip-version-check"], capture_output=True, text=True, timeout=600, check=False
            )
            if done.returncode != 0 or not (work / SDIST).exists():
                raise LabError(
                    f"llama-cpp-python {VERSION}: not downloaded (pip exit {done.returncode}): {done.stderr[-500:]}"
                )
            os.replace(work / SDIST, path)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return verified_sdist(path)


def _extract(sdist: Path, into: Path) -> Path:
    prefix = f"llama_cpp_python-{VERSION}/{SOURCE}/"
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
        archive.extractall(into, members=members, filter="data")
    return into / prefix


def build(log=print) -> Path:
    """llama-server built from the verified sdist into the cache; the cached one when it is
    there. One build at a time (a lock in the cache): a second caller waits for the first."""
    target = server_path()
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        sdist = fetch_sdist()
        started = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix="build-", dir=CACHE))
        build_log = CACHE / f"build-{build_key()}.log"
        try:
            source = _extract(sdist, work / "src")
            with open(build_log, "w") as out:
                for argv in (
                    ["cmake", "-S", str(source), "-B", str(work / "build"), *FLAGS],
                    ["ninja", "-C", str(work / "build"), TARGET],
                ):
                    done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=3600, check=False)
                    if done.returncode != 0:
                        raise LabError(f"{' '.join(argv[:2])} failed (exit {done.returncode}): see {build_log}")
            built = work / "build" / "bin" / TARGET
            subprocess.run(["strip", str(built)], check=True, timeout=120)
            os.chmod(built, 0o755)
            os.replace(built, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log(f"llama-server built in {time.monotonic() - started:.0f} s: {target}")
        return target


def server() -> Path:
    """The cached llama-server, built (or waited for) first where needed."""
    return build(log=lambda _line: None)


# --- the tiny random model ------------------------------------------------------------------

# GGUF, as the sdist's gguf-py writes it (gguf-py/gguf/constants.py, gguf_writer.py): version 3,
# little-endian, 32-byte alignment, value types by number.
_MAGIC, _GGUF_VERSION, _ALIGN = b"GGUF", 3, 32
_U32, _I32, _F32, _BOOL, _STRING, _ARRAY = 4, 5, 6, 7, 8, 9
_TOKEN_NORMAL, _TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_BYTE = 1, 2, 3, 6
EMBED, BLOCKS, FFN, HEADS, CONTEXT = 64, 2, 128, 4, 2048


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _value(kind: int, value) -> bytes:
    if kind == _STRING:
        return _string(value)
    if kind == _ARRAY:
        element, items = value
        return struct.pack("<IQ", element, len(items)) + b"".join(_value(element, item) for item in items)
    return struct.pack({_U32: "<I", _I32: "<i", _F32: "<f", _BOOL: "<?"}[kind], value)


def _vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [_TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_CONTROL] + [_TOKEN_BYTE] * 256
    words = ["\u2581", *(chr(c) for c in range(0x21, 0x7F))]  # SentencePiece's space, then ASCII
    tokens += words
    types += [_TOKEN_NORMAL] * len(words)
    return tokens, [0.0] * len(tokens), types


def write_tiny_model(path: Path, seed: int = 0) -> Path:
    """A llama-architecture GGUF with random weights (float32) at ``path``: about 0.6 MB."""
    tokens, scores, types = _vocabulary()
    metadata = [
        ("general.architecture", _STRING, "llama"),
        ("general.name", _STRING, "sparkrig-lab-tiny-random"),
        ("general.file_type", _U32, 0),
        ("llama.context_length", _U32, CONTEXT),
        ("llama.embedding_length", _U32, EMBED),
        ("llama.block_count", _U32, BLOCKS),
        ("llama.feed_forward_length", _U32, FFN),
        ("llama.attention.head_count", _U32, HEADS),
        ("llama.attention.head_count_kv", _U32, HEADS),
        ("llama.attention.layer_norm_rms_epsilon", _F32, 1e-5),
        ("llama.rope.dimension_count", _U32, EMBED // HEADS),
        ("tokenizer.ggml.model", _STRING, "llama"),
        ("tokenizer.ggml.tokens", _ARRAY, (_STRING, tokens)),
        ("tokenizer.ggml.scores", _ARRAY, (_F32, scores)),
        ("tokenizer.ggml.token_type", _ARRAY, (_I32, types)),
        ("tokenizer.ggml.unknown_token_id", _U32, 0),
        ("tokenizer.ggml.bos_token_id", _U32, 1),
        ("tokenizer.ggml.eos_token_id", _U32, 2),
    ]
    shapes = [("token_embd.weight", (EMBED, len(tokens))), ("output_norm.weight", (EMBED,))]
    for i in range(BLOCKS):
        shapes += [
            (f"blk.{i}.attn_norm.weight", (EMBED,)),
            (f"blk.{i}.attn_q.weight", (EMBED, EMBED)),
            (f"blk.{i}.attn_k.weight", (EMBED, EMBED)),
            (f"blk.{i}.attn_v.weight", (EMBED, EMBED)),
            (f"blk.{i}.attn_output.weight", (EMBED, EMBED)),
            (f"blk.{i}.ffn_norm.weight", (EMBED,)),
            (f"blk.{i}.ffn_gate.weight", (EMBED, FFN)),
            (f"blk.{i}.ffn_down.weight", (FFN, EMBED)),
            (f"blk.{i}.ffn_up.weight", (EMBED, FFN)),
        ]
    rng = random.Random(seed)
    blobs, infos, offset = [], [], 0
    for name, shape in shapes:
        count = 1
        for n in shape:
            count *= n
        # Norms at one, the rest small and random: the model computes, and says nothing.
        values = array("f", [1.0] * count if len(shape) == 1 else (rng.uniform(-0.5, 0.5) for _ in range(count)))
        if sys.byteorder != "little":
            values.byteswap()
        blob = values.tobytes()
        infos.append(
            _string(name)
            + struct.pack("<I", len(shape))
            + b"".join(struct.pack("<Q", n) for n in shape)
            # type 0: F32; the offset within the data section
            + struct.pack("<IQ", 0, offset)
        )
        padded = blob + b"\0" * (-len(blob) % _ALIGN)
        blobs.append(padded)
        offset += len(padded)
    header = _MAGIC + struct.pack("<IQQ", _GGUF_VERSION, len(shapes), len(metadata))
    header += b"".join(_string(key) + struct.pack("<I", kind) + _value(kind, value) for key, kind, value in metadata)
    header += b"".join(infos)
    header += b"\0" * (-len(header) % _ALIGN)
    temp = path.with_name(path.name + ".new")
    temp.write_bytes(header + b"".join(blobs))
    os.replace(temp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.llamacpp", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build llama-server into the lab's cache (nothing when it is there)")
    model = sub.add_parser("model", help="write the tiny random model")
    model.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    if args.command == "build":
        started = time.monotonic()
        path = build()
        print(f"{path} ({time.monotonic() - started:.0f} s)")
    else:
        print(write_tiny_model(args.path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
