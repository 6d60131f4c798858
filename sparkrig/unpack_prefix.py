"""Root's unpacker of a prefix build's archive (sparkrig/prefix.py): check every member, then unpack.

    python3 -I unpack_prefix.py ARCHIVE SHA256 DEST LABEL

The archive was made by the build's unprivileged owner, so nothing in it is trusted: the
sha256 must match; every member must be a regular file, a directory or a symlink whose
target, resolved through the archive's own links, stays inside the prefix; no absolute
name, no ``..``, no member below a symlink, no name twice, no setuid or setgid bit; at most
MAX_MEMBERS members and MAX_BYTES bytes unpacked (the members' declared sizes, summed). Any
other archive is refused whole before anything is written. DEST must not exist:
it is made (0755) and filled with root-owned files (0755 where the member was executable,
else 0644), opened with O_EXCL|O_NOFOLLOW, so nothing is written outside it.
Standard library only: it runs with the host's python3 (3.9 or later).
"""

import hashlib
import os
import posixpath
import stat
import sys
import tarfile

MAX_LINKS = 40
# A prefix build's product is a library tree (NCCL's: about 100 members, 0.5 GB): these
# stop an archive that would fill the disk or the inode table as root (a few hundred
# compressed bytes can declare gigabytes of zeros) before a byte is written.
MAX_MEMBERS = 200_000
MAX_BYTES = 32 << 30


class Refused(Exception):
    pass


def _name(member):
    """The member's path inside the prefix ('' for the prefix itself)."""
    name = member.name
    if not name or "\0" in name:
        raise Refused(f"member {name!r} has no usable name")
    if name.startswith("/"):
        raise Refused(f"member {name!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused(f"member {name!r} climbs out with '..'")
    return "/".join(parts)


def _resolve(path, links):
    """Where ``path`` (inside the prefix) leads through the archive's own links, as a
    list of components; Refused when it leaves the prefix or loops."""
    todo = path.split("/") if path else []
    done = []
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not done:
                raise Refused("leaves the prefix")
            done.pop()
            continue
        here = "/".join(done + [part])
        if here in links:
            hops += 1
            if hops > MAX_LINKS:
                raise Refused("loops")
            target = links[here]
            if target.startswith("/"):
                raise Refused(f"points to the absolute path {target!r}")
            todo = target.split("/") + todo
            continue
        done.append(part)
    return done


def check(members, max_members=MAX_MEMBERS, max_bytes=MAX_BYTES):
    """The members to unpack, in order, as (path, member); Refused for the first bad one.
    Linear in the members (each name's directories are looked up, never every member)."""
    seen, links, found = set(), {}, []
    below = {}  # each directory some member lies in: the first such member
    total = 0
    for count, member in enumerate(members, start=1):
        if count > max_members:
            raise Refused(f"it holds more than {max_members} members")
        path = _name(member)
        if path in seen:
            raise Refused(f"member {member.name!r} appears twice")
        seen.add(path)
        if member.islnk():
            raise Refused(f"member {member.name!r} is a hard link")
        if not (member.isreg() or member.isdir() or member.issym()):
            raise Refused(
                f"member {member.name!r} is not a regular file, directory or symlink (a device, fifo or the like)"
            )
        if member.mode & (stat.S_ISUID | stat.S_ISGID):
            raise Refused(f"member {member.name!r} has a setuid or setgid bit (mode {member.mode:o})")
        if member.isreg():
            total += member.size
            if total > max_bytes:
                raise Refused(f"its members would unpack to more than {max_bytes} bytes")
        parent = path.split("/")[:-1]
        for i in range(1, len(parent) + 1):
            directory = "/".join(parent[:i])
            if directory in links:
                raise Refused(f"member {member.name!r} lies below the symlink {directory!r}")
            below.setdefault(directory, path)
        if member.issym():
            if not path:
                raise Refused("the prefix itself is a symlink")
            links[path] = member.linkname
        if path:
            found.append((path, member))
    for path, target in links.items():
        if path in below:
            raise Refused(f"member {below[path]!r} lies below the symlink {path!r}")
        try:
            if target.startswith("/"):
                raise Refused(f"points to the absolute path {target!r}")
            _resolve(posixpath.join(posixpath.dirname(path), target), links)
        except Refused as error:
            raise Refused(f"symlink {path!r} -> {target!r} {error}: it must stay inside the prefix") from None
    return found


def unpack(archive, sha256, dest):
    digest = hashlib.sha256()
    with open(archive, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != sha256:
        raise Refused(f"its sha256 is {digest.hexdigest()}, expected {sha256}")
    with tarfile.open(archive, "r:gz") as tar:
        try:
            found = check(tar)  # read member by member: the count stops a huge table early
        except (tarfile.TarError, EOFError, OSError) as error:
            raise Refused(f"it is no readable tar.gz ({error})") from None
        os.mkdir(dest, 0o755)
        counts = {"files": 0, "directories": 0, "symlinks": 0}
        for path, member in found:
            target = os.path.join(dest, path)
            os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
            if member.isdir():
                os.makedirs(target, 0o755, exist_ok=True)
                os.chmod(target, 0o755, follow_symlinks=False)
                counts["directories"] += 1
            elif member.issym():
                os.symlink(member.linkname, target)
                counts["symlinks"] += 1
            else:
                mode = 0o755 if member.mode & 0o111 else 0o644
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
                with os.fdopen(fd, "wb") as out, tar.extractfile(member) as source:
                    for block in iter(lambda: source.read(1 << 20), b""):
                        out.write(block)
                    os.fchmod(out.fileno(), mode)
                counts["files"] += 1
        os.chmod(dest, 0o755)
    return counts


def main(argv):
    archive, sha256, dest, label = argv[1:5]
    try:
        try:
            counts = unpack(archive, sha256, dest)
        except OSError as error:
            raise Refused(f"unpacking it failed ({error})") from None
    except Refused as error:
        print(f"sparkrig: {label}: refused the archive: {error}; nothing was installed", file=sys.stderr)
        return 1
    print(
        f"sparkrig: {label}: unpacked {counts['files']} files, {counts['directories']} directories,"
        f" {counts['symlinks']} symlinks into {dest}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
