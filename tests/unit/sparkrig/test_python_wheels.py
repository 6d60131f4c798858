"""python_offline's wheels on the controller (sparkrig/python_wheels.py): the choice of each
host's wheel, and what the controller takes from a package index, against a real HTTP server
on 127.0.0.1 (http.server) that plays the index, honest or hostile."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sparkrig import python_wheels

ABI3 = "torchao-0.18.0-cp310-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"
ANY = "torchao-0.18.0-py3-none-any.whl"
BODY = {ABI3: b"abi3 wheel", ANY: b"any wheel"}
SHA = {name: hashlib.sha256(body).hexdigest() for name, body in BODY.items()}


def sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


class Index:
    """A package index on 127.0.0.1: ``pages[path] = (content type, body)``, where a body is
    bytes or a function that writes the answer itself (after the status line and headers);
    ``asked`` lists each path asked, in order."""

    def __init__(self):
        self.pages: dict[str, tuple[str, object]] = {}
        self.asked: list[str] = []
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                index.asked.append(self.path)
                if self.path not in index.pages:
                    self.send_error(404)
                    return
                kind, body = index.pages[self.path]
                self.send_response(200)
                self.send_header("Content-Type", kind)
                if isinstance(body, bytes):
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_header("Connection", "close")
                    self.end_headers()
                    try:
                        body(self.wfile)
                    except (BrokenPipeError, ConnectionResetError):  # the controller hung up: right
                        pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.simple = f"{self.url}/simple"

    def project(self, name: str, files: dict[str, str], urls: dict[str, str] | None = None) -> None:
        """Project ``name``'s PEP 691 page: each file with its sha256, at ``/files/NAME`` (or ``urls[NAME]``)."""
        answer = {
            "files": [
                {"filename": f, "url": (urls or {}).get(f, f"{self.url}/files/{f}"), "hashes": {"sha256": h}}
                for f, h in files.items()
            ]
        }
        self.pages[f"/simple/{name}/"] = (python_wheels._SIMPLE_JSON, json.dumps(answer).encode())

    def wheel(self, filename: str, body) -> None:
        self.pages[f"/files/{filename}"] = ("application/octet-stream", body)


@pytest.fixture
def index(monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1")  # urllib would send it to a proxy the environment names
    found = Index()
    threading.Thread(target=found.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield found
    found.server.shutdown()
    found.server.server_close()


def lock(index_url: str, *hashes: str, name: str = "torchao", version: str = "0.18.0") -> str:
    """A lock entry as uv writes it: the pin, its hashes sorted, the index it came from."""
    lines = [f"{name}=={version}", *(f"    --hash=sha256:{h}" for h in sorted(hashes))]
    return " \\\n".join(lines) + f"\n    # from {index_url}\n"


def leftovers(cache) -> list[str]:
    """Files of the cache that are neither a wheel nor its records (a download's remains)."""
    return sorted(
        p.name for p in cache.iterdir() if p.name not in ("sha256.json", "files.json") and not p.name.endswith(".whl")
    )


def test_each_host_gets_the_wheel_its_tags_prefer_whatever_the_cache_holds(tmp_path, index):
    """Found converging the real stack: x86_64 got torchao's abi3 wheel, then its py3-none-any
    one once the aarch64 host had cached that, and the switch was a change at the next converge."""
    index.project("torchao", {ANY: SHA[ANY], ABI3: SHA[ABI3]})
    for name, body in BODY.items():
        index.wheel(name, body)
    text = lock(index.simple, *SHA.values())
    assert list(python_wheels.offline_wheels(text, "aarch64", "3.11", tmp_path)) == [ANY]
    assert list(python_wheels.offline_wheels(text, "x86_64", "3.11", tmp_path)) == [ABI3]
    assert list(python_wheels.offline_wheels(text, "x86_64", "3.11", tmp_path)) == [ABI3]
    assert list(python_wheels.offline_wheels(text, "aarch64", "3.11", tmp_path)) == [ANY]
    # The index's files are kept: later runs ask no index; each wheel was fetched once.
    assert index.asked == ["/simple/torchao/", f"/files/{ANY}", f"/files/{ABI3}"]
    assert (tmp_path / ABI3).read_bytes() == BODY[ABI3] and leftovers(tmp_path) == []


def test_the_order_prefers_the_platform_wheel():
    order = python_wheels.tag_order("x86_64", "3.11")
    assert order.index("cp310-abi3-manylinux_2_28_x86_64") < order.index("py3-none-any")
    assert set(order) == python_wheels.target_tags("x86_64", "3.11")


def test_the_wheel_is_chosen_by_the_hosts_tag_order_not_by_its_name(tmp_path, index):
    """By name, cp311-abi3 comes before cp311-cp311; a CPython 3.11 host prefers cp311-cp311."""
    cp311 = "pkg-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    abi3 = "pkg-1.0-cp311-abi3-manylinux_2_28_x86_64.whl"
    files = {cp311: b"cp311", abi3: b"abi3"}
    index.project("pkg", {f: sha(b) for f, b in files.items()})
    for f, b in files.items():
        index.wheel(f, b)
    text = lock(index.simple, *(sha(b) for b in files.values()), name="pkg", version="1.0")
    assert list(python_wheels.offline_wheels(text, "x86_64", "3.11", tmp_path)) == [cp311]


def test_a_wheel_the_lock_does_not_name_is_never_taken(tmp_path, index):
    """The index lists a wheel that fits the host better than the locked one, with a hash the
    lock does not have (a new upload, or a hostile index): the locked one is taken."""
    index.project("torchao", {ANY: SHA[ANY], ABI3: sha(b"not the locked abi3 wheel")})
    index.wheel(ANY, BODY[ANY])
    index.wheel(ABI3, b"not the locked abi3 wheel")
    assert list(python_wheels.offline_wheels(lock(index.simple, SHA[ANY]), "x86_64", "3.11", tmp_path)) == [ANY]


def test_a_wheel_whose_sha256_differs_from_the_locks_is_refused_and_not_kept(tmp_path, index):
    index.project("torchao", {ANY: SHA[ANY]})
    index.wheel(ANY, b"a wheel someone replaced")
    with pytest.raises(RuntimeError, match="sha256 differs from the lock's"):
        python_wheels.offline_wheels(lock(index.simple, SHA[ANY]), "aarch64", "3.11", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_index_answer_naming_another_scheme_is_refused(tmp_path, index):
    """The index answers file:///... (here a controller file whose sha256
    is the locked one; file:///dev/zero would never end): the controller fetches https, or the
    scheme of the index the lock names (this index's http), nothing else."""
    secret = tmp_path / "controller-file"
    secret.write_bytes(b"the controller's own file")
    cache = tmp_path / "cache"
    index.project("torchao", {ANY: sha(secret.read_bytes())}, urls={ANY: secret.as_uri()})
    with pytest.raises(RuntimeError, match=r"file://.*: refused, only http or https URLs are fetched"):
        python_wheels.offline_wheels(lock(index.simple, sha(secret.read_bytes())), "aarch64", "3.11", cache)
    assert not (cache / ANY).exists()


def test_an_endless_answer_is_cut_at_the_cap_and_leaves_nothing(tmp_path, index, monkeypatch):
    """A wheel's answer that never ends (no length, bytes until the
    controller hangs up) would fill the controller's disk."""
    monkeypatch.setattr(python_wheels, "WHEEL_MAX_BYTES", 1 << 20)

    def endless(out):
        for _ in range(64):  # 64 MiB, then it stops anyway (the test must end unfixed too)
            out.write(b"\0" * (1 << 20))

    index.project("torchao", {ANY: SHA[ANY]})
    index.wheel(ANY, endless)
    with pytest.raises(RuntimeError, match=r"larger than 1048576 bytes, refused"):
        python_wheels.offline_wheels(lock(index.simple, SHA[ANY]), "aarch64", "3.11", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_index_page_larger_than_the_cap_is_refused(tmp_path, index, monkeypatch):
    monkeypatch.setattr(python_wheels, "INDEX_MAX_BYTES", 1 << 16)
    files = {f"torchao-0.{i}-py3-none-any.whl": sha(str(i).encode()) for i in range(2000)}
    index.project("torchao", {**files, ANY: SHA[ANY]})
    with pytest.raises(RuntimeError, match=r"its answer for torchao is larger than 65536 bytes, refused"):
        python_wheels.offline_wheels(lock(index.simple, SHA[ANY]), "aarch64", "3.11", tmp_path)


@pytest.mark.parametrize(
    "answer",
    [
        b'{"meta": {}}',  # no files
        b'{"files": [{"filename": "torchao-0.18.0-py3-none-any.whl"}]}',  # no url, no hashes
        b'{"files": {"filename": 1}}',
        b'{"files": [{"filename": 5, "url": "x", "hashes": {"sha256": "%s"}}]}' % SHA[ANY].encode(),
        b'{"files": [{"filename": "torchao-0.18.0-py3-none-any.whl", "url": "x", "hashes": ["sha256"]}]}',
        b"[]",
        b"not JSON \xff",
    ],
)
def test_a_malformed_index_answer_fails_that_host_not_the_run(tmp_path, index, answer):
    """A KeyError (or TypeError...) out of the index's answer escaped the
    deploy's per-host refusal (it catches OSError, RuntimeError and ValueError) and aborted
    the whole run; it is a RuntimeError naming the index and the package."""
    index.pages["/simple/torchao/"] = (python_wheels._SIMPLE_JSON, answer)
    with pytest.raises(RuntimeError, match=rf"{index.simple}: its answer for torchao is not a simple index's"):
        python_wheels.offline_wheels(lock(index.simple, SHA[ANY]), "aarch64", "3.11", tmp_path)


def test_two_hosts_fetching_one_wheel_at_once_both_get_it(tmp_path, index):
    """Two hosts' deploys (one controller) fetched the same wheel into one
    shared ``.part`` file, and one of them failed. The wheel comes slowly here, so both
    downloads are under way at once."""
    both = threading.Barrier(2, timeout=30)

    def slow(out):
        both.wait()  # each answer starts once both hosts asked
        out.write(BODY[ANY][:4])
        out.flush()
        time.sleep(0.3)
        out.write(BODY[ANY][4:])

    index.project("torchao", {ANY: SHA[ANY]})
    index.wheel(ANY, slow)
    text = lock(index.simple, SHA[ANY])
    caches = [tmp_path, tmp_path]
    with ThreadPoolExecutor(2) as pool:
        found = list(pool.map(lambda cache: python_wheels.offline_wheels(text, "aarch64", "3.11", cache), caches))
    assert found == [{ANY: str(tmp_path / ANY)}] * 2
    assert (tmp_path / ANY).read_bytes() == BODY[ANY] and leftovers(tmp_path) == []


def test_the_temporary_names_are_each_downloads_own(tmp_path, index):
    """What another download (another host) holds under the names every download shared
    (``.NAME.part``, ``.sha256.json.new``) is never used nor in the way."""
    for taken in (f".{ANY}.part", ".sha256.json.new", ".files.json.new"):
        (tmp_path / taken).mkdir()
    index.project("torchao", {ANY: SHA[ANY]})
    index.wheel(ANY, BODY[ANY])
    assert list(python_wheels.offline_wheels(lock(index.simple, SHA[ANY]), "aarch64", "3.11", tmp_path)) == [ANY]
    assert json.loads((tmp_path / "sha256.json").read_text()) == {ANY: SHA[ANY]}
